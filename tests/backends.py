"""The one registry of runtime backends for the tests: ``RUNTIME_FACTORIES``.

Each factory returns a fresh, opened ``Runtime`` for device 0, or calls ``pytest.skip`` with a
clear reason when the backend cannot run on this machine:

- ``sim``: the embedded simulator (always);
- ``acl``: the acl backend over the C test double (``tests/doubles/acl_double.c``, built with
  the system cc) as its default persona, CANN 9.1 (host args, parameter info);
- ``acl-8.5``, ``acl-8.3``, ``acl-8.0``: the same over the double built as CANN 8.5 (host args,
  no parameter info, priorities through ``aclrtCreateStreamWithConfig``), CANN 8.3 (the
  args-handle launch path) and CANN 8.0 (the device-args path: ``aclrtLaunchKernel`` over the
  backend's staging ring);
- ``cuda-fake``: the cuda backend over the CPU fake of the driver (``tests/doubles/cuda_fake.py``);
  one fake driver per test (one "process"), so a runtime re-opened within a test finds the
  driver state the previous one left, as on a real GPU;
- ``cuda``: the cuda backend on a real NVIDIA GPU (skipped without cuda-bindings and a device);
- ``realrt``: the acl backend over the real CANN runtime built from its public source, over our
  fake driver (``tests/realrt``: marked ``realrt``, skipped until ``tests/realrt/build.sh`` has
  built it). Its kernels are the object of ``tests/realrt/make_kernel_elf.py``, loaded
  through the runtime's own loader; our fake driver runs their launches on the host.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from aio_ascend._runtime import Runtime, open_runtime

#: backends whose every call that needs the context fails after a device fault, ``malloc``
#: included (CUDA); the contract's "malloc still works after a fault" does not hold there
REFUSES_ALL_AFTER_FAULT = frozenset({"cuda-fake", "cuda"})
#: backends that need a real device (marked ``gpu``)
REAL_DEVICE = frozenset({"cuda"})
#: backends over the real CANN runtime built from source (marked ``realrt``)
REAL_RUNTIME = frozenset({"realrt"})
#: backends with the sim's test controls and strictness (late reads of pinned memory, pageable
#: copies that block, injected launch errors): the only ones a ``sim_only`` test runs on
SIM_CONTROLS = frozenset({"sim"})
#: backends without model-RI capture (CANN 8.0 exports no aclmdlRI*: graphs cannot be captured)
NO_CAPTURE = frozenset({"acl-8.0"})
#: backends whose launches carry no launch config (CANN 8.0's aclrtLaunchKernel: no kernel
#: timeout, no schedule mode)
NO_LAUNCH_CONFIG = frozenset({"acl-8.0"})
#: backends with no kernel binary yet (none: the real runtime loads the device ELF of
#: tests/realrt/make_kernel_elf.py, whose launches our fake driver runs on the host)
NO_KERNELS: frozenset[str] = frozenset()


def _open_sim() -> Runtime:
    return open_runtime("sim", 0)


def _acl_double(persona: str | None = None) -> Callable[[], Runtime]:
    def open_acl_double() -> Runtime:
        try:
            from doubles.acl_double import DEFAULT_PERSONA, open_double_runtime
        except ImportError as exc:  # pragma: no cover - the double needs numpy and ctypes only
            pytest.skip(f"the acl test double cannot be imported: {exc}")
        return open_double_runtime(persona=persona or DEFAULT_PERSONA)

    return open_acl_double


_fake_drivers: dict[str, object] = {}


def fake_driver() -> object:
    """The fake CUDA driver of the running test (a new one for each test)."""
    from doubles.cuda_fake import FakeDriver

    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    driver = _fake_drivers.get(test)
    if driver is None:
        _fake_drivers.clear()  # only the running test's driver is kept
        driver = _fake_drivers[test] = FakeDriver()
    return driver


def _open_cuda_fake() -> Runtime:
    from doubles.cuda_fake import fake_compile

    from aio_ascend._runtime.cuda.runtime import open_cuda_runtime

    return open_cuda_runtime(0, driver=fake_driver(), compiler=fake_compile)


def gpu_skip_reason() -> str | None:
    """Why the real ``cuda`` backend cannot run here (None: it can)."""
    from aio_ascend._runtime.cuda import runtime as cuda_runtime

    ok, why = cuda_runtime.probe()
    return None if ok else f"no usable CUDA GPU: {why}"


def _open_realrt() -> Runtime:
    from realrt.fixture import open_realrt_runtime

    runtime: Runtime = open_realrt_runtime()
    return runtime


#: the ``fault`` kernel of our kernel object is a vector (AIV) kernel: the real runtime fails it
#: with 507035 ACL_ERROR_RT_VECTOR_CORE_EXCEPTION (davinci_kernel_task_v100.cc:540-562,
#: error_code.cc:121), where the doubles answer 507015; and aclGetRecentErrMsg is empty after
#: it over our build (see test_a_thread_needs_set_current_context)
_AIV_FAULT = (
    "a faulting AIV kernel fails with 507035 ACL_ERROR_RT_VECTOR_CORE_EXCEPTION "
    "(davinci_kernel_task_v100.cc:540-562), not 507015, and aclGetRecentErrMsg is empty after it"
)

#: contract tests the real runtime answers differently (findings, docs/cann-support.md §13.3):
#: test name -> what the real runtime does
REALRT_DIVERGENCES = {
    "test_never_recorded_ex_event_is_complete": "CreateEventExWithFlag: 107000",
    "test_elapsed_time_needs_time_line_and_completed_events": "no 107000 for a non-time-line event",
    "test_a_thread_needs_set_current_context": "aclGetRecentErrMsg is empty in another thread",
    "test_unknown_kernel_name_is_symbol_not_found": (
        "aclrtBinaryGetFunction answers 107000 for an unknown name, not 107042 "
        "(api_impl.cc:992-996 turns every lookup failure into RT_ERROR_INVALID_VALUE)"
    ),
    "test_device_fault_is_sticky_for_every_stream": _AIV_FAULT,
    # the scheduler suites of tests/scheduler (REALRT_TOO)
    "test_device_fault_is_sticky_and_reopen_works": _AIV_FAULT,
    "test_a_forced_stream_destroy_wakes_a_thread_synchronizing_on_its_event": (
        "aclrtSynchronizeEvent on an event behind a hung kernel returns success once its "
        "stream is destroyed by force: the runtime marks the stream force-recycled "
        "(stream.cc:4636-4643) and then reclaims every task up to its tail as done "
        "(stars_engine.cc:490-498), the event's record included"
    ),
}

#: tests whose outcome on realrt depends on a race or the timing of the runtime over our
#: driver: non-strict xfails (docs/cann-support.md §13.3): test name -> why (none at present)
REALRT_UNRELIABLE: dict[str, str] = {}


#: contract cases the real runtime cannot run at all, because the call would crash the process
#: (docs/cann-support.md §13.3): test name with its parameters -> why. Deselected at
#: collection, not xfailed.
REALRT_CRASHES = {
    f"test_bad_launch_inputs_are_rejected[realrt-{case}]": (
        f"{what} handle that was never created: the runtime reads the object behind it to "
        "validate it (api_handle_guard.cc:124-132 GetValidatedObject) and the process crashes "
        "(SIGSEGV) instead of answering 107017"
    )
    for case, what in (("unknown func", "a function"), ("unknown stream", "a stream"))
}


def mark_realrt_divergence(request: pytest.FixtureRequest, backend: str) -> None:
    """A strict xfail for a test the real runtime is known to answer differently (a non-strict
    one where it races; one that would crash the process is deselected: ``deselection_reason``)."""
    reason = REALRT_DIVERGENCES.get(getattr(request.node, "originalname", ""))
    if backend in REAL_RUNTIME and reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"real runtime: {reason}"))
    unreliable = REALRT_UNRELIABLE.get(getattr(request.node, "originalname", ""))
    if backend in REAL_RUNTIME and unreliable is not None:
        request.applymarker(pytest.mark.xfail(strict=False, reason=f"real runtime: {unreliable}"))


def skip_without_kernels(runtime: Runtime) -> None:
    """Skip the running test when ``runtime``'s backend cannot load kernels yet."""
    real = str(getattr(runtime, "library_path", "")).endswith("libacl_rt.so")
    if real and REAL_RUNTIME & NO_KERNELS:
        pytest.skip("needs a kernel: the real runtime has no kernel object here")


