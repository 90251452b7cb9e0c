"""What the runtime suites share: the ``Runtime`` under test and ``RuntimeKit``, the one helper
that drives a runtime through the protocol (``aio_ascend._runtime.base``) the way the scheduler
does: a stream, the built-in kernels, kernel args and copy buffers, uploads and downloads.

- ``rt``: a fresh runtime of this test's backend (``device_backend``, from the module's
  ``BACKENDS``: tests/conftest.py builds the matrix), closed after the test. A module that
  opens its runtime otherwise defines an ``rt`` fixture of its own.
- ``kit``: a ``RuntimeKit`` over ``rt`` with the module's ``KIT_OPTIONS`` (none by default).
- ``make_kit(runtime, **options)``: a ``RuntimeKit`` over any other runtime a test opens.
- ``backend``: the name of this test's backend (``device_backend``), as the contract suites
  call it.

Test modules use the kit through these fixtures only (a conftest is not imported); they import
its type for annotations alone, under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from typing import Any, Literal

import numpy as np
import pytest
from backends import RUNTIME_FACTORIES, skip_without_kernels
from helpers import SYNC_MS

from aio_ascend._host.hostargs import HostArgs
from aio_ascend._launch_config import LaunchConfig
from aio_ascend._runtime import Runtime
from aio_ascend._runtime.abi import (
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_STOP_ON_FAILURE,
)
from aio_ascend._runtime.hostmem import host_view

F32 = np.float32


class RuntimeKit:
    """Small helpers over one ``Runtime``: its stream, kernels, args and copies.

    The options are where the suites really differ:

    - ``library``: what ``load_binary`` is given for the kernels (None: the backend's
      built-ins). Loaded on first use, so a test without kernels never loads a binary.
    - ``host``: where kernel args and the host side of copies live. ``"pinned"``: in
      ``malloc_host`` memory, as the scheduler makes them (uploads are synchronized before
      they return, so the data is on the device whatever the backend's copy semantics).
      ``"pageable"``: in the caller's ctypes and numpy memory, crossing as they are (what the
      acl boundary tests check byte for byte); the copies are the runtime's pageable copies,
      done when the call returns.
    - ``stop_on_failure``: the kit's streams stop at their first failure
      (``ACL_STOP_ON_FAILURE``), so a fault's own error is what later calls report.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        library: Any = None,
        host: Literal["pinned", "pageable"] = "pinned",
        stop_on_failure: bool = True,
    ) -> None:
        assert host in ("pinned", "pageable"), host
        self.rt = runtime
        self._library = library
        self._pageable = host == "pageable"
        self._stop_on_failure = stop_on_failure
        self._binary: int | None = None
        self._functions: dict[str, int] = {}
        self._keep: list[object] = []  # pageable buffers, alive as long as the kit
        self._scratch: int | None = None
        #: the placeholder table's address of the last ``launch`` (0: it had none)
        self.last_table = 0
        self.stream = self.new_stream()

    # --- kernels ------------------------------------------------------------------------------

    @property
    def binary(self) -> int:
        """The kit's kernel binary, loaded on first use."""
        if self._binary is None:
            skip_without_kernels(self.rt)
            self._binary = self.rt.load_binary(self._library)
        return self._binary

    def fn(self, name: str) -> int:
        """The function handle of kernel ``name`` (looked up once)."""
        if name not in self._functions:
            self._functions[name] = self.rt.get_function(self.binary, name)
        return self._functions[name]

    def new_stream(self) -> int:
        """A new stream of the runtime, with the kit's failure mode."""
        stream = self.rt.create_stream()
        if self._stop_on_failure:
            self.rt.set_stream_failure_mode(stream, ACL_STOP_ON_FAILURE)
        return stream

    # --- host memory ----------------------------------------------------------------------------

    def pinned(self, data: bytes) -> int:
        """``data`` in new pinned memory (``malloc_host``); its address."""
        addr = self.rt.malloc_host(max(len(data), 1))
        host_view(addr, len(data))[:] = data
        return addr

    def buffer(self, data: bytes) -> ctypes.Array[ctypes.c_char]:
        """``data`` in a new writable pageable buffer, kept alive by the kit."""
        buf = ctypes.create_string_buffer(data, len(data))
        self._keep.append(buf)
        return buf

    def host(self, data: bytes) -> int:
        """``data`` in new host memory of the kit's kind; its address."""
        if self._pageable:
            return ctypes.addressof(self.buffer(data))
        return self.pinned(data)

    @property
    def scratch(self) -> int:
        """64 bytes of device memory (allocated on first use)."""
        if self._scratch is None:
            self._scratch = self.rt.malloc(64)
        return self._scratch

    # --- launches -----------------------------------------------------------------------------

    def pack(self, args: HostArgs) -> tuple[int, int, int, int]:
        """(args addr, args size, table addr, placeholder count), in the kit's host memory."""
        image = args.to_bytes()
        table = args.placeholder_table()
        table_addr = self.host(table) if table else 0
        return self.host(image), len(image), table_addr, len(args.placeholders)

    def launch(
        self,
        name: str,
        args: HostArgs,
        stream: int | None = None,
        blocks: int = 1,
        cfg: LaunchConfig | None = None,
    ) -> int:
        """Launch kernel ``name`` from a fresh args image; returns the image's address (its
        placeholder table's is ``last_table``)."""
        addr, size, table, count = self.pack(args)
        self.last_table = table
        self.rt.launch_kernel_with_host_args(
            self.fn(name),
            blocks,
            self.stream if stream is None else stream,
            cfg,
            addr,
            size,
            table,
            count,
        )
        return addr

    def sleep_us(self, microseconds: int, stream: int | None = None) -> None:
        self.launch("sleep", HostArgs().u32(microseconds), stream)

    def hang(self, stream: int) -> None:
        self.launch("hang", HostArgs(), stream)

    # --- copies -------------------------------------------------------------------------------

    def upload(self, array: np.ndarray[Any, Any], stream: int | None = None) -> int:
        """New device memory holding ``array``; its address."""
        data = np.ascontiguousarray(array)
        ptr = self.rt.malloc(data.nbytes)
        stream = self.stream if stream is None else stream
        if self._pageable:
            src = data.ctypes.data
            self._keep.append(data)
        else:
            src = self.pinned(data.tobytes())
        self.rt.memcpy_async(ptr, data.nbytes, src, data.nbytes, ACL_MEMCPY_HOST_TO_DEVICE, stream)
        if not self._pageable:
            self.rt.synchronize_stream(stream, SYNC_MS)
        return ptr

    def read(self, ptr: int, nbytes: int, stream: int | None = None) -> bytes:
        """``nbytes`` of device memory at ``ptr``, once the stream reaches the copy."""
        stream = self.stream if stream is None else stream
        if self._pageable:
            out = (ctypes.c_char * nbytes)()
            dst = ctypes.addressof(out)
            self.rt.memcpy_async(dst, nbytes, ptr, nbytes, ACL_MEMCPY_DEVICE_TO_HOST, stream)
            return bytes(out)
        dst = self.rt.malloc_host(max(nbytes, 1))
        self.rt.memcpy_async(dst, nbytes, ptr, nbytes, ACL_MEMCPY_DEVICE_TO_HOST, stream)
        self.rt.synchronize_stream(stream, SYNC_MS)
        return bytes(host_view(dst, nbytes))

    def download(
        self, ptr: int, count: int, dtype: Any = F32, stream: int | None = None
    ) -> np.ndarray[Any, Any]:
        """``count`` items of ``dtype`` of device memory at ``ptr``."""
        nbytes = count * np.dtype(dtype).itemsize
        return np.frombuffer(self.read(ptr, nbytes, stream), dtype=dtype).copy()


@pytest.fixture
def backend(device_backend: str) -> str:
    """This test's backend name (the contract suites' word for ``device_backend``)."""
    return device_backend


@pytest.fixture
def rt(device_backend: str) -> Iterator[Runtime]:
    """A fresh runtime of this test's backend, closed after the test."""
    runtime = RUNTIME_FACTORIES[device_backend]()
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def make_kit() -> Callable[..., RuntimeKit]:
    """``make_kit(runtime, **options)``: a ``RuntimeKit`` over ``runtime``."""
    return RuntimeKit


@pytest.fixture
def kit(request: pytest.FixtureRequest, rt: Runtime) -> RuntimeKit:
    """A ``RuntimeKit`` over ``rt``, with the module's ``KIT_OPTIONS``."""
    return RuntimeKit(rt, **getattr(request.module, "KIT_OPTIONS", {}))
