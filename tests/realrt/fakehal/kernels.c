/*
 * The fake device's kernels: a host function per kernel name of tests/realrt/make_kernel_elf.py,
 * the same computations as the sim's built-ins (aio_ascend/_runtime/sim/kernels.py), run by the
 * SQ worker when a launch SQE's PC address holds that kernel's marker (fakehal.c).
 *
 * A kernel reads its arguments where the device would: at the args address of the SQE, which
 * is the buffer the runtime built (its system slots included). A plain AIV kernel's parameters
 * start at offset 0 (the runtime puts no slot in front of them:
 * src/runtime/core/src/kernel/program.cc:1105-1120 adds the inter-core sync slot only for a
 * kernel with cross-core sync or a MIX kernel); a MIX kernel's first slot is that sync address
 * (api_impl.cc KernelArgsFinalize writes it at offset 0), its parameters follow.
 *
 * Every device address a kernel touches is checked against the live allocations first: an
 * access outside them completes the SQE with an AI Core exception (STARS error bit 0) instead of
 * touching host memory. What it touches stays pinned until it ends (fh_pin): a free meanwhile is
 * counted and given back after it, never written into.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "fakehal.h"

/* STARS error bit 0: the core's exception (davinci_kernel_task_v100.cc:540-548 maps it to
 * TS_ERROR_VECTOR_CORE_EXCEPTION / TS_ERROR_AICORE_EXCEPTION) */
#define FK_EXCEPTION 1U
/* what the accelerator reports for a bad access (any non-zero status) */
#define FK_BAD_ACCESS 0x800U

/* the most device ranges one kernel touches (add_custom: 5) */
#define FK_MAX_PINS 8

struct fk_args {
    const uint8_t* p;
    size_t len;
    int bad;
    struct fh_alloc* pins[FK_MAX_PINS];
    int writes[FK_MAX_PINS];
    int npins;
};

static uint64_t fk_u64(struct fk_args* a, size_t off)
{
    uint64_t v = 0;
    if (off + 8 > a->len) {
        a->bad = 1;
        return 0;
    }
    memcpy(&v, a->p + off, 8);
    return v;
}

static uint32_t fk_u32(struct fk_args* a, size_t off)
{
    uint32_t v = 0;
    if (off + 4 > a->len) {
        a->bad = 1;
        return 0;
    }
    memcpy(&v, a->p + off, 4);
    return v;
}

static float fk_f32(struct fk_args* a, size_t off)
{
    float v = 0;
    if (off + 4 > a->len) {
        a->bad = 1;
        return 0;
    }
    memcpy(&v, a->p + off, 4);
    return v;
}

/* [addr, addr + n) of device memory, pinned until the kernel ends (for a write when `write`);
 * NULL (and a->bad) when it is not in one live allocation */
static void* fk_mem(struct fk_args* a, uint64_t addr, size_t n, int write)
{
    struct fh_alloc* pin = NULL;
    if (a->bad || addr == 0 || a->npins == FK_MAX_PINS || fh_pin((uintptr_t)addr, n, write, &pin) != FH_PINNED) {
        a->bad = 1;
        return NULL;
    }
    a->writes[a->npins] = write;
    a->pins[a->npins++] = pin;
    return (void*)(uintptr_t)addr;
}

/* a device pointer to n floats, or NULL (and a->bad) when it is not a live allocation */
static float* fk_floats(struct fk_args* a, uint64_t addr, uint64_t n, int write)
{
    if (n == 0) {
        return NULL;
    }
    if (n > (SIZE_MAX / 4)) {
        a->bad = 1;
        return NULL;
    }
    return (float*)fk_mem(a, addr, (size_t)n * 4, write);
}

static void k_vector_add(struct fk_args* a, size_t base)
{
    uint64_t x = fk_u64(a, base), y = fk_u64(a, base + 8), z = fk_u64(a, base + 16);
    uint32_t n = fk_u32(a, base + 24);
    float* xs = fk_floats(a, x, n, 0);
    float* ys = fk_floats(a, y, n, 0);
    float* zs = fk_floats(a, z, n, 1);
    if (a->bad || n == 0) {
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        zs[i] = xs[i] + ys[i];
    }
}