def _open_cuda() -> Runtime:
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    return open_runtime("cuda", 0)


RUNTIME_FACTORIES: dict[str, Callable[[], Runtime]] = {
    "sim": _open_sim,
    "acl": _acl_double(),
    "acl-8.5": _acl_double("8.5"),
    "acl-8.3": _acl_double("8.3"),
    "acl-8.0": _acl_double("8.0"),
    "cuda-fake": _open_cuda_fake,
    "cuda": _open_cuda,
    "realrt": _open_realrt,
}


#: every backend of the registry (the runtime contract suites' ``BACKENDS``)
ALL_BACKENDS = tuple(sorted(RUNTIME_FACTORIES))

#: what a test can need (``@pytest.mark.needs(name)``) -> the backends that lack it
LACKING: dict[str, frozenset[str]] = {
    "sim_controls": frozenset(RUNTIME_FACTORIES) - SIM_CONTROLS,  # also: ``sim_only``
    "capture": NO_CAPTURE,
    "launch_config": NO_LAUNCH_CONFIG,
}


def deselection_reason(item: pytest.Item, backend: str) -> str | None:
    """Why ``item`` cannot run on ``backend`` at all (None: it can), decided at collection
    (tests/conftest.py deselects it): its ``sim_only`` and ``needs`` markers against the
    capability sets above, and the real runtime's crashes."""
    needed = [name for marker in item.iter_markers("needs") for name in marker.args]
    if item.get_closest_marker("sim_only") is not None:
        needed.append("sim_controls")
    for name in needed:
        if name not in LACKING:
            raise ValueError(f"{item.nodeid}: needs({name!r}): not one of {sorted(LACKING)}")
        if backend in LACKING[name]:
            return f"{backend} lacks {name}"
    if backend in REAL_RUNTIME and item.name in REALRT_CRASHES:
        return f"real runtime: {REALRT_CRASHES[item.name]}"
    return None


def backend_params(names: list[str] | None = None) -> list[object]:
    """``pytest.param`` per backend name (all of the registry by default), real devices marked
    ``gpu``: for ``@pytest.fixture(params=...)``."""
    chosen = sorted(RUNTIME_FACTORIES) if names is None else names
    marks = {
        **dict.fromkeys(REAL_DEVICE, pytest.mark.gpu),
        **dict.fromkeys(REAL_RUNTIME, pytest.mark.realrt),
    }
    return [pytest.param(name, marks=marks[name]) if name in marks else name for name in chosen]
