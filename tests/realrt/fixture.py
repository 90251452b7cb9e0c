"""The real CANN runtime as a test fixture: the build of ``tests/realrt/build.sh``.

The build (the runtime's ``libacl_rt.so`` + ``libruntime.so`` + plugins from the pinned public
source, over our fake driver ``libascend_hal.so`` from ``tests/realrt/fakehal``) lives in a cache
outside the working tree. It is found through ``$AIO_ASCEND_REALRT_LIB`` (its library folder),
else as the newest complete build in ``$AIO_ASCEND_REALRT_CACHE`` (default
``~/.cache/aio_ascend/realrt``) whose driver was built from the sources in this tree. Nothing
here starts the build: without one, every user skips with :data:`NOT_BUILT`.

``FakeHal`` wraps the driver's test controls (C functions, ``aio_fakehal_*``).

Kernels: :func:`kernel_binary` writes the object of ``make_kernel_elf.py`` (the sim's built-in
kernels and one MIX kernel, whose launches the fake driver runs on the host) once per session;
every open points ``$AIO_ASCEND_ACL_BUILTINS`` at it, so that ``load_binary(None)`` (and the
scheduler's built-in kernels) load it through the real loader.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "ENV_LIB",
    "NOT_BUILT",
    "FakeHal",
    "Launch",
    "fakehal",
    "loaded_fakehals",
    "find_library_dir",
    "kernel_binary",
    "use_kernel_binary",
    "open_realrt_runtime",
    "realrt_library",
    "require_library_dir",
    "stream_id",
]

HERE = Path(__file__).resolve().parent
ENV_LIB = "AIO_ASCEND_REALRT_LIB"
ENV_CACHE = "AIO_ASCEND_REALRT_CACHE"
NOT_BUILT = (
    "the real CANN runtime fixture is not built: run `bash tests/realrt/build.sh` "
    f"(or set {ENV_LIB} to its library folder)"
)
#: the runtime's own symbols, which no libascendcl.so shim or test double exports
RUNTIME_SYMBOLS = ("rtSetSocVersion", "rtGetSocVersion")


def _fakehal_key() -> str:
    """The key build.sh gives the driver it builds from ``fakehal/`` (the same hashing)."""
    sources = sorted(
        str(p) for p in (HERE / "fakehal").iterdir() if p.suffix in (".c", ".h") and p.is_file()
    )
    digests = "".join(hashlib.sha256(Path(p).read_bytes()).hexdigest() + "\n" for p in sources)
    return hashlib.sha256(digests.encode()).hexdigest()[:16]


def find_library_dir() -> Path | None:
    """The fixture's library folder, or None when none is built for this tree's driver."""
    explicit = os.environ.get(ENV_LIB)
    if explicit:
        path = Path(explicit)
        return path if (path / "libacl_rt.so").is_file() else None
    root = Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "aio_ascend" / "realrt")
    if not root.is_dir():
        return None
    builds = [p.parent for p in root.glob(f"*/fake-{_fakehal_key()}/.complete")]
    if not builds:
        return None
    newest = max(builds, key=lambda p: (p / ".complete").stat().st_mtime)
    return newest / "lib"


def require_library_dir() -> Path:
    """:func:`find_library_dir`, or skip the test with :data:`NOT_BUILT`."""
    found = find_library_dir()
    if found is None:
        pytest.skip(NOT_BUILT)
    return found


def realrt_library() -> Path:
    """The ``libacl_rt.so`` of the fixture, its driver loaded first (skips when not built).

    Our ``libascend_hal.so`` is loaded globally before the runtime, so that the runtime's
    libraries (which need a library of that name) bind to it whatever their run paths say.
    """
    lib_dir = require_library_dir()
    fakehal(lib_dir)
    return lib_dir / "libacl_rt.so"


_kernels: list[Path] = []


def kernel_binary() -> Path:
    """The kernel object of ``make_kernel_elf.py``, written once per session (a temp folder)."""
    if not _kernels:
        from realrt.make_kernel_elf import write_kernel_elf

        home = Path(tempfile.mkdtemp(prefix="aio_ascend_realrt_kernels_"))
        atexit.register(shutil.rmtree, home, True)
        _kernels.append(write_kernel_elf(home / "kernels.o"))
    return _kernels[0]


def use_kernel_binary() -> Path:
    """Point ``$AIO_ASCEND_ACL_BUILTINS`` (``load_binary(None)``) at :func:`kernel_binary`."""
    from aio_ascend._runtime.acl.runtime import ENV_BUILTINS

    path = kernel_binary()
    os.environ[ENV_BUILTINS] = str(path)
    return path


@dataclass(frozen=True)
class Launch:
    """A kernel launch as the fake device ran it (``aio_fakehal_last_launch``)."""

    name: str
    block_dim: int
    stream_id: int
    task_id: int
    mix: bool
    pc: int
    args_addr: int
    args: bytes  # the first bytes of the args buffer the runtime built (all of it for MIX)


class FakeHal:
    """The fake driver's test controls (``tests/realrt/fakehal/fakehal.c``)."""

    def __init__(self, cdll: ctypes.CDLL) -> None:
        self._cdll = cdll
        cdll.aio_fakehal_set_delay_us.argtypes = (ctypes.c_uint,)
        cdll.aio_fakehal_hold_stream.argtypes = (ctypes.c_int, ctypes.c_int)
        cdll.aio_fakehal_fail_next.argtypes = (
            ctypes.c_int,
            ctypes.c_long,
            ctypes.c_uint32,
            ctypes.c_uint32,
        )
        cdll.aio_fakehal_sqe_count.restype = ctypes.c_uint64
        cdll.aio_fakehal_device_bytes.restype = ctypes.c_size_t
        cdll.aio_fakehal_live_sqs.restype = ctypes.c_uint
        cdll.aio_fakehal_memory_misuse.argtypes = (ctypes.POINTER(ctypes.c_uint64),)
        cdll.aio_fakehal_unread_cqes.restype = ctypes.c_uint
        cdll.aio_fakehal_unread_cqes_of.restype = ctypes.c_uint
        cdll.aio_fakehal_unread_cqes_of.argtypes = (ctypes.c_int,)
        cdll.aio_fakehal_launch_count.restype = ctypes.c_uint64
        cdll.aio_fakehal_ringbuffer.restype = ctypes.c_uint64
        cdll.aio_fakehal_ringbuffer.argtypes = (ctypes.POINTER(ctypes.c_uint32),) * 3
        cdll.aio_fakehal_last_launch.restype = ctypes.c_uint32
        cdll.aio_fakehal_last_launch.argtypes = (
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_uint64),
        )

    def set_delay_us(self, microseconds: int) -> None:
        """Every SQE takes at least this long on the device (0: none)."""
        self._cdll.aio_fakehal_set_delay_us(microseconds)

    def hold(self, stream: int, held: bool = True) -> None:
        """Hold the runtime stream ``stream`` (an ``aclrtStream``) before its next SQE (a hung
        task on it), or release it. The runtime's own queues run on."""
        self._cdll.aio_fakehal_hold_stream(stream_id(stream), 1 if held else 0)

    def fail_next(
        self, stream: int, after: int = 0, error_type: int = 1, error_code: int = 1
    ) -> None:
        """The SQE ``after`` SQEs from now of the runtime stream ``stream`` (an
        ``aclrtStream``) completes with an error CQE (STARS error bits ``error_type``)."""
        self._cdll.aio_fakehal_fail_next(stream_id(stream), after, error_type, error_code)

    def reset(self) -> None:
        """No delay, no held stream, no pending error."""
        self.set_delay_us(0)
        self._cdll.aio_fakehal_hold_stream(-1, 0)
        self._cdll.aio_fakehal_fail_next(-1, -1, 0, 0)

    def sqe_count(self) -> int:
        """SQEs the device has run."""
        return int(self._cdll.aio_fakehal_sqe_count())

    def device_bytes(self) -> int:
        """Bytes of device memory allocated now."""
        return int(self._cdll.aio_fakehal_device_bytes())

    def unread_completions(self, stream: int | None = None) -> int:
        """CQEs the driver wrote that the runtime has not read yet (of the runtime stream
        ``stream``, an ``aclrtStream``, when given)."""
        if stream is not None:
            return int(self._cdll.aio_fakehal_unread_cqes_of(stream_id(stream)))
        return int(self._cdll.aio_fakehal_unread_cqes())

    def launch_count(self) -> int:
        """Kernel launches the device has run (those of our kernel object)."""
        return int(self._cdll.aio_fakehal_launch_count())

    def last_launch(self) -> Launch:
        """The last kernel launch the device ran."""
        name = ctypes.create_string_buffer(64)
        args = ctypes.create_string_buffer(512)
        info = (ctypes.c_uint64 * 6)()
        n = self._cdll.aio_fakehal_last_launch(name, 64, args, 512, info)
        return Launch(
            name.value.decode(),
            int(info[0]),
            int(info[1]),
            int(info[2]),
            bool(info[3]),
            int(info[4]),
            int(info[5]),
            args.raw[:n],
        )

    def error_ringbuffer(self) -> tuple[int, int, int, int]:
        """The device's error ringbuffer: its length in elements (0: the runtime handed none
        over), its head (the runtime's read index) and tail (the driver's write index), and
        how many elements the driver has written in all."""
        length, head, tail = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint32()
        written = self._cdll.aio_fakehal_ringbuffer(
            ctypes.byref(length), ctypes.byref(head), ctypes.byref(tail)
        )
        return length.value, head.value, tail.value, int(written)

    def live_queues(self) -> int:
        """Submission queues allocated now."""
        return int(self._cdll.aio_fakehal_live_sqs())

    def memory_misuse(self) -> tuple[int, int]:
        """``(frees of memory the device was writing, device writes to freed memory)`` so far:
        each is a caller's lifetime bug (the driver defers such a free and faults such a
        write, where a device would corrupt whoever gets the memory next)."""
        counts = (ctypes.c_uint64 * 2)()
        self._cdll.aio_fakehal_memory_misuse(counts)
        return (int(counts[0]), int(counts[1]))

    def forgive_misuse(self) -> None:
        """:meth:`memory_misuse` back to ``(0, 0)`` (a test that misuses memory on purpose)."""
        self._cdll.aio_fakehal_forgive_misuse()


