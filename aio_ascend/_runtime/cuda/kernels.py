"""CUDA C source of the ``cuda`` backend's built-in kernels, compiled at run time with NVRTC.

Each kernel mirrors the sim kernel of the same name (``_runtime/sim/kernels.py``) and takes
its arguments in exactly the layout ``HostArgs`` packs and the sim decodes, so the packed host
args buffer goes to ``cuLaunchKernel`` unchanged through its parameter buffer (``extra``). A
kernel parameter list is laid out like a C struct (each parameter at its natural alignment), so
``(const float* x, const float* y, float a, unsigned int n)`` lies at offsets 0, 8, 16, 20, as
``HostArgs().ptr(x).ptr(y).f32(a).u32(n)`` packs it. A placeholder is a pointer parameter: the
runtime copies the args image to the device and writes the device address of the data into the
slot before the launch.

:data:`BUILTIN_PARAMS` states every kernel's parameter kinds; the tests check it against the
source and against ``HostArgs``, and the runtime uses its sizes as ``CU_LAUNCH_PARAM_BUFFER_SIZE``
(the driver wants the exact parameter size, without the tail padding and placeholder data that
follow in the host buffer).

Device-side control (``aio_ctl``, mapped pinned host memory set up by the runtime when it loads
the module): ``fault`` stores the ACL code it was asked for there before it traps, so the runtime
can report that code; ``hang`` spins until the runtime sets ``release`` (a force-destroyed
stream or ``close``), since CUDA cannot abort a running kernel.

Floating point: the module is compiled with ``--fmad=false`` and ``axpy`` uses explicit
round-to-nearest intrinsics, so results are bit-identical to numpy's float32 (``a*x`` rounded,
then ``+ y`` rounded), as the contract tests compare them exactly.
"""

from __future__ import annotations

from ..abi import ACL_ERROR_RT_AICORE_EXCEPTION, PARAM_KIND_SIZES, declare_params
from ..base import FunctionInfo

__all__ = [
    "BUILTIN_INFO",
    "BUILTIN_NAMES",
    "BUILTIN_PARAMS",
    "CONTROL_FAULT_OFFSET",
    "CONTROL_RELEASE_OFFSET",
    "CONTROL_SIZE",
    "CONTROL_SYMBOL",
    "DEFAULT_FAULT_CODE",
    "KERNEL_SOURCE",
    "NVRTC_OPTIONS",
    "PARAM_SIZES",
    "param_layout",
]

#: name of the ``__device__`` pointer to the control block (``cuModuleGetGlobal``)
CONTROL_SYMBOL = "aio_ctl"
#: byte offsets in the control block (``struct aio_control``) and its size
CONTROL_FAULT_OFFSET = 0
CONTROL_RELEASE_OFFSET = 4
CONTROL_SIZE = 64
#: the ACL code ``fault`` reports when asked for 0 (ACL_ERROR_RT_AICORE_EXCEPTION, as the sim)
DEFAULT_FAULT_CODE = ACL_ERROR_RT_AICORE_EXCEPTION

#: options for ``nvrtcCompileProgram`` (the architecture is added by the runtime)
NVRTC_OPTIONS: tuple[str, ...] = ("--fmad=false", "--std=c++17", "-default-device")

#: parameter kinds of each built-in kernel, in order ("ptr" includes placeholder slots)
BUILTIN_PARAMS: dict[str, tuple[str, ...]] = {
    "vector_add": ("ptr", "ptr", "ptr", "u32"),
    "axpy": ("ptr", "ptr", "f32", "u32"),
    "scale": ("ptr", "ptr", "ptr"),
    "matmul": ("ptr", "ptr", "ptr", "ptr"),
    "sleep": ("u32",),
    "fault": ("u32",),
    "hang": (),
    "noop": (),
}

#: names of the built-in kernels (the same set as the sim's)
BUILTIN_NAMES: tuple[str, ...] = tuple(BUILTIN_PARAMS)

_KIND_SIZES = PARAM_KIND_SIZES


def param_layout(kinds: tuple[str, ...]) -> tuple[list[int], int]:
    """Offsets of parameters of ``kinds`` laid out as a C struct, and the end of the last one.

    The end (not rounded up to the struct alignment) is the parameter buffer size the driver
    expects: ``("ptr", "u32")`` -> ``([0, 8], 12)``.
    """
    offsets: list[int] = []
    cursor = 0
    for kind in kinds:
        size = _KIND_SIZES[kind]
        cursor = (cursor + size - 1) // size * size
        offsets.append(cursor)
        cursor += size
    return offsets, cursor


