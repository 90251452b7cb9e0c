"""The C test double of ``libascendcl.so`` (``tests/doubles/acl_double.c``), built on demand.

``build_double()`` compiles it once per test process with the system C compiler into a temporary
``<dir>/lib64/libascendcl.so`` (so ``<dir>`` also works as ``ASCEND_HOME_PATH``) and writes a
built-in kernel binary next to it; ``open_double_runtime()`` opens the real ``acl`` backend on
it. ``DoubleControl`` wraps the double's ``double_*`` functions: the call log (every ACL call
with its raw arguments), the last launch and stream attribute as they crossed the boundary,
fault and error injection, the device memory capacity. ``build_legacy_double()`` builds a second
copy without the functions newer CANN releases added (``-DACL_DOUBLE_LEGACY``: no stream
attributes, priority range, memset, version, memory info or SoC name).

Personas: ``build_double(persona)`` builds the double as one CANN generation
(``-DACL_PERSONA=...``), exporting exactly the symbols ``docs/cann-support.md`` §9 lists for it
(:data:`PERSONA_SYMBOLS`): ``"9.1"`` (the default: host args, parameter info), ``"8.5"`` (host
args), ``"8.3"`` (the args-handle path) and ``"8.0"`` (the device-args path: the legacy loader and
``aclrtLaunchKernel``). ``build_unusable_double()`` builds 8.0 without ``aclrtLaunchKernel``: an
install with no launch path at all, for the refusal tests.
Each persona is its own library (own state, device thread and call log).
Without a C compiler every user is skipped with the reason.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import struct
import subprocess
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from importlib.machinery import ExtensionFileLoader
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from aio_ascend._runtime.acl import batch as _batch
from aio_ascend._runtime.acl.runtime import ENV_BUILTINS, AclRuntime, open_acl_runtime
from aio_ascend._tools.bench_acl import BUILTINS_MAGIC, DOUBLE_CFLAGS, DOUBLE_KERNELS

__all__ = [
    "BUILTINS_MAGIC",
    "DEFAULT_PERSONA",
    "PERSONAS",
    "PERSONA_SYMBOLS",
    "REALRT_KERNELS_MARK",
    "USABLE_PERSONAS",
    "Call",
    "DoubleControl",
    "build_double",
    "build_legacy_double",
    "build_unusable_double",
    "control_for",
    "double_control",
    "native_extension",
    "open_double_runtime",
    "use_double_builtins",
]

SOURCE = Path(__file__).resolve().parent / "acl_double.c"
#: persona name -> its ACL_PERSONA number
PERSONAS = {"8.0": 800, "8.3": 830, "8.5": 850, "9.1": 910}
DEFAULT_PERSONA = "9.1"
#: the personas with a launch path aio_ascend implements (all of them since the device-args path)
USABLE_PERSONAS = ("8.0", "8.3", "8.5", "9.1")
#: the define of the double without any launch path (8.0 without aclrtLaunchKernel)
UNUSABLE_DEFINE = "-DACL_PERSONA=800 -DACL_DOUBLE_NO_LAUNCH_KERNEL"

_COMMON = """
aclInit aclFinalize aclGetRecentErrMsg
aclrtGetDeviceCount aclrtSetDevice aclrtResetDevice
aclrtCreateContext aclrtDestroyContext aclrtSetCurrentContext aclrtGetCurrentContext
aclrtCreateStream aclrtDestroyStream
aclrtCreateEventExWithFlag aclrtDestroyEvent aclrtRecordEvent aclrtStreamWaitEvent
aclrtEventElapsedTime
aclrtMalloc aclrtFree aclrtMallocHost aclrtFreeHost aclrtMemcpyAsync aclrtMemsetAsync
aclrtGetSocName aclrtSetExceptionInfoCallback
aclrtGetTaskIdFromExceptionInfo aclrtGetStreamIdFromExceptionInfo aclrtGetThreadIdFromExceptionInfo
aclrtGetDeviceIdFromExceptionInfo aclrtGetErrorCodeFromExceptionInfo
aclrtDestroyStreamForce aclrtSynchronizeStreamWithTimeout aclrtSetStreamFailureMode aclrtStreamQuery
aclrtQueryEventStatus aclrtSynchronizeEventWithTimeout
aclrtGetLastError aclrtPeekAtLastError
aclrtCreateBinary aclrtBinaryLoad aclrtBinaryGetFunction aclrtBinaryUnLoad aclrtLaunchKernel
aclrtSynchronizeDeviceWithTimeout
"""
_ADDED_83 = """
aclrtBinaryLoadFromFile aclrtBinaryLoadFromData
aclrtKernelArgsInit aclrtKernelArgsInitByUserMem aclrtKernelArgsAppend
aclrtKernelArgsGetHandleMemSize aclrtKernelArgsGetMemSize
aclrtKernelArgsAppendPlaceHolder
aclrtKernelArgsGetPlaceHolderBuffer aclrtKernelArgsFinalize aclrtLaunchKernelWithConfig
aclsysGetCANNVersion aclrtGetDeviceInfo aclrtStreamGetId aclrtSetStreamAttribute
aclmdlRICaptureBegin aclmdlRICaptureEnd aclmdlRIExecuteAsync aclmdlRIDestroy
aclrtGetThreadLastTaskId
"""
_ADDED_85 = """
aclrtLaunchKernelWithHostArgs aclrtLaunchKernelV2 aclrtDestroyBinary
aclrtGetHardwareSyncAddr aclrtCtxGetFloatOverflowAddr
aclrtGetVersion aclrtGetMemInfo aclrtCreateStreamWithConfig aclrtDeviceGetStreamPriorityRange
"""
_ADDED_91 = """
aclrtGetArgsFromExceptionInfo aclrtGetFuncHandleFromExceptionInfo
aclrtFunctionGetParamCount aclrtFunctionGetParamInfo aclrtLaunchKernelWithArgsArray
aclrtExceptionInfoCallbackRegister aclrtExceptionInfoCallbackUnregister
"""
#: the ACL symbols each persona exports: docs/cann-support.md §9, exactly
PERSONA_SYMBOLS: dict[str, frozenset[str]] = {
    "8.0": frozenset(_COMMON.split()),
    "8.3": frozenset((_COMMON + _ADDED_83).split()),
    "8.5": frozenset((_COMMON + _ADDED_83 + _ADDED_85).split()),
    "9.1": frozenset((_COMMON + _ADDED_83 + _ADDED_85 + _ADDED_91).split()),
}
#: how the double is compiled: the bench builds it too (aio_ascend/_tools/bench_acl.py)
CFLAGS = DOUBLE_CFLAGS


@dataclass(frozen=True)
class Built:
    home: Path  # usable as ASCEND_HOME_PATH
    library: Path  # <home>/lib64/libascendcl.so
    builtins: Path  # a kernel binary with the double's built-in kernels


_built: dict[str, Built] = {}
_build_error: str | None = None
_build_lock = threading.Lock()


def _compiler() -> str | None:
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def build_double(persona: str = DEFAULT_PERSONA) -> Built:
    """Compile the double as ``persona`` (once per process); ``pytest.skip`` without a C
    compiler."""
    number = PERSONAS[persona]
    return _build("" if persona == DEFAULT_PERSONA else f"-DACL_PERSONA={number}")


def build_legacy_double() -> Built:
    """A second copy of the double, built with ``-DACL_DOUBLE_LEGACY``: it lacks every function
    of ``ffi.OPTIONAL_PROTOTYPES``, like an older CANN release. It is another library (its own
    state, device thread and call log), used by the tests of the missing-symbol paths."""
    return _build("-DACL_DOUBLE_LEGACY")


def build_unusable_double() -> Built:
    """The 8.0 persona without ``aclrtLaunchKernel`` (``-DACL_DOUBLE_NO_LAUNCH_KERNEL``): a
    library no launch path is complete for, which the backend must refuse loudly."""
    return _build(UNUSABLE_DEFINE)


def _build(define: str) -> Built:
    global _build_error
    with _build_lock:
        built = _built.get(define)
        if built is not None:
            return built
        if _build_error is not None:
            pytest.skip(_build_error)
        compiler = _compiler()
        if compiler is None:
            _build_error = "no C compiler (cc/gcc/clang) to build the acl test double"
            pytest.skip(_build_error)
        tag = "_".join(
            part.rpartition("=")[2].lower().removeprefix("-d") for part in define.split()
        )
        prefix = f"aio_ascend_acl_double_{tag}_" if tag else "aio_ascend_acl_double_"
        home = Path(tempfile.mkdtemp(prefix=prefix))
        atexit.register(shutil.rmtree, home, True)
        library = home / "lib64" / "libascendcl.so"
        library.parent.mkdir()
        defines = define.split()
        command = [compiler, *CFLAGS, *defines, "-o", str(library), str(SOURCE)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"building the acl test double failed:\n{' '.join(command)}\n{result.stderr}"
            )
        builtins = home / "builtins.o"
        builtins.write_bytes(BUILTINS_MAGIC + b"\n" + DOUBLE_KERNELS)
        built = _built[define] = Built(home, library, builtins)
        return built


#: what names the kernel object of the real-runtime fixture (tests/realrt/fixture.py), which
#: its opens point ``$AIO_ASCEND_ACL_BUILTINS`` at: the double's built-ins replace it
REALRT_KERNELS_MARK = "aio_ascend_realrt_kernels_"


def use_double_builtins(built: Built) -> None:
    """Point ``$AIO_ASCEND_ACL_BUILTINS`` at the double's built-ins unless a test set it (the
    real-runtime fixture's kernel object, left by an earlier test, is replaced)."""
    current = os.environ.get(ENV_BUILTINS, "")
    if not current or REALRT_KERNELS_MARK in current:
        os.environ[ENV_BUILTINS] = str(built.builtins)