_hals: dict[Path, FakeHal] = {}


def stream_id(stream: int) -> int:
    """The runtime's id of the ``aclrtStream`` ``stream`` (what its SQE headers carry)."""
    library = ctypes.CDLL(str(realrt_library()))
    library.aclrtStreamGetId.argtypes = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32))
    out = ctypes.c_int32(-1)
    rc = library.aclrtStreamGetId(stream, ctypes.byref(out))
    if rc != 0:
        raise RuntimeError(f"aclrtStreamGetId: {rc}")
    return out.value


def loaded_fakehals() -> list[FakeHal]:
    """The fake drivers this process has loaded (none until a realrt test ran)."""
    return list(_hals.values())


def fakehal(lib_dir: Path | None = None) -> FakeHal:
    """The loaded fake driver of the fixture (loaded globally on first use)."""
    lib_dir = require_library_dir() if lib_dir is None else lib_dir
    hal = _hals.get(lib_dir)
    if hal is None:
        cdll = ctypes.CDLL(str(lib_dir / "libascend_hal.so"), mode=ctypes.RTLD_GLOBAL)
        hal = _hals[lib_dir] = FakeHal(cdll)
    return hal


def open_realrt_runtime(**options: Any) -> Any:
    """The ``acl`` backend opened on device 0 of the real runtime (skips when not built)."""
    from aio_ascend._runtime.acl.runtime import open_acl_runtime

    library = realrt_library()
    fakehal().reset()
    use_kernel_binary()
    return open_acl_runtime(0, library_path=library, **options)
