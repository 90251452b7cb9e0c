"""A CPU fake of the ``cuda.bindings.driver`` calls the cuda backend makes (:class:`FakeDriver`).

Lazy FIFO streams, events, sticky faults, a parameter-buffer ``cuLaunchKernel`` that checks the
``extra`` array and the exact parameter size, stream capture and graph replay, and numpy
versions of the built-in kernels: the cuda runtime runs the contract suite and the scheduler on
it, on any machine.
"""

from __future__ import annotations

import ctypes
import re
import struct
import threading
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import numpy as np

from aio_ascend._runtime.cuda.kernels import KERNEL_SOURCE

__all__ = ["FakeDriver", "FakeResult", "c_param_layout", "fake_compile", "parse_kernel_signatures"]

F32 = np.float32

_C_SIZES = {"float": 4, "unsigned int": 4, "int": 4, "unsigned long long": 8, "double": 8}


def parse_kernel_signatures(source: str) -> dict[str, list[str]]:
    """``extern "C" __global__ void name(params)`` -> C parameter types (whitespace folded)."""
    found: dict[str, list[str]] = {}
    pattern = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)
    for name, params in pattern.findall(source):
        types = []
        for param in params.split(","):
            param = " ".join(param.split())
            if not param:
                continue
            types.append(param.rsplit(" ", 1)[0].replace("const ", "").strip())
        found[name] = types
    return found


def c_param_layout(types: list[str]) -> tuple[list[int], int]:
    """C struct layout of kernel parameters (pointers 8 bytes)."""
    offsets, cursor = [], 0
    for ctype in types:
        size = 8 if ctype.endswith("*") else _C_SIZES[ctype]
        cursor = (cursor + size - 1) // size * size
        offsets.append(cursor)
        cursor += size
    return offsets, cursor


_FAKE_ERROR_NAMES = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    101: "CUDA_ERROR_INVALID_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    400: "CUDA_ERROR_INVALID_HANDLE",
    401: "CUDA_ERROR_ILLEGAL_STATE",
    500: "CUDA_ERROR_NOT_FOUND",
    600: "CUDA_ERROR_NOT_READY",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
    907: "CUDA_ERROR_CAPTURED_EVENT",
    908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
}
#: ``CUstreamCaptureMode``
MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED = 0, 1, 2
_FAKE_BUILTINS = b"FAKE-BUILTINS\0"
_FAKE_SOURCE = b"FAKE-SOURCE:"


class FakeResult(int):
    """Stands for ``CUresult`` (an int enum with ``.name``)."""

    @property
    def name(self) -> str:
        return _FAKE_ERROR_NAMES.get(int(self), f"CUDA_ERROR_{int(self)}")