static void k_axpy(struct fk_args* a)
{
    uint64_t x = fk_u64(a, 0), y = fk_u64(a, 8);
    float alpha = fk_f32(a, 16);
    uint32_t n = fk_u32(a, 20);
    float* xs = fk_floats(a, x, n, 0);
    float* ys = fk_floats(a, y, n, 1);
    if (a->bad || n == 0) {
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        ys[i] += alpha * xs[i];
    }
}

static void k_scale(struct fk_args* a)
{
    uint64_t x = fk_u64(a, 0), y = fk_u64(a, 8), tiling = fk_u64(a, 16);
    const uint8_t* t = fk_mem(a, tiling, 8, 0);
    if (t == NULL) {
        return;
    }
    uint32_t n;
    float factor;
    memcpy(&n, t, 4);
    memcpy(&factor, t + 4, 4);
    float* xs = fk_floats(a, x, n, 0);
    float* ys = fk_floats(a, y, n, 1);
    if (a->bad || n == 0) {
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        ys[i] = xs[i] * factor;
    }
}

static void k_matmul(struct fk_args* a)
{
    uint64_t pa = fk_u64(a, 0), pb = fk_u64(a, 8), pc = fk_u64(a, 16), tiling = fk_u64(a, 24);
    const void* t = fk_mem(a, tiling, 12, 0);
    if (t == NULL) {
        return;
    }
    uint32_t mnk[3];
    memcpy(mnk, t, 12);
    uint64_t m = mnk[0], n = mnk[1], k = mnk[2];
    float* as = fk_floats(a, pa, m * k, 0);
    float* bs = fk_floats(a, pb, k * n, 0);
    float* cs = fk_floats(a, pc, m * n, 1);
    if (a->bad || m * n == 0) {
        return;
    }
    for (uint64_t i = 0; i < m; i++) {
        for (uint64_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (uint64_t p = 0; p < k; p++) {
                acc += as[i * k + p] * bs[p * n + j];
            }
            cs[i * n + j] = acc;
        }
    }
}

/* IEEE half <-> float, as numpy's float16 arithmetic does it (compute in float, round to
 * nearest even) */
static float fk_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000U) << 16;
    uint32_t exp = (h >> 10) & 0x1FU;
    uint32_t man = h & 0x3FFU;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while ((man & 0x400U) == 0) {
                man <<= 1;
                exp--;
            }
            man &= 0x3FFU;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1FU) {
        bits = sign | 0x7F800000U | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t fk_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000U);
    uint32_t absx = x & 0x7FFFFFFFU;
    if (absx >= 0x7F800000U) { /* inf or nan */
        return (uint16_t)(sign | 0x7C00U | ((absx > 0x7F800000U) ? 0x200U : 0U));
    }
    if (absx >= 0x477FF000U) { /* rounds past the largest half */
        return (uint16_t)(sign | 0x7C00U);
    }
    if (absx < 0x38800000U) { /* subnormal half (or zero) */
        float af;
        memcpy(&af, &absx, 4);
        float scaled = af * 16777216.0f; /* 2^24: one unit of the smallest subnormal */
        uint32_t m = (uint32_t)scaled;
        float rest = scaled - (float)m;
        if (rest > 0.5f || (rest == 0.5f && (m & 1U))) {
            m++;
        }
        return (uint16_t)(sign | m);
    }
    uint32_t exp = ((absx >> 23) - 127 + 15);
    uint32_t man = absx & 0x7FFFFFU;
    uint32_t half = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1FFFU;
    if (rest > 0x1000U || (rest == 0x1000U && (half & 1U))) {
        half++; /* may carry into the exponent, which is still right */
    }
    return (uint16_t)(sign | half);
}