def open_double_runtime(device_id: int = 0, persona: str = DEFAULT_PERSONA) -> AclRuntime:
    """The real ``acl`` backend opened on the test double (the contract-suite factory)."""
    built = build_double(persona)
    use_double_builtins(built)
    return open_acl_runtime(device_id, library_path=built.library)


@dataclass(frozen=True)
class Call:
    """One logged ACL call: raw arguments as uint64 (signed values sign-extended)."""

    name: str
    args: tuple[int, ...]
    rc: int  # -1 while the call was still running

    def signed(self, index: int) -> int:
        """Argument ``index`` read back as a signed 64-bit value (int32 timeouts, ...)."""
        value = self.args[index]
        return value - 2**64 if value >= 2**63 else value


class DoubleControl:
    """The ``double_*`` control functions of the built library."""

    def __init__(self, library: Path) -> None:
        lib = ctypes.CDLL(str(library))
        self.lib = lib
        u64, i64, vp, sz = ctypes.c_uint64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t
        sigs: dict[str, tuple[Any, list[Any]]] = {
            "double_dev_base": (u64, []),
            "double_log_count": (u64, []),
            "double_log_entry": (
                ctypes.c_int,
                [u64, ctypes.c_char_p, sz, vp, vp, vp],
            ),
            "double_inject_error": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]),
            "double_clear_injections": (None, []),
            "double_set_fault": (ctypes.c_int, [vp, ctypes.c_int, ctypes.c_char_p]),
            "double_set_unread_faults": (None, [ctypes.c_int]),
            "double_last_launch": (ctypes.c_int, [vp]),
            "double_last_cfg": (i64, [vp, sz]),
            "double_last_placeholders": (i64, [vp, sz]),
            "double_last_args": (i64, [vp, sz, ctypes.c_int]),
            "double_last_dev_args": (u64, []),
            "double_last_load": (ctypes.c_int, [ctypes.c_char_p, sz, vp]),
            "double_set_device_count": (None, [ctypes.c_int]),
            "double_set_max_depth": (None, [sz]),
            "double_live_counts": (None, [vp]),
            "double_context_thread_refs": (ctypes.c_int64, [vp]),
            "double_freed_under_callers": (i64, []),
            "double_model_tasks": (i64, [vp, vp]),
            "double_event_generation": (u64, [vp]),
            "double_context_fault": (ctypes.c_int, [vp]),
            "double_last_stream_attr": (ctypes.c_int, [vp]),
            "double_stream_priority": (i64, [vp]),
            "double_set_mem_total": (None, [u64]),
            "double_mem_used": (u64, [ctypes.c_int]),
            "double_persona": (ctypes.c_int, []),
            "double_ffts_addr": (u64, []),
            "double_set_chip_a2a3": (None, [ctypes.c_int]),
            "double_context_overflow": (u64, [vp]),
            "double_binary_kernel_type": (ctypes.c_int, [vp, vp]),
            "double_last_load_options": (u64, [vp, sz]),
            "double_current_context": (vp, []),
        }
        for name, (restype, argtypes) in sigs.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes

    # --- call log ---------------------------------------------------------------------

    def mark(self) -> int:
        """The log position now; pass it to :meth:`calls` to see only later calls."""
        return int(self.lib.double_log_count())

    def calls(self, since: int = 0, name: str | None = None) -> list[Call]:
        """Logged calls from position ``since`` on (optionally only those of ``name``)."""
        out: list[Call] = []
        end = self.mark()
        buf = ctypes.create_string_buffer(64)
        args = (ctypes.c_uint64 * 8)()
        nargs, rc = ctypes.c_int(), ctypes.c_int()
        for index in range(since, end):
            if self.lib.double_log_entry(
                index, buf, 64, args, ctypes.byref(nargs), ctypes.byref(rc)
            ):
                continue
            call_name = buf.value.decode()
            if name is None or call_name == name:
                out.append(Call(call_name, tuple(args[: nargs.value]), rc.value))
        return out

    # --- injection --------------------------------------------------------------------

    def inject_error(self, func: str, code: int, message: str) -> None:
        """The next call of ``func`` fails with ``code`` and ``message``."""
        assert self.lib.double_inject_error(func.encode(), code, message.encode()) == 0

    def clear_injections(self) -> None:
        self.lib.double_clear_injections()

    def set_fault(self, context: int | None, code: int, message: str = "") -> int:
        """Fault ``context`` (None: every live one) as if a kernel had failed with ``code``."""
        return int(self.lib.double_set_fault(context, code, message.encode() or None))

    def set_unread_faults(self, on: bool) -> None:
        """Model the real runtime's unread faults (see ``g_unread_faults`` in the source)."""
        self.lib.double_set_unread_faults(int(on))

    def context_fault(self, context: int) -> int:
        return int(self.lib.double_context_fault(context))

    # --- the last launch --------------------------------------------------------------

    def last_launch(self) -> tuple[int, ...]:
        """Raw (func, numBlocks, stream, cfg, hostArgs, argsSize, placeHolderArray, num) (on the
        args-handle path: the handle's buffer, size and placeholder table)."""
        raw = (ctypes.c_uint64 * 8)()
        assert self.lib.double_last_launch(raw), "no launch was made"
        return tuple(raw)

    def last_launch_path(self) -> str | None:
        """``"host_args"``, ``"args_handle"`` or ``"device_args"``: how the last launch came in
        (None: none yet)."""
        raw = (ctypes.c_uint64 * 8)()
        kinds = {0: None, 1: "host_args", 2: "args_handle", 3: "device_args"}
        return kinds[int(self.lib.double_last_launch(raw))]

    def last_cfg(self) -> bytes | None:
        """The attribute array of the last launch's cfg (None when cfg was NULL)."""
        buf = ctypes.create_string_buffer(64 * 20)
        count = self.lib.double_last_cfg(buf, len(buf))
        if count < 0:
            return None
        return buf.raw[: 20 * count]

    def last_placeholders(self) -> bytes:
        buf = ctypes.create_string_buffer(256 * 8)
        count = self.lib.double_last_placeholders(buf, len(buf))
        return buf.raw[: 8 * count]

    def last_args(self, *, patched: bool) -> bytes:
        buf = ctypes.create_string_buffer(65536)
        size = self.lib.double_last_args(buf, len(buf), int(patched))
        return buf.raw[:size]

    def last_dev_args(self) -> int:
        return int(self.lib.double_last_dev_args())

    def last_load_options(self) -> list[tuple[int, int]]:
        """(type, first uint32 of the value) of each option of the last load."""
        buf = ctypes.create_string_buffer(8 * 20)
        count = int(self.lib.double_last_load_options(buf, len(buf)))
        return [struct.unpack_from("<iI", buf.raw, 20 * i) for i in range(min(count, 8))]

    def binary_kernel_type(self, binary: int) -> tuple[str, bool] | None:
        """(kernel type, lazy) the double gave a loaded binary; None if it is not loaded."""
        lazy = ctypes.c_int()
        kind = int(self.lib.double_binary_kernel_type(binary, ctypes.byref(lazy)))
        if kind < 0:
            return None
        return ("aicore", "cube", "vector", "mix")[kind], bool(lazy.value)

    # --- personas, chips, hidden arguments, contexts ---------------------------------

    def persona(self) -> int:
        return int(self.lib.double_persona())

    def ffts_addr(self) -> int:
        """The inter-core sync address the double hands out (and mix_add checks)."""
        return int(self.lib.double_ffts_addr())

    def set_chip_a2a3(self, on: bool) -> None:
        """Model an Atlas A2/A3 chip (the default) or another one (no inter-core sync address,
        AICORE as the default kernel type)."""
        self.lib.double_set_chip_a2a3(int(on))

    def context_overflow(self, context: int) -> int:
        """The overflow address of a live context (``aclrtCtxGetFloatOverflowAddr``)."""
        return int(self.lib.double_context_overflow(context))

    def current_context(self) -> int | None:
        """The calling thread's current context in the double (no checks)."""
        value = self.lib.double_current_context()
        return int(value) if value else None

    def last_load(self) -> tuple[str, bool, int]:
        """(path of the last LoadFromFile or '', options was NULL, numOpt)."""
        buf = ctypes.create_string_buffer(4096)
        num = ctypes.c_uint64()
        null = self.lib.double_last_load(buf, len(buf), ctypes.byref(num))
        return buf.value.decode(), bool(null), num.value

    # --- stream attributes ------------------------------------------------------------

    def last_stream_attr(self) -> tuple[int, bytes] | None:
        """(attribute id, the 16 value bytes) of the last ``aclrtSetStreamAttribute`` (id -2:
        the value pointer was NULL); None before the first."""
        raw = ctypes.create_string_buffer(16)
        attr = int(self.lib.double_last_stream_attr(raw))
        return None if attr == -1 else (attr, raw.raw)

    def stream_priority(self, stream: int) -> int:
        """The priority the double stored on ``stream`` (0 unless set); -1: not a live stream."""
        return int(self.lib.double_stream_priority(stream))

    # --- state ------------------------------------------------------------------------

    def dev_base(self) -> int:
        return int(self.lib.double_dev_base())

    def freed_under_callers(self) -> int:
        """Streams destroyed while a host thread was inside a blocking call on them (the
        real runtime would crash that thread; the double fails its call), in this process."""
        return int(self.lib.double_freed_under_callers())

    def context_thread_refs(self, context: int) -> int:
        """Threads that have ``context`` (a handle the double made) current, destroyed or not
        (a destroyed context some thread still holds is never deleted on the real runtime)."""
        return int(self.lib.double_context_thread_refs(context))

    def live_counts(self) -> dict[str, int]:
        out = (ctypes.c_int64 * 10)()
        self.lib.double_live_counts(out)
        keys = (
            "contexts",
            "streams",
            "events",
            "device_allocs",
            "host_allocs",
            "binaries",
            "queued_tasks",
            "device0_refs",
            "models",
            "held_contexts",
        )
        return dict(zip(keys, out, strict=True))

    def model_tasks(self, model: int) -> tuple[int, int] | None:
        """``(recorded tasks, capture mode)`` of a live aclmdlRI, ``None`` if not live."""
        mode = ctypes.c_int(-1)
        count = int(self.lib.double_model_tasks(model, ctypes.byref(mode)))
        return None if count < 0 else (count, mode.value)

    def event_generation(self, event: int) -> int:
        return int(self.lib.double_event_generation(event))

    def set_device_count(self, count: int) -> None:
        self.lib.double_set_device_count(count)

    def set_max_depth(self, depth: int) -> None:
        self.lib.double_set_max_depth(depth)

    # --- task ids, forced destruction (acl_double_faults.h) -----------------------------

    def _faults_fn(self, name: str, restype: Any, argtypes: list[Any]) -> Any:
        function = getattr(self.lib, name)
        function.restype = restype
        function.argtypes = argtypes
        return function

    def set_next_task_id(self, stream: int, task_id: int, flip: int = 0) -> None:
        """Start ``stream``'s next task id at ``(flip << 16) | task_id`` (to cross the wrap)."""
        fn = self._faults_fn(
            "double_set_next_task_id",
            ctypes.c_int,
            [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32],
        )
        assert fn(stream, task_id, flip) == 0

    def set_internal_tasks(self, every: int) -> None:
        """Precede every ``every``-th submission of a stream by a runtime-internal task (0: off)."""
        self._faults_fn("double_set_internal_tasks", None, [ctypes.c_uint32])(every)

    def set_full_refusal(self, code: int) -> None:
        """A full stream queue refuses a submission with ``code`` (0: it blocks again)."""
        self._faults_fn("double_set_full_refusal", None, [ctypes.c_int])(code)

    def set_next_stream_id(self, stream_id: int) -> None:
        """The next stream created gets ``stream_id`` (as the runtime reuses ids)."""
        self._faults_fn("double_set_next_stream_id", None, [ctypes.c_int32])(stream_id)

    def use_after_free(self) -> int:
        """Frees of device memory a running kernel still uses (counted since the build)."""
        return int(self._faults_fn("double_use_after_free", ctypes.c_uint64, [])())

    def drop_zombies(self, device: int = 0) -> None:
        """End the tasks that outlived their stream on ``device`` (a hung kernel's, after a
        test that leaked for it), as a device reset would."""
        self._faults_fn("double_drop_zombies", None, [ctypes.c_int])(device)

    def zombies(self) -> int:
        """Tasks still running after their stream was destroyed by force."""
        return int(self._faults_fn("double_zombies", ctypes.c_int64, [])())

    def set_mem_total(self, total: int | None) -> None:
        """Device memory per device (None: back to the default 32 GiB)."""
        self.lib.double_set_mem_total(total or 0)

    def mem_used(self, device: int = 0) -> int:
        """Live device memory of ``device`` in bytes (each allocation rounded up to 64)."""
        return int(self.lib.double_mem_used(device))


