/* Shared between the fake driver's files (tests/realrt/fakehal). */
#ifndef AIO_FAKEHAL_H
#define AIO_FAKEHAL_H

#include <stddef.h>
#include <stdint.h>

/* Exported from libascend_hal.so: a driver entry point or a test control. */
#define FH_EXPORT __attribute__((visibility("default")))

/* Traces (AIO_FAKEHAL_TRACE) that a call is answered without a model; returns 0, success. */
int aio_fakehal_unmodelled(const char* name);

/* 1 when [p, p + n) lies inside one live allocation of the fake device (device or pinned). */
int fh_valid_range(uintptr_t p, size_t n);

/* A device access pins the allocation it touches for its duration, so that a free meanwhile is
 * given back only after it (and counted when the access writes: the caller's bug). fh_pin gives
 * FH_PINNED with *pinned the live allocation holding all of [p, p + n), pinned; else *pinned is
 * NULL and it gives FH_FREED when the range is in memory freed lately (a write is counted: on a
 * device that memory is unmapped, the access faults) or FH_UNMAPPED (memory the driver never handed
 * out, or a range running past its block). fh_unpin(NULL, ...) does nothing. */
enum { FH_PINNED = 0, FH_FREED = 1, FH_UNMAPPED = 2 };
struct fh_alloc;
int fh_pin(uintptr_t p, size_t n, int write, struct fh_alloc** pinned);
void fh_unpin(struct fh_alloc* a, int write);

/* Blocks the calling SQ worker until its queue `sq_id` is stopped (a hung kernel). */
void fh_hang_until_stopped(uint32_t sq_id);

/* halSqCqConfig of a normal queue (sqconfig.c -> fakehal.c): a drvError_t. */
int fh_sq_config(uint32_t sq_id, uint32_t prop, uint32_t value);

/* What a kernel's run reports: 0, or STARS error bits and the accelerator's status code. */
struct fh_kernel_result {
    uint32_t error_type;
    uint32_t error_code;
};

/* Runs the host function registered for the kernel `name` over its args (the device's view:
 * the runtime's args buffer, system slots included). kernels.c. */
struct fh_kernel_result fh_run_kernel(uint32_t sq_id, const char* name, const uint8_t* args, size_t args_len,
                                      uint32_t block_dim, int mix);

#endif