/* add_custom (examples/acl_launch_kernel.py): z = x + y on `total` float16 values, when tiles */
static void k_add_custom(struct fk_args* a, int placeholder)
{
    uint64_t x = fk_u64(a, 0), y = fk_u64(a, 8), z = fk_u64(a, 16);
    int32_t total = 8 * 2048, tiles = 8; /* simple mode: the kernel's constants */
    if (placeholder) {
        uint64_t pt = fk_u64(a, 24), pn = fk_u64(a, 32);
        const void* total_at = fk_mem(a, pt, 4, 0);
        const void* tiles_at = fk_mem(a, pn, 4, 0);
        if (total_at == NULL || tiles_at == NULL) {
            return;
        }
        memcpy(&total, total_at, 4);
        memcpy(&tiles, tiles_at, 4);
    }
    if (a->bad || total <= 0 || tiles == 0) {
        return;
    }
    size_t bytes = (size_t)total * 2;
    const uint16_t* xs = fk_mem(a, x, bytes, 0);
    const uint16_t* ys = fk_mem(a, y, bytes, 0);
    uint16_t* zs = fk_mem(a, z, bytes, 1);
    if (xs == NULL || ys == NULL || zs == NULL) {
        return;
    }
    for (int32_t i = 0; i < total; i++) {
        zs[i] = fk_float_to_half(fk_half_to_float(xs[i]) + fk_half_to_float(ys[i]));
    }
}

/* LongOPf / ShortOPf (examples/acl_multi_stream.py): x[block] += 1 after a long computation
 * (FK_LONG_OP_US here), x[block] *= 2 */
#define FK_LONG_OP_US 300000U
static void k_long_short(struct fk_args* a, uint32_t block_dim, int is_long)
{
    uint64_t x = fk_u64(a, 0);
    uint32_t* xs = (block_dim != 0) ? fk_mem(a, x, (size_t)block_dim * 4, 1) : NULL;
    if (xs == NULL) {
        a->bad = 1;
        return;
    }
    if (is_long) {
        usleep(FK_LONG_OP_US);
    }
    for (uint32_t b = 0; b < block_dim; b++) {
        xs[b] = is_long ? xs[b] + 1U : xs[b] * 2U;
    }
}

struct fh_kernel_result fh_run_kernel(uint32_t sq_id, const char* name, const uint8_t* args, size_t args_len,
                                      uint32_t block_dim, int mix)
{
    struct fh_kernel_result r = {0, 0};
    struct fk_args a = {args, args_len, 0, {NULL}, {0}, 0};
    if (strcmp(name, "vector_add") == 0) {
        k_vector_add(&a, 0);
    } else if (strcmp(name, "mix_vector_add") == 0) {
        k_vector_add(&a, mix ? 8 : 0); /* slot 0: the inter-core sync address */
    } else if (strcmp(name, "axpy") == 0) {
        k_axpy(&a);
    } else if (strcmp(name, "scale") == 0) {
        k_scale(&a);
    } else if (strcmp(name, "matmul") == 0) {
        k_matmul(&a);
    } else if (strcmp(name, "sleep") == 0) {
        uint32_t us = fk_u32(&a, 0);
        if (!a.bad) {
            usleep(us);
        }
    } else if (strcmp(name, "fault") == 0) {
        uint32_t code = fk_u32(&a, 0);
        r.error_type = FK_EXCEPTION;
        r.error_code = (code != 0) ? code : FK_BAD_ACCESS;
        return r;
    } else if (strcmp(name, "hang") == 0) {
        fh_hang_until_stopped(sq_id);
    } else if (strcmp(name, "noop") == 0) {
        /* nothing */
    } else if (strcmp(name, "add_custom") == 0) {
        k_add_custom(&a, 1);
    } else if (strcmp(name, "add_custom_simple") == 0) {
        k_add_custom(&a, 0);
    } else if (strcmp(name, "LongOPf") == 0) {
        k_long_short(&a, block_dim, 1);
    } else if (strcmp(name, "ShortOPf") == 0) {
        k_long_short(&a, block_dim, 0);
    } else {
        a.bad = 1; /* no host function for this kernel */
    }
    if (a.bad) {
        r.error_type = FK_EXCEPTION;
        r.error_code = FK_BAD_ACCESS;
    }
    for (int i = 0; i < a.npins; i++) {
        fh_unpin(a.pins[i], a.writes[i]);
    }
    return r;
}
