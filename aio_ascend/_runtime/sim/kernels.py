"""Simulated kernels: ``KernelLibrary``, ``KernelContext`` and the built-in kernels.

A kernel is a Python function ``fn(ctx: KernelContext) -> None`` that decodes its args buffer
exactly as an Ascend C kernel would (pointers, scalars, and tiling data reached through
placeholder pointers) and works on device memory through numpy views.

>>> lib = KernelLibrary()
>>> @lib.kernel("fill")
... def fill(ctx: KernelContext) -> None:
...     out = ctx.array(ctx.ptr(0), ctx.u32(8), np.float32)
...     out[:] = ctx.f32(12)
"""

from __future__ import annotations

import struct
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import numpy.typing as npt

from .memory import DeviceFault

if TYPE_CHECKING:
    from .memory import DeviceMemory

from ..abi import ACL_ERROR_RT_AICORE_EXCEPTION, check_kernel_name, declare_params
from ..base import PLAIN_FUNCTION, FunctionInfo

__all__ = [
    "BUILTIN_KERNELS",
    "BUILTIN_LIBRARY",
    "KernelContext",
    "KernelCost",
    "KernelFunction",
    "KernelLibrary",
    "KernelSpec",
]

#: a kernel body
KernelFunction = Callable[["KernelContext"], None]
#: device time of one execution, in seconds (used when the runtime's ``time_model`` is on)
KernelCost = Callable[["KernelContext"], float]

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_F32 = struct.Struct("<f")
_AICORE_EXCEPTION = ACL_ERROR_RT_AICORE_EXCEPTION


class KernelSpec:
    """A registered kernel: its name, body, optional device-time cost, and what its host args
    must follow (``info``: its declared parameters, or nothing)."""

    __slots__ = ("cost", "fn", "info", "name")

    def __init__(
        self,
        name: str,
        fn: KernelFunction,
        cost: KernelCost | None,
        info: FunctionInfo = PLAIN_FUNCTION,
    ) -> None:
        self.name = name
        self.fn = fn
        self.cost = cost
        self.info = info

    def __repr__(self) -> str:
        return f"KernelSpec({self.name!r})"


class KernelLibrary:
    """A set of simulated kernels, loadable with ``Runtime.load_binary`` (``dev.load_module``).

    Register kernels with the :meth:`kernel` decorator::

        lib = KernelLibrary()

        @lib.kernel("double", cost=lambda ctx: 1e-6 * ctx.u32(16) / 1e3)
        def double(ctx: KernelContext) -> None:
            n = ctx.u32(16)
            x = ctx.array(ctx.ptr(0), n, np.float32)
            y = ctx.array(ctx.ptr(8), n, np.float32)
            y[:] = 2 * x

    ``cost`` (optional) returns the kernel's device time in seconds; it only matters when the
    runtime was opened with ``time_model=True``. ``params`` (optional) declares the kernel's
    parameters, in order, as the ``HostArgs`` setter names that pack them (``"ptr"``,
    ``"placeholder"``, ``"u32"``, ``"f32"`` ...) or sizes in bytes (``raw`` fields): a launch
    whose ``HostArgs`` differs in number or sizes is then refused with ``ValueError`` before it
    reaches the device, as a real kernel's declared parameters are on the ``acl`` backend.
    Without it, any ``HostArgs`` is launched, and a body that misreads it faults the device.
    A library is snapshotted when it is loaded: kernels registered later need a new
    ``load_binary``.
    """

    __slots__ = ("_kernels", "name")

    def __init__(self, name: str = "kernels") -> None:
        self.name = name
        self._kernels: dict[str, KernelSpec] = {}

    def kernel(
        self,
        name: str,
        *,
        cost: KernelCost | None = None,
        params: Sequence[str | int] | None = None,
    ) -> Callable[[KernelFunction], KernelFunction]:
        """Decorator registering ``fn(ctx) -> None`` as kernel ``name`` (``cost`` and
        ``params`` as for :meth:`add`)."""

        def register(fn: KernelFunction) -> KernelFunction:
            self.add(name, fn, cost=cost, params=params)
            return fn

        return register

    def add(
        self,
        name: str,
        fn: KernelFunction,
        *,
        cost: KernelCost | None = None,
        params: Sequence[str | int] | None = None,
    ) -> None:
        """Register ``fn`` as kernel ``name`` (the non-decorator form).

        :param cost: ``cost(ctx) -> seconds`` of device time (``time_model=True`` only)
        :param params: the kernel's parameters in order, each a ``HostArgs`` setter name
            (``"ptr"``, ``"placeholder"``, ``"u32"``, ``"f32"``, ...) or a size in bytes; a
            launch with other arguments is refused with ``ValueError`` before the device
            runs it. ``None`` (the default) declares nothing: any ``HostArgs`` is launched.
        :raises TypeError: a name that is not a str, a bad body, cost or declaration
        :raises ValueError: a name already registered or not a kernel name (empty, with a NUL,
            not UTF-8), an unknown kind, a size below 1
        """
        check_kernel_name(name)
        if not callable(fn):
            raise TypeError(f"kernel {name!r}: fn must be callable, got {type(fn).__name__}")
        if cost is not None and not callable(cost):
            raise TypeError(f"kernel {name!r}: cost must be callable or None")
        info = PLAIN_FUNCTION
        if params is not None:
            info = FunctionInfo(params=declare_params(f"kernel {name!r}", params))
        if name in self._kernels:
            raise ValueError(f"kernel {name!r} is already registered in library {self.name!r}")
        self._kernels[name] = KernelSpec(name, fn, cost, info)

    def snapshot(self) -> dict[str, KernelSpec]:
        """The kernels registered so far (what ``load_binary`` captures)."""
        return dict(self._kernels)

    def __contains__(self, name: object) -> bool:
        return name in self._kernels

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._kernels))

    def __len__(self) -> int:
        return len(self._kernels)

    def __repr__(self) -> str:
        return f"KernelLibrary({self.name!r}, kernels={sorted(self._kernels)})"


