"""The public surface is a contract (DESIGN "Public API"): pin it, so a change is a decision."""

from __future__ import annotations

import aio_ascend as aa

EXPORTED = {
    "AscendError",
    "BackendUnavailableError",
    "ClosedError",
    "Device",
    "DeviceBuffer",
    "DeviceFaultError",
    "Event",
    "ExternalEvent",
    "Function",
    "Graph",
    "HostArgs",
    "InternalError",
    "LaunchConfig",
    "LaunchConfigDict",
    "LaunchPlan",
    "MemoryAllocationError",
    "Module",
    "RuntimeAPIError",
    "Stream",
    "Task",
    "TaskTimeoutError",
    "WrongLoopError",
    "available_backends",
    "device_count",
    "is_compiled",
    "open_device",
    "sim",
}


def test_all_is_pinned() -> None:
    assert set(aa.__all__) == EXPORTED
    assert len(aa.__all__) == len(EXPORTED)


def test_every_exported_name_resolves_and_reads_as_public() -> None:
    for name in aa.__all__:
        obj = getattr(aa, name)
        if isinstance(obj, type):
            assert obj.__module__ == "aio_ascend", (name, obj.__module__)


def test_error_tree() -> None:
    assert issubclass(aa.RuntimeAPIError, aa.AscendError)
    assert issubclass(aa.DeviceFaultError, aa.RuntimeAPIError)
    assert issubclass(aa.TaskTimeoutError, aa.AscendError)
    assert issubclass(aa.TaskTimeoutError, TimeoutError)
    assert issubclass(aa.MemoryAllocationError, aa.RuntimeAPIError)
    assert issubclass(aa.MemoryAllocationError, MemoryError)
    for name in ("BackendUnavailableError", "ClosedError", "InternalError", "WrongLoopError"):
        assert issubclass(getattr(aa, name), aa.AscendError)
    # the design's bad-input rule (ValueError) and asyncio's wrong-loop errors (RuntimeError)
    assert issubclass(aa.WrongLoopError, ValueError)
    assert issubclass(aa.WrongLoopError, RuntimeError)


def test_sim_exposes_kernel_library() -> None:
    assert {"KernelLibrary", "KernelContext", "BUILTIN_KERNELS"} <= set(aa.sim.__all__)


def test_documented_methods_exist() -> None:
    for cls, names in {
        aa.Device: (
            "malloc",
            "load_module",
            "function",
            "stream",
            "stats",
            "synchronize",
            "aclose",
            "wrap",
            "external_stream",
            "info",
        ),
        aa.Stream: (
            "launch",
            "copy_to_device",
            "copy_to_host",
            "record_event",
            "wait_event",
            "synchronize",
            "aclose",
            "run",
            "upload",
            "download",
            "copy_device",
            "memset",
        ),
        aa.Task: ("done", "exception", "wait_finished"),
        aa.Event: ("query", "elapsed_ms"),
        aa.DeviceBuffer: ("free", "freed", "base", "root", "__getitem__"),
        aa.HostArgs: ("ptr", "u32", "f32", "placeholder", "nbytes", "placeholders"),
    }.items():
        for name in names:
            assert callable(getattr(cls, name, None)) or isinstance(
                getattr(cls, name, None), property
            ), f"{cls.__name__}.{name}"