class _Fault(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Recording:
    def __init__(self) -> None:
        self.done = False
        self.ts = 0.0


class _FakeCapture:
    """An open stream capture: the ops recorded instead of queued."""

    def __init__(self, mode: int, thread: int) -> None:
        self.mode = mode
        self.thread = thread
        self.ops: list[list[Any]] = []
        #: the error that invalidated the capture (0: valid)
        self.invalidated = 0


class _CapturedRecording:
    """What an event refers to after a record on a capturing stream (a capture dependency)."""

    def __init__(self, capture: _FakeCapture) -> None:
        self.capture = capture


class _FakeExec:
    """An executable graph: a snapshot of the captured ops, and its queued launches."""

    def __init__(self, ops: list[list[Any]]) -> None:
        self.ops = ops
        self.pending: deque[list[Any]] = deque()


class _FakeStream:
    def __init__(self, flags: int, priority: int) -> None:
        self.queue: deque[list[Any]] = deque()
        self.clock = 0.0
        self.flags = flags
        self.priority = priority
        self.capture: _FakeCapture | None = None


class _FakeEvent:
    def __init__(self, timed: bool) -> None:
        self.timed = timed
        self.current: _Recording | _CapturedRecording | None = None


class _FakeModule:
    def __init__(self, kernels: dict[str, list[str]]) -> None:
        self.kernels = kernels
        self.global_buf = (ctypes.c_uint64 * 1)()
        self.global_addr = ctypes.addressof(self.global_buf)


def fake_compile(source: str, capability: int) -> bytes:
    """Stands for NVRTC: the built-in source becomes a marker image, other source is kept."""
    if source == KERNEL_SOURCE:
        return _FAKE_BUILTINS
    return _FAKE_SOURCE + source.encode()


class FakeDriver:
    """The subset of ``cuda.bindings.driver`` the cuda runtime uses, modelled on the CPU.

    Streams are FIFO queues run lazily whenever a query observes them; ``sleep`` completes after
    its time (device time per stream), ``hang`` when the runtime's control block says release,
    ``fault`` makes the context sticky with CUDA_ERROR_LAUNCH_FAILED after writing its code
    into the control block. Device memory is host memory handed out here; kernels touching
    anything else fault with CUDA_ERROR_ILLEGAL_ADDRESS. ``cuLaunchKernel`` accepts only the
    ``extra`` parameter-buffer form with the kernel's exact parameter size, and copies the
    parameters during the call (as the driver does).

    Copies and memsets check their device ranges at the call (outside one live allocation:
    CUDA_ERROR_INVALID_VALUE, as the driver answers) and again when they execute (freed
    meanwhile: the context faults with CUDA_ERROR_ILLEGAL_ADDRESS), in stream order. The
    device has ``total_memory`` bytes: ``cuMemAlloc`` beyond it answers
    CUDA_ERROR_OUT_OF_MEMORY and ``cuMemGetInfo`` reports ``total - allocated`` as free (exact
    sizes, no allocation granularity). Streams keep the flags and the priority they were
    created with (clamped into ``priority_range`` as CUDA clamps); priorities do not change
    the order in which the fake runs streams, as CUDA promises no order either.

    Stream capture (``cuStreamBeginCapture`` .. ``cuStreamEndCapture``): a capturing stream
    records its launches, copies and memsets instead of queueing them (a launch's parameters
    are copied at the call, a copy reads and writes its addresses when a replay runs it). As
    CUDA does: an event record on a capturing stream only makes the event a capture
    dependency (querying it: CUDA_ERROR_CAPTURED_EVENT), a wait on an event recorded outside
    the capture is CUDA_ERROR_STREAM_CAPTURE_ISOLATION, a query of the capturing stream or a
    copy from or to pageable host memory is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; those
    three invalidate the capture (later ops on the stream: _INVALIDATED; ending it:
    _INVALIDATED and no graph). ``cuMemAlloc``/``cuMemFree`` are "potentially unsafe": refused
    (_UNSUPPORTED, invalidating) while another thread holds a GLOBAL capture or the calling
    thread a non-RELAXED one. Beginning a capture twice or ending one on a stream that is not
    capturing: CUDA_ERROR_ILLEGAL_STATE; a non-RELAXED capture ended by another thread:
    _WRONG_THREAD. ``cuGraphInstantiate`` snapshots the graph (flags must be 0);
    ``cuGraphLaunch`` queues one op that runs copies of the recorded ops in order, and the
    launches of one executable graph run one at a time in launch order whatever their stream,
    as CUDA runs them; an unknown or destroyed graph or executable graph is
    CUDA_ERROR_INVALID_VALUE. Not modelled (NotImplementedError): a wait that would fork
    another stream into a capture, a graph launched into a capture; destroying a capturing
    stream is refused (_UNSUPPORTED).
    """

    CUresult = FakeResult
    CUdevice_attribute = SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
    )
    CUstreamCaptureMode = SimpleNamespace(
        CU_STREAM_CAPTURE_MODE_GLOBAL=MODE_GLOBAL,
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=MODE_THREAD_LOCAL,
        CU_STREAM_CAPTURE_MODE_RELAXED=MODE_RELAXED,
    )

    def __init__(
        self,
        *,
        total_memory: int = 16 << 30,
        priority_range: tuple[int, int] = (0, -5),
        driver_version: int = 12040,
        device_name: str = "Fake CUDA Device",
        capability: tuple[int, int] = (9, 0),
    ) -> None:
        self.total_memory = total_memory
        #: (least, greatest) as ``cuCtxGetStreamPriorityRange`` answers
        self.priority_range = priority_range
        self.driver_version = driver_version
        self.device_name = device_name
        self.capability = capability
        self.sticky = 0
        self.generation = 1
        self.refcount = 0
        self.resets = 0
        self._tls = threading.local()
        self._ids = iter(range(0x5000, 1 << 40, 16))
        self.streams: dict[int, _FakeStream] = {}
        self.draining: list[_FakeStream] = []
        self.events: dict[int, _FakeEvent] = {}
        self.modules: dict[int, _FakeModule] = {}
        self.functions: dict[int, tuple[_FakeModule, str]] = {}
        self.device: dict[int, tuple[Any, int]] = {}
        self.host: dict[int, tuple[Any, int]] = {}
        self.launches: list[dict[str, Any]] = []
        self.memsets: list[dict[str, Any]] = []
        self.graphs: dict[int, list[list[Any]]] = {}
        self.execs: dict[int, _FakeExec] = {}
        self.lock = threading.RLock()

    # --- helpers ------------------------------------------------------------------------

    @property
    def ctx(self) -> int:
        return 0xC0000 + self.generation

    def _id(self) -> int:
        return next(self._ids)

    def _need(self) -> int:
        """0, or the error a call gets: no current context, or the sticky fault."""
        if getattr(self._tls, "ctx", None) != self.ctx or not self.refcount:
            return 201
        return self.sticky

    @staticmethod
    def _alloc(table: dict[int, tuple[Any, int]], size: int, align: int) -> int:
        raw = (ctypes.c_ubyte * (size + align))()
        addr = (ctypes.addressof(raw) + align - 1) // align * align
        table[addr] = (raw, size)
        return addr

    @property
    def allocated(self) -> int:
        """Bytes of device memory allocated (``cuMemAlloc`` sizes)."""
        return sum(size for _, size in self.device.values())

    def in_device(self, addr: int, nbytes: int) -> bool:
        for start, (_, size) in self.device.items():
            if start <= addr and addr + nbytes <= start + size:
                return True
        return False

    def _dev_array(self, addr: int, count: int) -> Any:
        if count == 0:
            return np.zeros(0, F32)
        if not self.in_device(addr, 4 * count):
            raise _Fault(700)
        return np.ctypeslib.as_array((ctypes.c_float * count).from_address(addr))

    def _dev_read(self, addr: int, nbytes: int) -> bytes:
        if not self.in_device(addr, nbytes):
            raise _Fault(700)
        return ctypes.string_at(addr, nbytes)

    # --- progress -----------------------------------------------------------------------

    def progress(self) -> None:
        with self.lock:
            moved = True
            while moved and not self.sticky:
                moved = False
                for s in [*self.streams.values(), *self.draining]:
                    while s.queue and not self.sticky:
                        if not self._run(s, s.queue[0]):
                            break
                        s.queue.popleft()
                        moved = True
            self.draining = [s for s in self.draining if s.queue]

    def _enqueue(self, s: _FakeStream, op: list[Any]) -> None:
        if not s.queue:
            s.clock = max(s.clock, time.monotonic())
        s.queue.append(op)

    def _submit(self, s: _FakeStream, op: list[Any]) -> int:
        """Queue ``op``, or record it if the stream is capturing; the call's error code."""
        capture = s.capture
        if capture is None:
            self._enqueue(s, op)
            return 0
        if capture.invalidated:
            return 901  # CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        capture.ops.append(op)
        return 0

    @staticmethod
    def _invalidate(capture: _FakeCapture, code: int) -> int:
        """An illegal call during a capture: it fails with ``code``; the capture is broken."""
        capture.invalidated = capture.invalidated or code
        return code

    def _unsafe_call(self) -> int:
        """0, or CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED for a "potentially unsafe" call (as
        ``cuMemAlloc``) while a capture forbids it: another thread's GLOBAL capture, or a
        non-RELAXED capture of the calling thread (the thread's own mode is the default)."""
        me = threading.get_ident()
        code = 0
        for s in self.streams.values():
            c = s.capture
            if c is None:
                continue
            if (c.thread == me and c.mode != MODE_RELAXED) or (
                c.thread != me and c.mode == MODE_GLOBAL
            ):
                code = self._invalidate(c, 900)
        return code

    def _pinned(self, addr: int, nbytes: int) -> bool:
        return any(
            start <= addr and addr + nbytes <= start + size
            for start, (_, size) in self.host.items()
        )

    def _run_graph(self, s: _FakeStream, op: list[Any]) -> bool:
        _, graph_exec, ops, _ = op
        if graph_exec.pending[0] is not op:
            return False  # the launches of one executable graph run one at a time, in order
        while op[3] < len(ops):
            if not self._run(s, ops[op[3]]):
                return False
            op[3] += 1
            if self.sticky:
                break
        graph_exec.pending.popleft()
        return True

    def _run(self, s: _FakeStream, op: list[Any]) -> bool:
        kind = op[0]
        if kind == "graph":
            return self._run_graph(s, op)
        if kind == "record":
            op[1].done = True
            op[1].ts = s.clock
            return True
        if kind == "wait":
            return bool(op[1].done)
        if kind == "copy":
            _, dst, src, count, device_side = op
            if any(not self.in_device(addr, count) for addr in device_side):
                self.sticky = 700  # freed before the copy ran
                return True
            ctypes.memmove(dst, src, count)
            return True
        if kind == "memset":
            _, dst, value, count = op
            if count and not self.in_device(dst, count):
                self.sticky = 700  # freed before the memset ran
                return True
            ctypes.memset(dst, value, count)
            return True
        module, name, params = op[1], op[2], op[3]
        try:
            return self._kernel(s, op, module, name, params)
        except _Fault as fault:
            self.sticky = fault.code
            return True

    def _kernel(
        self, s: _FakeStream, op: list[Any], module: _FakeModule, name: str, params: bytes
    ) -> bool:
        if name == "vector_add":
            x, y, z, n = struct.unpack("<QQQI", params)
            np.add(self._dev_array(x, n), self._dev_array(y, n), out=self._dev_array(z, n))
        elif name == "axpy":
            x, y, a, n = struct.unpack("<QQfI", params)
            yv = self._dev_array(y, n)
            yv[:] = F32(a) * self._dev_array(x, n) + yv
        elif name == "scale":
            x, y, tiling = struct.unpack("<QQQ", params)
            n, factor = struct.unpack("<If", self._dev_read(tiling, 8))
            np.multiply(self._dev_array(x, n), F32(factor), out=self._dev_array(y, n))
        elif name == "matmul":
            a, b, c, tiling = struct.unpack("<QQQQ", params)
            m, n, k = struct.unpack("<III", self._dev_read(tiling, 12))
            av = self._dev_array(a, m * k).reshape(m, k)
            bv = self._dev_array(b, k * n).reshape(k, n)
            np.matmul(av, bv, out=self._dev_array(c, m * n).reshape(m, n))
        elif name == "sleep":
            (microseconds,) = struct.unpack("<I", params)
            if len(op) == 4:
                op.append(s.clock + microseconds / 1e6)
            if time.monotonic() < op[4]:
                return False
            s.clock = op[4]
        elif name == "fault":
            (code,) = struct.unpack("<I", params)
            control = module.global_buf[0]
            if control:
                ctypes.c_uint32.from_address(control).value = code or 507015
            raise _Fault(719)
        elif name == "hang":
            control = module.global_buf[0]
            if not control or not ctypes.c_uint32.from_address(control + 4).value:
                return False
            s.clock = time.monotonic()
        return True

    # --- init, contexts -----------------------------------------------------------------

    def cuInit(self, flags: int) -> tuple[int]:
        return (0,)

    def cuDeviceGetCount(self) -> tuple[int, int]:
        return 0, 1

    def cuDeviceGet(self, ordinal: int) -> tuple[int, int]:
        return (0, ordinal) if ordinal == 0 else (101, 0)

    def cuDeviceGetAttribute(self, attr: int, dev: int) -> tuple[int, int | None]:
        if dev != 0:
            return 101, None  # CUDA_ERROR_INVALID_DEVICE
        if attr == self.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
            return 0, self.capability[0]
        if attr == self.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
            return 0, self.capability[1]
        return 1, None  # an attribute the fake does not model

    def cuDeviceGetName(self, length: int, dev: int) -> tuple[int, bytes | None]:
        """As cuda-bindings answers: ``length`` bytes, the name NUL-terminated (cut to
        ``length - 1`` characters) and the rest of the buffer blank."""
        if dev != 0:
            return 101, None
        if length <= 0:
            return 1, None
        name = self.device_name.encode("ascii")[: length - 1] + b"\0"
        return 0, name + b" " * (length - len(name))

    def cuDriverGetVersion(self) -> tuple[int, int]:
        return 0, self.driver_version  # 1000 * major + 10 * minor; needs no context

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple[int, int]:
        self.refcount += 1
        return 0, self.ctx

    def _destroy_context(self) -> None:
        self.generation += 1
        self.sticky = 0
        self.streams.clear()
        self.draining.clear()
        self.events.clear()
        self.modules.clear()
        self.functions.clear()
        self.device.clear()
        self.graphs.clear()
        self.execs.clear()

    def cuDevicePrimaryCtxRelease(self, dev: int) -> tuple[int]:
        self.refcount -= 1
        if self.refcount == 0:
            self._destroy_context()
        return (0,)

    def cuDevicePrimaryCtxReset(self, dev: int) -> tuple[int]:
        self.resets += 1
        self._destroy_context()
        return (0,)

    def cuCtxSetCurrent(self, ctx: int) -> tuple[int]:
        self._tls.ctx = ctx
        return (0,)

    def cuCtxGetCurrent(self) -> tuple[int, int]:
        """The calling thread's current context (0: none)."""
        return 0, getattr(self._tls, "ctx", None) or 0

    def cuCtxPushCurrent(self, ctx: int) -> tuple[int]:
        stack = self._tls.__dict__.setdefault("stack", [])
        stack.append(getattr(self._tls, "ctx", None))
        self._tls.ctx = ctx
        return (0,)

    def cuCtxPopCurrent(self) -> tuple[int, Any]:
        popped = getattr(self._tls, "ctx", None)
        self._tls.ctx = self._tls.stack.pop()
        return 0, popped

    def cuGetErrorString(self, err: FakeResult) -> tuple[int, bytes]:
        return 0, f"fake driver: {err.name}".encode()

    # --- streams and events -----------------------------------------------------------------

    def cuCtxGetStreamPriorityRange(self) -> tuple[int, int | None, int | None]:
        if code := self._need():
            return code, None, None
        least, greatest = self.priority_range
        return 0, least, greatest

    def _new_stream(self, flags: int, priority: int) -> tuple[int, int | None]:
        if code := self._need():
            return code, None
        if flags not in (0, 1):  # CU_STREAM_DEFAULT, CU_STREAM_NON_BLOCKING
            return 1, None
        handle = self._id()
        self.streams[handle] = _FakeStream(flags, priority)
        return 0, handle

    def cuStreamCreate(self, flags: int) -> tuple[int, int | None]:
        return self._new_stream(flags, 0)

    def cuStreamCreateWithPriority(self, flags: int, priority: int) -> tuple[int, int | None]:
        """CUDA clamps a priority outside the range into it (no error)."""
        least, greatest = self.priority_range
        return self._new_stream(flags, min(max(priority, greatest), least))

    def cuStreamGetPriority(self, stream: int) -> tuple[int, int | None]:
        if code := self._need():
            return code, None
        s = self.streams.get(stream)
        if s is None:
            return 400, None
        return 0, s.priority

    def cuStreamGetFlags(self, stream: int) -> tuple[int, int | None]:
        if code := self._need():
            return code, None
        s = self.streams.get(stream)
        if s is None:
            return 400, None
        return 0, s.flags

    def cuStreamDestroy(self, stream: int) -> tuple[int]:
        if getattr(self._tls, "ctx", None) != self.ctx:
            return (201,)
        s = self.streams.get(stream)
        if s is None:
            return (400,)
        if s.capture is not None:
            return (900,)  # the backend ends a capture before destroying its stream
        del self.streams[stream]
        if s.queue:
            self.draining.append(s)
        return (self.sticky,)

    def cuStreamQuery(self, stream: int) -> tuple[int]:
        if code := self._need():
            return (code,)
        self.progress()
        s = self.streams.get(stream)
        if s is None:
            return (400,)
        if s.capture is not None:
            return (self._invalidate(s.capture, 900),)  # a capturing stream is not queried
        if self.sticky:
            return (self.sticky,)
        return (600 if s.queue else 0,)

    def cuStreamWaitEvent(self, stream: int, event: int, flags: int) -> tuple[int]:
        if code := self._need():
            return (code,)
        s, ev = self.streams.get(stream), self.events.get(event)
        if s is None or ev is None:
            return (400,)
        rec = ev.current
        if s.capture is not None:
            if s.capture.invalidated:
                return (901,)
            if rec is None or (isinstance(rec, _CapturedRecording) and rec.capture is s.capture):
                return (0,)  # nothing to wait for, or ordered already
            if isinstance(rec, _CapturedRecording):
                raise NotImplementedError("the fake does not model merging two captures")
            return (self._invalidate(s.capture, 905),)  # a dependency crossing the capture
        if isinstance(rec, _CapturedRecording):
            raise NotImplementedError("the fake does not model forking a stream into a capture")
        if rec is not None and not rec.done:
            self._enqueue(s, ["wait", rec])
        return (0,)

    def cuEventCreate(self, flags: int) -> tuple[int, int | None]:
        if code := self._need():
            return code, None
        handle = self._id()
        self.events[handle] = _FakeEvent(timed=not flags & 0x2)
        return 0, handle

    def cuEventDestroy(self, event: int) -> tuple[int]:
        if self.events.pop(event, None) is None:
            return (400,)
        return (self.sticky,)

    def cuEventRecord(self, event: int, stream: int) -> tuple[int]:
        if code := self._need():
            return (code,)
        s, ev = self.streams.get(stream), self.events.get(event)
        if s is None or ev is None:
            return (400,)
        if s.capture is not None:  # a capture dependency, not a node of the graph
            if s.capture.invalidated:
                return (901,)
            ev.current = _CapturedRecording(s.capture)
            return (0,)
        rec = _Recording()
        self._enqueue(s, ["record", rec])
        ev.current = rec
        return (0,)

    def cuEventQuery(self, event: int) -> tuple[int]:
        if code := self._need():
            return (code,)
        self.progress()
        ev = self.events.get(event)
        if ev is None:
            return (400,)
        if self.sticky:
            return (self.sticky,)
        if isinstance(ev.current, _CapturedRecording):
            return (907,)  # CUDA_ERROR_CAPTURED_EVENT
        return (0 if ev.current is None or ev.current.done else 600,)

    def cuEventElapsedTime(self, start: int, end: int) -> tuple[int, float | None]:
        if code := self._need():
            return code, None
        self.progress()
        a, b = self.events.get(start), self.events.get(end)
        if a is None or b is None or not a.timed or not b.timed:
            return 400, None
        if a.current is None or b.current is None:
            return 400, None
        if isinstance(a.current, _CapturedRecording) or isinstance(b.current, _CapturedRecording):
            return 907, None
        if not (a.current.done and b.current.done):
            return 600, None
        return 0, (b.current.ts - a.current.ts) * 1000.0

    # --- memory -----------------------------------------------------------------------------

    def cuMemAlloc(self, size: int) -> tuple[int, int | None]:
        if code := self._need():
            return code, None
        if size <= 0:
            return 1, None
        if code := self._unsafe_call():
            return code, None
        if self.allocated + size > self.total_memory:
            return 2, None  # CUDA_ERROR_OUT_OF_MEMORY
        return 0, self._alloc(self.device, size, 256)

    def cuMemGetInfo(self) -> tuple[int, int | None, int | None]:
        if code := self._need():
            return code, None, None
        return 0, self.total_memory - self.allocated, self.total_memory

    def cuMemFree(self, ptr: int) -> tuple[int]:
        if code := self._unsafe_call():
            return (code,)
        if self.device.pop(ptr, None) is None:
            return (1,)
        return (self.sticky,)

    def cuMemHostAlloc(self, size: int, flags: int) -> tuple[int, int | None]:
        if code := self._need():
            return code, None
        return 0, self._alloc(self.host, size, 4096)

    def cuMemFreeHost(self, ptr: int) -> tuple[int]:
        return (0,) if self.host.pop(ptr, None) is not None else (1,)

    def cuMemHostGetDevicePointer(self, ptr: int, flags: int) -> tuple[int, int]:
        return 0, ptr  # unified addressing

    def _copy(
        self,
        dst: int,
        src: int,
        count: int,
        stream: int,
        device_side: list[int],
        host: int | None = None,
    ) -> tuple[int]:
        if code := self._need():
            return (code,)
        s = self.streams.get(stream)
        if s is None:
            return (400,)
        if any(not self.in_device(addr, count) for addr in device_side):
            return (1,)
        if s.capture is not None and host is not None and count and not self._pinned(host, count):
            return (self._invalidate(s.capture, 900),)  # a pageable copy cannot be captured
        return (self._submit(s, ["copy", dst, src, count, device_side]),)

    def cuMemcpyHtoDAsync(self, dst: int, src: int, count: int, stream: int) -> tuple[int]:
        return self._copy(dst, src, count, stream, [dst], src)

    def cuMemcpyDtoHAsync(self, dst: int, src: int, count: int, stream: int) -> tuple[int]:
        return self._copy(dst, src, count, stream, [src], dst)

    def cuMemcpyDtoDAsync(self, dst: int, src: int, count: int, stream: int) -> tuple[int]:
        return self._copy(dst, src, count, stream, [dst, src])

    def cuMemsetD8Async(self, dst: int, uc: int, n: int, stream: int) -> tuple[int]:
        """``cuMemsetD8Async(dstDevice, uc, N, hStream)``; ``uc`` is an ``unsigned char`` to
        cuda-bindings, which raises OverflowError for other values before calling CUDA."""
        if not 0 <= uc <= 255:
            raise OverflowError(f"value {uc} does not fit an unsigned char")
        if code := self._need():
            return (code,)
        s = self.streams.get(stream)
        if s is None:
            return (400,)
        if n and not self.in_device(dst, n):
            return (1,)
        self.memsets.append({"dst": dst, "value": uc, "count": n, "stream": stream})
        return (self._submit(s, ["memset", dst, uc, n]),)

    def cuMemcpyHtoD(self, dst: int, src: int, count: int) -> tuple[int]:
        if code := self._need():
            return (code,)
        is_global = any(m.global_addr == dst for m in self.modules.values())
        if not is_global and not self.in_device(dst, count):
            return (1,)
        ctypes.memmove(dst, src, count)
        return (0,)

    # --- modules and launches -----------------------------------------------------------

    def cuModuleLoadData(self, image: bytes) -> tuple[int, int | None]:
        if code := self._need():
            return code, None
        if image == _FAKE_BUILTINS:
            kernels = parse_kernel_signatures(KERNEL_SOURCE)
        elif image.startswith(_FAKE_SOURCE):
            kernels = parse_kernel_signatures(image[len(_FAKE_SOURCE) :].decode())
        else:
            return 200, None  # CUDA_ERROR_INVALID_IMAGE
        handle = self._id()
        self.modules[handle] = _FakeModule(kernels)
        return 0, handle

    def cuModuleUnload(self, module: int) -> tuple[int]:
        if self.modules.pop(module, None) is None:
            return (400,)
        return (self.sticky,)

    def cuModuleGetFunction(self, module: int, name: bytes) -> tuple[int, int | None]:
        if code := self._need():
            return code, None
        mod = self.modules.get(module)
        if mod is None:
            return 400, None
        if name.decode() not in mod.kernels:
            return 500, None
        handle = self._id()
        self.functions[handle] = (mod, name.decode())
        return 0, handle

    def cuModuleGetGlobal(self, module: int, name: bytes) -> tuple[int, Any, Any]:
        if code := self._need():
            return code, None, None
        mod = self.modules.get(module)
        if mod is None or name != b"aio_ctl":
            return 500, None, None
        return 0, mod.global_addr, 8

    def cuFuncGetParamInfo(self, func: int, index: int) -> tuple[int, Any, Any]:
        mod, name = self.functions[func]
        types = mod.kernels[name]
        if index >= len(types):
            return 1, None, None
        offsets, _ = c_param_layout(types)
        size = 8 if types[index].endswith("*") else _C_SIZES[types[index]]
        return 0, offsets[index], size

    def param_size(self, func: int) -> int:
        mod, name = self.functions[func]
        return c_param_layout(mod.kernels[name])[1]

    def cuLaunchKernel(
        self,
        f: int,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        shared: int,
        stream: int,
        kernel_params: Any,
        extra: int,
    ) -> tuple[int]:
        if code := self._need():
            return (code,)
        if f not in self.functions or stream not in self.streams:
            return (400,)
        if not (1 <= gx < 2**31 and gy == gz == 1 and 1 <= bx <= 1024 and by == bz == 1):
            return (1,)
        if kernel_params is not None:
            return (1,)  # the runtime always uses the parameter buffer
        expected = self.param_size(f)
        entries: list[int] = []
        if extra:
            array = (ctypes.c_void_p * 5).from_address(extra)
            entries = [int(v or 0) for v in array]
            if entries[0] != 1 or entries[2] != 2 or entries[4] != 0:
                return (1,)
            size = ctypes.c_size_t.from_address(entries[3]).value
            if size != expected:
                return (1,)  # the driver wants the exact parameter size
            params = ctypes.string_at(entries[1], size)  # copied during the call
        else:
            if expected:
                return (1,)
            params = b""
        mod, name = self.functions[f]
        s = self.streams[stream]
        self.launches.append(
            {
                "name": name,
                "grid": gx,
                "block": bx,
                "params": params,
                "extra": entries,
                "captured": s.capture is not None,
            }
        )
        return (self._submit(s, ["kernel", mod, name, params]),)

    # --- stream capture and graphs ------------------------------------------------------

    def cuStreamBeginCapture(self, stream: int, mode: int) -> tuple[int]:
        if code := self._need():
            return (code,)
        s = self.streams.get(stream)
        if s is None:
            return (400,)
        if int(mode) not in (MODE_GLOBAL, MODE_THREAD_LOCAL, MODE_RELAXED):
            return (1,)
        if s.capture is not None:
            return (401,)  # CUDA_ERROR_ILLEGAL_STATE: already capturing
        s.capture = _FakeCapture(int(mode), threading.get_ident())
        return (0,)

    def cuStreamIsCapturing(self, stream: int) -> tuple[int, int | None]:
        """``CUstreamCaptureStatus``: NONE (0), ACTIVE (1) or INVALIDATED (2)."""
        if code := self._need():
            return code, None
        s = self.streams.get(stream)
        if s is None:
            return 400, None
        if s.capture is None:
            return 0, 0
        return 0, 2 if s.capture.invalidated else 1

    def cuStreamEndCapture(self, stream: int) -> tuple[int, int | None]:
        if code := self._need():
            return code, None
        s = self.streams.get(stream)
        if s is None:
            return 400, None
        capture = s.capture
        if capture is None:
            return 401, None  # CUDA_ERROR_ILLEGAL_STATE: not capturing
        if capture.mode != MODE_RELAXED and capture.thread != threading.get_ident():
            return 908, None  # CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
        s.capture = None
        if capture.invalidated:
            return 901, None  # no graph
        handle = self._id()
        self.graphs[handle] = capture.ops
        return 0, handle

    def cuGraphInstantiate(self, graph: int, flags: int) -> tuple[int, int | None]:
        if code := self._need():
            return code, None
        ops = self.graphs.get(graph)
        if ops is None or int(flags) != 0:
            return 1, None
        handle = self._id()
        self.execs[handle] = _FakeExec([list(op) for op in ops])
        return 0, handle

    def cuGraphLaunch(self, graph_exec: int, stream: int) -> tuple[int]:
        if code := self._need():
            return (code,)
        ex = self.execs.get(graph_exec)
        if ex is None:
            return (1,)
        s = self.streams.get(stream)
        if s is None:
            return (400,)
        if s.capture is not None:
            raise NotImplementedError("the fake does not model capturing a graph launch")
        op = ["graph", ex, [list(inner) for inner in ex.ops], 0]
        ex.pending.append(op)
        self._enqueue(s, op)
        return (0,)

    def cuGraphExecDestroy(self, graph_exec: int) -> tuple[int]:
        """Queued launches still run (CUDA frees an executable graph in flight when done)."""
        if self.execs.pop(graph_exec, None) is None:
            return (1,)
        return (self.sticky,)

    def cuGraphDestroy(self, graph: int) -> tuple[int]:
        if self.graphs.pop(graph, None) is None:
            return (1,)
        return (self.sticky,)