class KernelContext:
    """What a kernel sees while it runs on the simulated device.

    Valid only during the kernel call; do not keep it.

    :ivar blocks: ``numBlocks`` of the launch
    :ivar args: the device copy of the args buffer (placeholder slots patched), as ``bytes``
    :ivar args_addr: device address of the args region (0 when the launch had no placeholders)
    :ivar name: the kernel's name
    """

    __slots__ = (
        "_memory",
        "args",
        "args_addr",
        "blocks",
        "busy_seconds",
        "is_hung",
        "name",
        "raised_fault",
    )

    def __init__(
        self, memory: DeviceMemory, name: str, blocks: int, args: bytes, args_addr: int
    ) -> None:
        self._memory = memory
        self.name = name
        self.blocks = blocks
        self.args = args
        self.args_addr = args_addr
        #: device time charged so far with :meth:`busy` (read by the executor afterwards)
        self.busy_seconds = 0.0
        #: whether the body called :meth:`hang`
        self.is_hung = False
        #: the first fault the body raised (:meth:`fault`, a bad access), if any
        self.raised_fault: DeviceFault | None = None

    # --- decoding the args buffer ----------------------------------------------------------

    def ptr(self, offset: int) -> int:
        """The 64-bit device pointer at ``offset`` of the args."""
        value: int = _U64.unpack_from(self.args, offset)[0]
        return value

    def u32(self, offset: int) -> int:
        """The uint32 at ``offset`` of the args."""
        value: int = _U32.unpack_from(self.args, offset)[0]
        return value

    def f32(self, offset: int) -> float:
        """The float32 at ``offset`` of the args."""
        value: float = _F32.unpack_from(self.args, offset)[0]
        return value

    def unpack(self, fmt: str, offset: int = 0) -> tuple[Any, ...]:
        """``struct.unpack_from(fmt, args, offset)`` (use ``<`` formats: the device is LE)."""
        return struct.unpack_from(fmt, self.args, offset)

    # --- device memory ---------------------------------------------------------------------

    def array(self, addr: int, count: int, dtype: npt.DTypeLike) -> npt.NDArray[Any]:
        """A writable view of ``count`` elements of ``dtype`` at device address ``addr``.

        An access outside a live allocation is a device fault (MMU fault, 507015).
        """
        dt = np.dtype(dtype)
        nbytes = int(count) * dt.itemsize
        try:
            data, offset = self._memory.resolve(addr, nbytes, f"kernel {self.name!r} access")
        except DeviceFault as fault:
            self.raised_fault = self.raised_fault or fault
            raise
        return data[offset : offset + nbytes].view(dt)

    def read(self, addr: int, nbytes: int) -> bytes:
        """A copy of ``nbytes`` bytes of device memory at ``addr`` (a fault if out of bounds)."""
        return self.array(addr, nbytes, np.uint8).tobytes()

    # --- control ---------------------------------------------------------------------------

    def fault(self, code: int = _AICORE_EXCEPTION, message: str = "") -> NoReturn:
        """Fail on the device with ACL error ``code`` (halts the device; sticky until close)."""
        fault = DeviceFault(
            int(code) or _AICORE_EXCEPTION, message or f"kernel {self.name!r} faulted"
        )
        self.raised_fault = self.raised_fault or fault
        raise fault

    def busy(self, seconds: float) -> None:
        """Occupy the stream for ``seconds`` more of device time after the body returns.

        Other streams keep running meanwhile; later work on this stream waits.
        """
        if seconds > 0:
            self.busy_seconds += float(seconds)

    def hang(self) -> None:
        """Never finish: the stream stays occupied until it is force-destroyed or closed."""
        self.is_hung = True