_controls: dict[str, DoubleControl] = {}


def double_control(persona: str = DEFAULT_PERSONA) -> DoubleControl:
    """The control handle of the double built by :func:`build_double` as ``persona``."""
    control = _controls.get(persona)
    if control is None:
        control = _controls[persona] = DoubleControl(build_double(persona).library)
    return control


def freed_under_callers() -> int:
    """Streams destroyed under a host thread inside a blocking call on them, over every
    persona of the double built in this process (see ``DoubleControl.freed_under_callers``)."""
    return sum(control.freed_under_callers() for control in _controls.values())


def end_leaked_work(paths: set[str]) -> None:
    """End the hung tasks a leaking close left running on the doubles at ``paths`` (library
    paths), as a device reset would, so that the next test starts on an idle device. The leaked
    memory stays leaked: what the library gave up on is not the next test's business."""
    for persona in PERSONAS:
        define = "" if persona == DEFAULT_PERSONA else f"-DACL_PERSONA={PERSONAS[persona]}"
        built = _built.get(define)
        if built is not None and str(built.library) in paths:
            control = double_control(persona)
            for device in range(8):  # the double's MAX_DEVICES
                control.drop_zombies(device)


def control_for(runtime: AclRuntime) -> DoubleControl:
    """The control handle of the persona ``runtime`` was opened on."""
    for persona in PERSONAS:
        built = _built.get(
            "" if persona == DEFAULT_PERSONA else f"-DACL_PERSONA={PERSONAS[persona]}"
        )
        if built is not None and str(built.library) == runtime.library_path:
            return double_control(persona)
    raise LookupError(f"{runtime!r} is not open on a persona of the double")