#: ``CU_LAUNCH_PARAM_BUFFER_SIZE`` of each built-in kernel
PARAM_SIZES: dict[str, int] = {
    name: param_layout(kinds)[1] for name, kinds in BUILTIN_PARAMS.items()
}

#: what the host args of each built-in kernel must follow: its declared parameters, checked
#: before a launch (a mismatch would otherwise reach the kernel as garbage)
BUILTIN_INFO: dict[str, FunctionInfo] = {
    name: FunctionInfo(params=declare_params(f"kernel {name!r}", kinds))
    for name, kinds in BUILTIN_PARAMS.items()
}

KERNEL_SOURCE = r"""
// aio_ascend: built-in kernels of the cuda backend (see aio_ascend/_runtime/_cuda_kernels.py).
// Parameter lists follow the HostArgs layout the simulator decodes; placeholders are pointers.

struct aio_control {
    volatile unsigned int fault_code;  // written by `fault` just before it traps
    volatile unsigned int release;     // set by the host: every `hang` returns
};

// Set by the runtime after loading the module: the device address of mapped pinned memory.
__device__ aio_control* aio_ctl;

struct aio_scale_tiling {
    unsigned int n;
    float factor;
};

struct aio_matmul_tiling {
    unsigned int m;
    unsigned int n;
    unsigned int k;
};

static __device__ __forceinline__ unsigned long long aio_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ void aio_pause(unsigned int ns) {
#if __CUDA_ARCH__ >= 700
    __nanosleep(ns);
#else
    long long start = clock64();
    while (clock64() - start < (long long)ns) {
    }
#endif
}

static __device__ __forceinline__ unsigned long long aio_first_index() {
    return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}

static __device__ __forceinline__ unsigned long long aio_stride() {
    return (unsigned long long)gridDim.x * blockDim.x;
}

// z = x + y (float32), grid-stride over n
extern "C" __global__ void vector_add(const float* x, const float* y, float* z, unsigned int n) {
    for (unsigned long long i = aio_first_index(); i < n; i += aio_stride()) {
        z[i] = __fadd_rn(x[i], y[i]);
    }
}

// y = a*x + y in place; the product and the sum are each rounded (no FMA), as numpy does
extern "C" __global__ void axpy(const float* x, float* y, float a, unsigned int n) {
    for (unsigned long long i = aio_first_index(); i < n; i += aio_stride()) {
        y[i] = __fadd_rn(__fmul_rn(a, x[i]), y[i]);
    }
}

// y = factor*x (x may equal y); n and factor come through the placeholder
extern "C" __global__ void scale(const float* x, float* y, const aio_scale_tiling* tiling) {
    const unsigned int n = tiling->n;
    const float factor = tiling->factor;
    for (unsigned long long i = aio_first_index(); i < n; i += aio_stride()) {
        y[i] = __fmul_rn(x[i], factor);
    }
}

// c (m x n) = a (m x k) @ b (k x n), float32, row-major; m, n, k through the placeholder
extern "C" __global__ void matmul(const float* a, const float* b, float* c,
                                  const aio_matmul_tiling* tiling) {
    const unsigned long long m = tiling->m;
    const unsigned long long n = tiling->n;
    const unsigned long long k = tiling->k;
    for (unsigned long long idx = aio_first_index(); idx < m * n; idx += aio_stride()) {
        const unsigned long long row = idx / n;
        const unsigned long long col = idx % n;
        float acc = 0.0f;
        for (unsigned long long p = 0; p < k; ++p) {
            acc = __fadd_rn(acc, __fmul_rn(a[row * k + p], b[p * n + col]));
        }
        c[idx] = acc;
    }
}

// occupies the stream for `microseconds` (device wall clock, %globaltimer)
extern "C" __global__ void sleep(unsigned int microseconds) {
    if (threadIdx.x != 0) {
        return;
    }
    const unsigned long long deadline = aio_now_ns() + 1000ull * microseconds;
    for (;;) {
        const unsigned long long now = aio_now_ns();
        if (now >= deadline) {
            break;
        }
        const unsigned long long left = deadline - now;
        aio_pause(left > 100000ull ? 100000u : (unsigned int)left);
    }
}

// fails on the device: reports `code` (507015 if 0) through the control block, then traps
extern "C" __global__ void fault(unsigned int code) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && aio_ctl != 0) {
        aio_ctl->fault_code = code != 0u ? code : 507015u;
        __threadfence_system();
    }
    __trap();
}

// never finishes on its own: spins until the host sets aio_ctl->release
extern "C" __global__ void hang() {
    if (threadIdx.x == 0) {
        while (aio_ctl == 0 || aio_ctl->release == 0u) {
            aio_pause(20000u);
        }
    }
    __syncthreads();
}

// nothing; for overhead measurement
extern "C" __global__ void noop() {
}
"""