def describe_exception(name: str, exc: BaseException) -> str:
    """The fault message for a kernel body that raised: the error and a short traceback."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = "; ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}" for f in frames)
    return f"kernel {name!r} raised {type(exc).__name__}: {exc} (at {where})"


# --- built-in kernels ------------------------------------------------------------------------

#: device-time model constants (used only with ``time_model=True``)
KERNEL_BASE_COST_S = 2e-6
DEVICE_BANDWIDTH_BPS = 800e9
DEVICE_FLOPS = 100e12

#: most per-block numpy calls one built-in kernel makes (larger block counts are grouped)
_MAX_SLICES = 256

BUILTIN_LIBRARY = KernelLibrary("builtin")
_f32 = np.float32


def _bandwidth_cost(bytes_per_element: int, n_offset: int) -> KernelCost:
    def cost(ctx: KernelContext) -> float:
        n = ctx.u32(n_offset)
        return KERNEL_BASE_COST_S + bytes_per_element * n / DEVICE_BANDWIDTH_BPS

    return cost


def _vector_add(ctx: KernelContext) -> None:
    x_addr, y_addr, z_addr = ctx.unpack("<QQQ", 0)
    n = ctx.u32(24)
    if n == 0:
        return
    x = ctx.array(x_addr, n, _f32)
    y = ctx.array(y_addr, n, _f32)
    z = ctx.array(z_addr, n, _f32)
    chunk = -(-n // ctx.blocks)  # elements per block, as the blocks would split the work
    slices = -(-n // chunk)
    if slices > _MAX_SLICES:  # same result; bounds the Python loop for huge block counts
        chunk *= -(-slices // _MAX_SLICES)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        np.add(x[start:end], y[start:end], out=z[start:end])


def _axpy(ctx: KernelContext) -> None:
    x_addr, y_addr = ctx.unpack("<QQ", 0)
    a = _f32(ctx.f32(16))
    n = ctx.u32(20)
    if n == 0:
        return
    x = ctx.array(x_addr, n, _f32)
    y = ctx.array(y_addr, n, _f32)
    y += a * x


def _scale(ctx: KernelContext) -> None:
    x_addr, y_addr, tiling = ctx.unpack("<QQQ", 0)
    n, factor = struct.unpack("<If", ctx.read(tiling, 8))
    if n == 0:
        return
    x = ctx.array(x_addr, n, _f32)
    y = ctx.array(y_addr, n, _f32)
    np.multiply(x, _f32(factor), out=y)


def _scale_cost(ctx: KernelContext) -> float:
    tiling = ctx.ptr(16)
    n: int = struct.unpack("<I", ctx.read(tiling, 4))[0]
    return KERNEL_BASE_COST_S + 8 * n / DEVICE_BANDWIDTH_BPS


def _matmul(ctx: KernelContext) -> None:
    a_addr, b_addr, c_addr, tiling = ctx.unpack("<QQQQ", 0)
    m, n, k = struct.unpack("<III", ctx.read(tiling, 12))
    a = ctx.array(a_addr, m * k, _f32).reshape(m, k)
    b = ctx.array(b_addr, k * n, _f32).reshape(k, n)
    c = ctx.array(c_addr, m * n, _f32).reshape(m, n)
    np.matmul(a, b, out=c)


def _matmul_cost(ctx: KernelContext) -> float:
    m, n, k = (int(v) for v in struct.unpack("<III", ctx.read(ctx.ptr(24), 12)))
    return KERNEL_BASE_COST_S + 2.0 * m * n * k / DEVICE_FLOPS


def _sleep(ctx: KernelContext) -> None:
    ctx.busy(ctx.u32(0) / 1e6)


def _fault(ctx: KernelContext) -> None:
    code = ctx.u32(0) or _AICORE_EXCEPTION
    ctx.fault(code, f"the 'fault' kernel raised ACL error {code} on purpose")


def _hang(ctx: KernelContext) -> None:
    ctx.hang()


def _noop(ctx: KernelContext) -> None:
    return None


def _base_cost(ctx: KernelContext) -> float:
    return KERNEL_BASE_COST_S


# The built-ins declare their parameters (the same kinds as the cuda backend's and the acl
# double's built-ins), so a wrong HostArgs is refused at the call instead of becoming a fault
# inside the body that halts every stream of the device.
_ptr3 = ("ptr", "ptr", "ptr")
BUILTIN_LIBRARY.add("vector_add", _vector_add, cost=_bandwidth_cost(12, 24), params=(*_ptr3, "u32"))
BUILTIN_LIBRARY.add(
    "axpy", _axpy, cost=_bandwidth_cost(12, 20), params=("ptr", "ptr", "f32", "u32")
)
BUILTIN_LIBRARY.add("scale", _scale, cost=_scale_cost, params=_ptr3)
BUILTIN_LIBRARY.add("matmul", _matmul, cost=_matmul_cost, params=(*_ptr3, "ptr"))
BUILTIN_LIBRARY.add("sleep", _sleep, params=("u32",))
BUILTIN_LIBRARY.add("fault", _fault, params=("u32",))
BUILTIN_LIBRARY.add("hang", _hang, params=())
BUILTIN_LIBRARY.add("noop", _noop, cost=_base_cost, params=())

#: names of the built-in kernels (``load_binary(None)``)
BUILTIN_KERNELS: tuple[str, ...] = tuple(BUILTIN_LIBRARY)
