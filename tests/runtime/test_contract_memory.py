"""The ``Runtime`` contract for memory, on every backend of ``backends.RUNTIME_FACTORIES``:
allocation alignment, checked frees, and what ``info()`` and ``free_memory`` tell of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from backends import ALL_BACKENDS

from aio_ascend._errors import InvalidParamError, MemoryAllocationError
from aio_ascend._runtime import Runtime

if TYPE_CHECKING:
    pass

BACKENDS = ALL_BACKENDS


def test_malloc_is_aligned_and_frees_are_checked(rt: Runtime) -> None:
    ptrs = [rt.malloc(size) for size in (1, 63, 64, 1000)]
    assert all(ptr % 64 == 0 for ptr in ptrs)
    host = rt.malloc_host(100)
    assert host % 64 == 0
    for ptr in ptrs:
        rt.free(ptr)
    with pytest.raises(InvalidParamError):
        rt.free(ptrs[0])  # double free
    with pytest.raises(InvalidParamError):
        rt.free(0x1234_5678_9AB0)  # never allocated
    with pytest.raises(InvalidParamError):
        rt.malloc(0)
    rt.free_host(host)
    with pytest.raises(InvalidParamError):
        rt.free_host(host)


def test_a_device_size_that_overflows_with_the_runtimes_padding_is_a_bad_parameter(
    rt: Runtime,
) -> None:
    # aclrtMalloc adds 64 before aligning and refuses an overflow as a parameter error, not
    # as an allocation failure (memory.cpp GetAlignedAndPaddingSize); 2**64 - 65 is merely
    # too big to allocate
    for size in (2**64 - 1, 2**64 - 64):
        with pytest.raises(InvalidParamError):
            rt.malloc(size)
    with pytest.raises(MemoryAllocationError):
        rt.malloc(2**64 - 65)


def test_info_reports_version_memory_and_priorities(rt: Runtime) -> None:
    rt.set_current_context()
    info = rt.info()
    assert isinstance(info["runtime_version"], str)
    assert info["runtime_version"]
    if info["memory_total"] is None:  # a release without aclrtGetMemInfo (acl before 8.5)
        assert info["memory_free"] is None
        assert info["stream_priority_least"] is info["stream_priority_greatest"] is None
        pytest.skip("this release cannot tell its memory")
    total, free = info["memory_total"], info["memory_free"]
    assert isinstance(total, int)
    assert isinstance(free, int)
    assert 0 < free <= total
    least, greatest = rt.stream_priority_range()
    assert (info["stream_priority_least"], info["stream_priority_greatest"]) == (least, greatest)


def test_free_memory_shrinks_with_an_allocation(rt: Runtime) -> None:
    rt.set_current_context()
    before = rt.info()["memory_free"]
    if before is None:
        pytest.skip("this release cannot tell its memory (no aclrtGetMemInfo)")
    ptr = rt.malloc(64 << 20)
    after = rt.info()["memory_free"]
    rt.free(ptr)
    assert isinstance(before, int)
    assert isinstance(after, int)
    assert after <= before - (64 << 20)