def test_the_signatures_follow_the_design() -> None:
    """The parameter names the design gives (callers pass some of them by keyword)."""
    import inspect

    def params(fn: object) -> list[str]:
        return [p for p in inspect.signature(fn).parameters if p != "self"]  # type: ignore[arg-type]

    assert params(aa.Stream.run) == ["fn", "blocks", "args", "config"]
    assert params(aa.Stream.upload) == ["dst", "src"]
    assert params(aa.Stream.download) == ["src", "dtype", "shape", "out"]
    assert params(aa.Stream.copy_device) == ["dst", "src", "nbytes", "src_stream"]
    assert params(aa.Stream.wait_stream) == ["other"]
    assert params(aa.Stream.launch_host_func) == ["fn"]
    assert params(aa.Stream.query) == []
    assert params(aa.Device.external_event) == ["event", "after"]
    assert params(aa.device_count) == ["backend", "runtime_options"]
    assert params(aa.Stream.memset) == ["dst", "value", "nbytes"]
    assert params(aa.Device.wrap) == ["ptr", "nbytes", "owner"]
    assert params(aa.Device.stream) == ["max_in_flight", "priority"]
    assert params(aa.Device.external_stream)[0] == "handle"
    assert "close_timeout" in params(aa.open_device)
    assert "pinned_pool_bytes" in params(aa.open_device)


#: the public submodules and their names (not in ``aa.__all__``: imported on first use)
SUBMODULES = {
    "tracing": {"DEFAULT_MAX_TASKS", "RequestScope", "TaskRecord", "Tracer", "record", "request"},
    "metrics": {"DEFAULT_BUCKETS", "OtelSpans", "PrometheusMetrics"},
    "testing": {
        "LOOPS",
        "SimDevices",
        "aio_ascend_threads",
        "assert_no_leaks",
        "assert_no_library_threads",
        "inject_fault",
        "inject_hang",
        "library_threads",
        "loop_params",
        "paused",
        "refuse_launches",
        "sim_device",
    },
}


def test_the_public_submodules_are_pinned_and_imported_on_first_use() -> None:
    import importlib
    import subprocess
    import sys

    for name, names in SUBMODULES.items():
        module = importlib.import_module(f"aio_ascend.{name}")
        assert set(module.__all__) == names, name
        assert getattr(aa, name) is module  # (tracing, metrics: also before the import)
        assert name not in aa.__all__
    code = (
        "import sys, aio_ascend\n"
        "print(sorted(m for m in ('aio_ascend.tracing', 'aio_ascend.metrics', "
        "'aio_ascend.testing', 'prometheus_client', 'opentelemetry') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"


def test_task_timestamps_are_documented() -> None:
    doc = aa.Task.__doc__ or ""
    for name in ("admitted_at", "submitted_at", "completed_at", "resumed_at"):
        assert f":ivar {name}:" in doc


def test_errors_survive_pickling_with_what_was_set_on_them() -> None:
    """Errors cross process boundaries (Ray, multiprocessing): their code, message, function
    and ``TaskTimeoutError.by_close`` come back."""
    import pickle

    from aio_ascend._sched.forcing import gave_up

    refused = aa.RuntimeAPIError("no such stream", code=107000, func="aclrtRecordEvent")
    back = pickle.loads(pickle.dumps(refused))
    assert type(back) is type(refused)
    assert (back.code, back.message, back.func, str(back)) == (
        107000,
        "no such stream",
        "aclrtRecordEvent",
        str(refused),
    )
    forced = pickle.loads(pickle.dumps(gave_up("launch")))
    assert isinstance(forced, aa.TaskTimeoutError) and forced.by_close
    assert not pickle.loads(pickle.dumps(aa.TaskTimeoutError("watchdog"))).by_close


def test_a_runtime_error_without_the_runtimes_text_names_its_code() -> None:
    """``aclGetRecentErrMsg`` is often empty (always over the real runtime built here): the
    error said only ``aclrtQueryEventStatus [507035]``, and errors derived from it ended in a
    dangling colon. The code's ACL name stands in; the runtime's text wins where there is one."""
    from aio_ascend._errors import derived_error, error_for_code

    fault = error_for_code(507035, "aclrtQueryEventStatus")
    assert isinstance(fault, aa.DeviceFaultError)
    assert "ACL_ERROR_RT_VECTOR_CORE_EXCEPTION" in fault.message
    assert not str(derived_error(fault, "device faulted")).endswith(": ")
    assert "does not know" in error_for_code(987654, "aclrtX").message
    assert error_for_code(507035, "aclrtX", "vector core trap").message == "vector core trap"