_native: list[ModuleType] = []


def native_extension() -> ModuleType:
    """The acl backend's native batch submit (``aio_ascend/_runtime/acl/_native.c``): the
    installed one, else compiled from the package's source now, as ``setup.py`` builds it
    (``pytest.skip`` without a C compiler or the Python headers)."""
    installed = _batch.native_module()
    if installed is not None:
        return installed
    with _build_lock:
        if _native:
            return _native[0]
        compiler = _compiler()
        include = sysconfig.get_paths()["include"]
        if compiler is None or not Path(include, "Python.h").exists():
            pytest.skip("no C compiler or Python headers to build the native batch submit")
        source = Path(_batch.__file__).with_name("_native.c")
        home = Path(tempfile.mkdtemp(prefix="aio_ascend_native_"))
        atexit.register(shutil.rmtree, home, True)
        target = home / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
        command = [compiler, "-shared", "-fPIC", "-O2", f"-I{include}", "-o", str(target)]
        result = subprocess.run(
            [*command, str(source)], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"building the native batch submit failed:\n{result.stderr}")
        name = f"{_batch.__package__}._native"
        loader = ExtensionFileLoader(name, str(target))
        spec = spec_from_file_location(name, target, loader=loader)
        assert spec is not None
        module = module_from_spec(spec)
        loader.exec_module(module)
        _native.append(module)
        return module
