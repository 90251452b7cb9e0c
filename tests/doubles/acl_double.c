/*
 * A small, strict test double of the CANN runtime (libascendcl.so) for aio_ascend's `acl` backend.
 *
 * It exports the ACL functions the backend binds, with the same C signatures, plus `double_*`
 * control functions the tests use to look at what crossed the boundary. Model:
 *
 *  - aclInit once (100002 on repeat); aclrt* calls need it (100001 otherwise).
 *  - Contexts are per thread (107002 when the calling thread has none). aclrtSetDevice binds the
 *    device's default context, aclrtCreateContext a new one; both to the calling thread.
 *  - Streams are FIFO queues executed by ONE device pthread, which serves every stream with a
 *    time model (a `sleep` kernel occupies its stream, not the device thread). A stream belongs
 *    to the context that created it (107003 when used under another context).
 *  - Ex events: a never-recorded event reads COMPLETE; a record is a stream task that captures
 *    everything submitted before it; re-recording bumps a generation counter; a StreamWaitEvent
 *    refers to the recording current at the time of the call.
 *  - Synchronize*WithTimeout: ms, -1 = forever, 0 (or < -1) = 107000; 507046 / 507047 on timeout.
 *  - Faults: in stop-on-failure mode a device fault is sticky for the context: every query, sync,
 *    record, copy, memset and launch in it returns the fault code until the context is destroyed
 *    or the device reset (creation, cleanup and stream attributes keep working). In continue mode the faulting task is skipped and the next sync of its stream
 *    reports the code once.
 *  - Device memory lives in host memory but is handed out at high addresses (above 2**52) through
 *    a mapping table, so pointer truncation shows; kernels and copies translate every address and
 *    fault on anything outside a live allocation (use after free included).
 *  - aclrtMemcpyAsync: a host side inside aclrtMallocHost memory is read/written when the copy
 *    executes; any other host address is pageable and the call blocks until the copy is done.
 *  - aclrtMemsetAsync: a stream task like a copy (FIFO with everything else on its stream). At the
 *    call: devPtr not NULL and count <= maxCount, else 107000, and nothing about the address: the
 *    runtime checks only those (src/runtime/api/impl/api_error.cc:3128, ApiErrorDecorator::
 *    MemsetAsync; src/acl/aclrt_impl/memory.cpp:738). When it executes, [devPtr, devPtr+count)
 *    outside one live device allocation (never allocated, freed meanwhile, or past its end)
 *    faults the device (507053). The low byte of the int32 value is stored, as C memset does.
 *  - Device memory capacity: DOUBLE_MEM_TOTAL (32 GiB) per device (double_set_mem_total changes
 *    it). aclrtMalloc counts 64-byte-rounded sizes against it and fails with 207001 beyond it;
 *    aclrtGetMemInfo(ACL_HBM_MEM) reports free = total - live bytes of the calling context's
 *    device; ACL_DDR_MEM reports 0/0 (the modelled SoC has HBM only); other attrs: 107000.
 *  - Stream attributes (aclrtSetStreamAttribute): FAILURE_MODE (1) sets the failure mode as
 *    aclrtSetStreamFailureMode does; FLOAT_OVERFLOW_CHECK, USER_CUSTOM_TAG, CACHE_OP_INFO (2..4)
 *    are accepted and ignored; PRIORITY (5) must be 0..7 (lower = more urgent, default 0) and is
 *    stored on the stream (double_stream_priority), but the device thread does not schedule by
 *    it; any other id: 107000. aclrtDeviceGetStreamPriorityRange gives (least 7, greatest 0).
 *  - aclrtGetVersion gives 1.17.0 (ACL_MAJOR/MINOR/PATCH_VERSION of the CANN headers the ABI
 *    facts were read from) and needs no aclInit; aclrtGetSocName gives DOUBLE_SOC_NAME after
 *    aclInit, NULL before it.
 *  - Built with -DACL_DOUBLE_LEGACY, the six functions above (aclrtSetStreamAttribute,
 *    aclrtDeviceGetStreamPriorityRange, aclrtMemsetAsync, aclrtGetVersion, aclrtGetMemInfo,
 *    aclrtGetSocName) and model-RI capture (aclmdlRI*) are not exported: a stand-in for an
 *    older CANN release.
 *  - aclrtLaunchKernelWithHostArgs validates like CANN, writes devArgs + dataOffset into the
 *    CALLER's buffer at each addrOffset, then copies [0, argsSize) (the kernel reads the copy).
 *  - Every ACL call is logged with its raw arguments (uint64, signed values sign-extended) and
 *    its return code.
 *  - Task ids, aclrtGetThreadLastTaskId, the task a forced stream destruction leaves running,
 *    aclrtSynchronizeDeviceWithTimeout, the coexisting exception callbacks and a full queue's
 *    refusal follow the CANN runtime's source, cited there: acl_double_faults.h.
 *    Built with -DACL_DOUBLE_LEGACY, aclrtSynchronizeDeviceWithTimeout is not exported either.
 *
 * Personas (-DACL_PERSONA=800|830|850|910, default 910): the double exports exactly the symbol
 * set docs/cann-support.md §9 lists for that CANN generation, so the backend's symbol probing,
 * launch-path choice and BackendUnavailableError are exercised (what each persona adds, and the
 * args-handle path, hidden MIX arguments, exception info and the rest of the newer API, are in
 * acl_double_cann.c, included at the end):
 *  - 800 (CANN 8.0): the legacy loader (aclrtCreateBinary + aclrtBinaryLoad) and the device-args
 *    launch (aclrtLaunchKernel: args in device memory, read when the kernel runs);
 *  - 830 (CANN 8.3.RC1): + aclrtBinaryLoadFrom{File,Data}, the args-handle path, CANN version,
 *    device info, stream ids, stream attributes (priority refused);
 *  - 850 (CANN 8.5.0): + aclrtLaunchKernelWithHostArgs, hardware sync and overflow addresses,
 *    aclrtGetVersion (1.16.0), memory info, aclrtCreateStreamWithConfig, the priority range
 *    (the priority stream attribute is still refused: ACL_STREAM_ATTR_PRIORITY is a 9.1 header);
 *  - 910 (CANN 9.1.0): + function parameter info, exception args/func getters, the priority
 *    attribute; aclrtGetVersion 1.17.0.
 *
 * Built-in kernels come from any binary whose content starts with DOUBLE_BUILTINS_MAGIC
 * (aclrtBinaryLoadFromData, aclrtBinaryLoadFromFile with an absolute path to such a file, or
 * aclrtCreateBinary + aclrtBinaryLoad).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
#define MAYBE_UNUSED __attribute__((unused)) /* helpers of functions a persona does not export */

#ifndef ACL_PERSONA
#define ACL_PERSONA 910
#endif
#define HAS_83 (ACL_PERSONA >= 830) /* args handle, aclrtBinaryLoadFrom*, version, device info */
#define HAS_85 (ACL_PERSONA >= 850) /* host args, sync/overflow addresses, memory info */
#define HAS_90 (ACL_PERSONA >= 900) /* exception args / func handle getters */
#define HAS_91 (ACL_PERSONA >= 910) /* parameter info, ACL_STREAM_ATTR_PRIORITY */

/* ---- ACL types (layouts as in the CANN headers) ------------------------------------------ */

typedef int aclError;
typedef void *aclrtContext;
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef void *aclrtBinHandle;
typedef void *aclrtFuncHandle;

typedef struct { uint32_t addrOffset; uint32_t dataOffset; } aclrtPlaceHolderInfo;
typedef struct { uint32_t timeoutLow; uint32_t timeoutHigh; } aclrtTimeoutUs;
typedef enum { ACL_RT_ENGINE_TYPE_AIC = 0, ACL_RT_ENGINE_TYPE_AIV = 1 } aclrtEngineType;
typedef union {
    uint8_t schemMode; uint32_t localMemorySize; uint32_t dynUBufSize; aclrtEngineType engineType;
    uint32_t blockDimOffset; uint8_t isBlockTaskPrefetch; uint8_t isDataDump; uint16_t timeout;
    aclrtTimeoutUs timeoutUs; uint8_t enableProfiling; uint32_t rsv[4];
} aclrtLaunchKernelAttrValue;
typedef enum {
    ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE = 1, ACL_RT_LAUNCH_KERNEL_ATTR_DYN_UBUF_SIZE = 2,
    ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE = 3, ACL_RT_LAUNCH_KERNEL_ATTR_BLOCKDIM_OFFSET = 4,
    ACL_RT_LAUNCH_KERNEL_ATTR_BLOCK_TASK_PREFETCH = 5, ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP = 6,
    ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT = 7, ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US = 8,
    ACL_RT_LAUNCH_KERNEL_ATTR_ENABLE_PROFILING = 9
} aclrtLaunchKernelAttrId;
typedef struct { aclrtLaunchKernelAttrId id; aclrtLaunchKernelAttrValue value; } aclrtLaunchKernelAttr;
typedef struct { aclrtLaunchKernelAttr *attrs; size_t numAttrs; } aclrtLaunchKernelCfg;
typedef union { uint32_t isLazyLoad; uint32_t magic; int32_t cpuKernelMode; uint32_t rsv[4]; }
    aclrtBinaryLoadOptionValue;
typedef enum { ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD = 1, ACL_RT_BINARY_LOAD_OPT_MAGIC = 2,
               ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE = 3 } aclrtBinaryLoadOptionType;
typedef struct { aclrtBinaryLoadOptionType type; aclrtBinaryLoadOptionValue value; } aclrtBinaryLoadOption;
typedef struct { aclrtBinaryLoadOption *options; size_t numOpt; } aclrtBinaryLoadOptions;
typedef enum { ACL_MEMCPY_HOST_TO_HOST = 0, ACL_MEMCPY_HOST_TO_DEVICE = 1,
               ACL_MEMCPY_DEVICE_TO_HOST = 2, ACL_MEMCPY_DEVICE_TO_DEVICE = 3 } aclrtMemcpyKind;
typedef enum { ACL_MEM_MALLOC_HUGE_FIRST = 0 } aclrtMemMallocPolicy;
typedef enum { ACL_EVENT_RECORDED_STATUS_NOT_READY = 0, ACL_EVENT_RECORDED_STATUS_COMPLETE = 1 }
    aclrtEventRecordedStatus;
typedef enum { ACL_STREAM_STATUS_COMPLETE = 0, ACL_STREAM_STATUS_NOT_READY = 1,
               ACL_STREAM_STATUS_RESERVED = 0xFFFF } aclrtStreamStatus;
typedef enum { ACL_STREAM_ATTR_FAILURE_MODE = 1, ACL_STREAM_ATTR_FLOAT_OVERFLOW_CHECK = 2,
               ACL_STREAM_ATTR_USER_CUSTOM_TAG = 3, ACL_STREAM_ATTR_CACHE_OP_INFO = 4,
               ACL_STREAM_ATTR_PRIORITY = 5 } aclrtStreamAttr;
typedef union {
    uint64_t failureMode; uint32_t overflowSwitch; uint32_t userCustomTag; uint32_t cacheOpInfoSwitch;
    uint32_t streamPriority; uint32_t reserve[4];
} aclrtStreamAttrValue;
typedef enum { ACL_DDR_MEM = 0, ACL_HBM_MEM = 1 } aclrtMemAttr; /* the rest of the enum: 2..17 */

_Static_assert(sizeof(aclrtPlaceHolderInfo) == 8, "aclrtPlaceHolderInfo");
_Static_assert(sizeof(aclrtLaunchKernelAttrValue) == 16, "aclrtLaunchKernelAttrValue");
_Static_assert(sizeof(aclrtLaunchKernelAttr) == 20, "aclrtLaunchKernelAttr");
_Static_assert(offsetof(aclrtLaunchKernelAttr, value) == 4, "aclrtLaunchKernelAttr.value");
_Static_assert(sizeof(aclrtLaunchKernelCfg) == 16, "aclrtLaunchKernelCfg");
_Static_assert(offsetof(aclrtLaunchKernelCfg, numAttrs) == 8, "aclrtLaunchKernelCfg.numAttrs");
_Static_assert(sizeof(aclrtTimeoutUs) == 8, "aclrtTimeoutUs");
_Static_assert(sizeof(aclrtBinaryLoadOption) == 20, "aclrtBinaryLoadOption");
_Static_assert(sizeof(aclrtBinaryLoadOptions) == 16, "aclrtBinaryLoadOptions");
_Static_assert(sizeof(aclrtStreamAttrValue) == 16, "aclrtStreamAttrValue");
_Static_assert(_Alignof(aclrtStreamAttrValue) == 8, "aclrtStreamAttrValue alignment");

#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_STREAM_CONTEXT 107003
#define ACL_ERROR_RT_INVALID_HANDLE 107017
#define ACL_ERROR_RT_STREAM_ABORT 107023
#define ACL_ERROR_RT_STREAM_CAPTURED 107027          /* rt_error_codes.h:47 */
#define ACL_ERROR_RT_STREAM_NOT_CAPTURED 107029      /* rt_error_codes.h:49 */
#define ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED 507903 /* rt_error_codes.h:154 */
#define ACL_ERROR_RT_SYMBOL_NOT_FOUND 107042
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_ERROR_RT_EVENT_NOT_COMPLETE 507006
#define ACL_ERROR_RT_AICORE_TIMEOUT 507014
#define ACL_ERROR_RT_AICORE_EXCEPTION 507015
#define ACL_ERROR_RT_STREAM_SYNC_TIMEOUT 507046
#define ACL_ERROR_RT_EVENT_SYNC_TIMEOUT 507047
#define ACL_ERROR_RT_DEVICE_MEM_ERROR 507053

#define ACL_EVENT_SYNC 0x01u
#define ACL_EVENT_CAPTURE_STREAM_PROGRESS 0x02u
#define ACL_EVENT_TIME_LINE 0x08u
#define ACL_EVENT_DEVICE_USE_ONLY 0x10u
#define ACL_STOP_ON_FAILURE 1u

#define DOUBLE_BUILTINS_MAGIC "AIO_ASCEND_ACL_DOUBLE_BUILTINS"
#define DEV_BASE 0x0012340000000000ull  /* device memory: above 2**52 */
#define ARGS_BASE 0x0012350000000000ull /* device args slots (one per launch, never reused) */
#define MAX_DEVICES 8
#define DOUBLE_MEM_TOTAL (32ull << 30) /* device memory per device: 32 GiB */
#define DOUBLE_SOC_NAME "Ascend910B_double"
#define DOUBLE_VERSION_MAJOR 1
#if HAS_90
#define DOUBLE_VERSION_MINOR 17 /* ACL 1.17.0: H900, H910 */
#else
#define DOUBLE_VERSION_MINOR 16 /* ACL 1.16.0: H850 */
#endif
#define DOUBLE_VERSION_PATCH 0
#if ACL_PERSONA >= 910
#define DOUBLE_CANN_VERSION "9.1.0"
#elif ACL_PERSONA >= 900
#define DOUBLE_CANN_VERSION "9.0.0"
#elif ACL_PERSONA >= 850
#define DOUBLE_CANN_VERSION "8.5.0"
#elif ACL_PERSONA >= 830
#define DOUBLE_CANN_VERSION "8.3.RC1"
#else
#define DOUBLE_CANN_VERSION "8.0.0"
#endif
#define FFTS_ADDR 0x0012370000000000ull     /* the inter-core sync (FFTS/C2C) address */
#define OVERFLOW_BASE 0x0012380000000000ull /* each context's float-overflow address */
#define STREAM_PRIORITY_LEAST 7
#define STREAM_PRIORITY_GREATEST 0

/* ---- small helpers ------------------------------------------------------------------------ */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define P(x) ((uint64_t)(uintptr_t)(x))
#define I(x) ((uint64_t)(int64_t)(x))
#define Z(x) ((uint64_t)(x))

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_work_cv; /* the device thread waits here */
static pthread_cond_t g_done_cv; /* host threads wait here for progress */

__attribute__((constructor)) static void double_ctor(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g_work_cv, &attr);
    pthread_cond_init(&g_done_cv, &attr);
    pthread_condattr_destroy(&attr);
}

/* Wait on cv until deadline_ns (UINT64_MAX: forever). g_mu must be held. */
static void cv_wait(pthread_cond_t *cv, uint64_t deadline_ns) {
    if (deadline_ns == UINT64_MAX) {
        pthread_cond_wait(cv, &g_mu);
        return;
    }
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline_ns / 1000000000ull);
    ts.tv_nsec = (long)(deadline_ns % 1000000000ull);
    pthread_cond_timedwait(cv, &g_mu, &ts);
}

static uint64_t deadline_after_ms(int32_t timeout_ms) {
    if (timeout_ms < 0) return UINT64_MAX;
    return now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

/* ---- error messages (thread level, returned and cleared by aclGetRecentErrMsg) ------------- */

static __thread char t_msg[512];
static __thread char t_msg_out[512];
static __thread const char *t_fn = "";
static __thread aclError t_last_err; /* aclrtGetLastError / aclrtPeekAtLastError */

static aclError fail(aclError code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static aclError fail(aclError code, const char *fmt, ...) {
    char text[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(t_msg, sizeof t_msg, "[acl double] %s: %s (code %d)", t_fn, text, code);
    t_last_err = code;
    return code;
}

/* ---- call log --------------------------------------------------------------------------- */

#define LOG_CAP 16384
#define LOG_ARGS 8
typedef struct {
    char name[40];
    int nargs;
    int rc;
    uint64_t args[LOG_ARGS];
} log_entry_t;

static log_entry_t g_log[LOG_CAP];
static uint64_t g_log_count;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t log_call(const char *name, const uint64_t *args, int nargs) {
    pthread_mutex_lock(&g_log_mu);
    uint64_t index = g_log_count++;
    log_entry_t *e = &g_log[index % LOG_CAP];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->nargs = nargs;
    e->rc = -1; /* still running */
    for (int i = 0; i < nargs && i < LOG_ARGS; i++) e->args[i] = args[i];
    pthread_mutex_unlock(&g_log_mu);
    return index;
}

static aclError log_ret(uint64_t index, aclError rc) {
    pthread_mutex_lock(&g_log_mu);
    if (g_log_count - index <= LOG_CAP) g_log[index % LOG_CAP].rc = rc;
    pthread_mutex_unlock(&g_log_mu);
    return rc;
}

/* ---- injected errors (double_inject_error) ------------------------------------------------ */

#define MAX_INJECT 16
typedef struct { char func[48]; int code; char msg[256]; int active; } inject_t;
static inject_t g_inject[MAX_INJECT];

static aclError take_injection(const char *name) {
    aclError code = 0;
    pthread_mutex_lock(&g_log_mu);
    for (int i = 0; i < MAX_INJECT; i++) {
        if (g_inject[i].active && strcmp(g_inject[i].func, name) == 0) {
            g_inject[i].active = 0;
            code = g_inject[i].code;
            snprintf(t_msg, sizeof t_msg, "%s", g_inject[i].msg);
            break;
        }
    }
    pthread_mutex_unlock(&g_log_mu);
    return code;
}

#define ENTER(name, n, ...)                                           \
    uint64_t args_[] = {__VA_ARGS__};                                 \
    uint64_t log_index_ = log_call(name, args_, (n));                 \
    t_fn = name;                                                      \
    do {                                                              \
        aclError injected_ = take_injection(name);                    \
        if (injected_) return log_ret(log_index_, injected_);         \
    } while (0)
#define LEAVE(rc) return log_ret(log_index_, (rc))
#define LEAVE_UNLOCK(rc)                                              \
    do {                                                              \
        aclError rc_ = (rc);                                          \
        pthread_mutex_unlock(&g_mu);                                  \
        return log_ret(log_index_, rc_);                              \
    } while (0)

/* ---- live-handle registry (open addressing hash set) -------------------------------------- */

enum { K_CTX = 1, K_STREAM, K_EVENT, K_BIN, K_FUNC, K_MODEL, K_BINDESC };
typedef struct { uintptr_t key; int kind; } slot_t;
#define TOMB ((uintptr_t)1)
static slot_t *g_live;
static size_t g_live_cap, g_live_used, g_live_n;

static size_t hash_ptr(uintptr_t p) {
    uint64_t x = (uint64_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

static void live_insert_raw(slot_t *table, size_t cap, uintptr_t key, int kind) {
    size_t i = hash_ptr(key) & (cap - 1);
    while (table[i].key && table[i].key != TOMB) i = (i + 1) & (cap - 1);
    table[i].key = key;
    table[i].kind = kind;
}

static void live_add(void *p, int kind) {
    if ((g_live_used + 1) * 2 > g_live_cap) {
        size_t cap = g_live_cap ? g_live_cap * 2 : 256;
        while (g_live_n * 4 > cap) cap *= 2;
        slot_t *table = calloc(cap, sizeof *table);
        if (!table) abort();
        for (size_t i = 0; i < g_live_cap; i++)
            if (g_live[i].key && g_live[i].key != TOMB)
                live_insert_raw(table, cap, g_live[i].key, g_live[i].kind);
        free(g_live);
        g_live = table;
        g_live_cap = cap;
        g_live_used = g_live_n;
    }
    live_insert_raw(g_live, g_live_cap, (uintptr_t)p, kind);
    g_live_used++;
    g_live_n++;
}

static slot_t *live_find(const void *p) {
    if (!g_live_cap || !p) return NULL;
    size_t i = hash_ptr((uintptr_t)p) & (g_live_cap - 1);
    while (g_live[i].key) {
        if (g_live[i].key == (uintptr_t)p) return &g_live[i];
        i = (i + 1) & (g_live_cap - 1);
    }
    return NULL;
}

static int live_is(const void *p, int kind) {
    slot_t *s = live_find(p);
    return s && s->kind == kind;
}

static void live_del(const void *p) {
    slot_t *s = live_find(p);
    if (s) {
        s->key = TOMB;
        g_live_n--;
    }
}

/* ---- objects ------------------------------------------------------------------------------ */

typedef struct ctx {
    int device;
    int is_default;
    uint64_t overflow_addr; /* aclrtCtxGetFloatOverflowAddr */
    int fault_code;
    char fault_msg[256];
    int unread_code; /* a failed task no stream synchronize has read yet (g_unread_faults) */
    char unread_msg[256];
    int thread_refs; /* threads that have it current (never a device's default context) */
    int destroyed;
    struct ctx *next;
} ctx_t;

enum { T_KERNEL = 1, T_RECORD, T_WAIT, T_COPY, T_MEMSET, T_MODEL };
enum { KN_VECTOR_ADD, KN_AXPY, KN_SCALE, KN_MATMUL, KN_SLEEP, KN_FAULT, KN_HANG, KN_NOOP, KN_MIX_ADD,
       KN_COUNT };
static const char *const KERNEL_NAMES[KN_COUNT] = {
    "vector_add", "axpy", "scale", "matmul", "sleep", "fault", "hang", "noop", "mix_add"};

struct stream;
struct event;
struct model;

typedef struct task {
    struct task *next;
    uint64_t seq;
    uint32_t rt_id; /* the runtime's task id, (flip << 16) | id (see next_task_id) */
    int kind;
    /* kernel */
    int kernel;
    uint32_t blocks;
    unsigned char *args;
    size_t args_size;
    uint64_t dev_args;
    int late_args;       /* aclrtLaunchKernel: args in device memory, read when the kernel runs */
    int started;
    uint64_t until_ns;
    uint64_t overflow;   /* the launching context's overflow address (mix_add checks it) */
    size_t lead;         /* leading system slot bytes before the user args (the sync address) */
    uint64_t timeout_ns; /* kernel timeout from the cfg (0: none) */
    int times_out;       /* it runs longer than timeout_ns: fails with 507014 at the timeout */
    void *func;          /* the function handle (exception info) */
    uint64_t touched[4]; /* device allocations the kernel read at its start: written at its end */
    int ntouched;
    /* record */
    struct event *event;
    uint64_t gen;
    /* wait */
    struct stream *wait_stream;
    uint64_t wait_seq;
    /* copy (dst, count also for memset) */
    int copy_kind;
    int pageable;
    uint64_t dst, src;
    size_t count;
    /* memset */
    unsigned char fill;
    /* model replay (aclmdlRIExecuteAsync): the model, its next recorded task, the running copy */
    struct model *model;
    struct task *next_rec;
    struct task *cur;
} task_t;

/* A captured model (aclmdlRI): the tasks recorded on a capturing stream, in order. Live from
   aclmdlRICaptureEnd until aclmdlRIDestroy; queued replays hold a reference (refs). */
typedef struct model {
    ctx_t *ctx;
    int refs;
    int mode; /* the aclmdlRICaptureMode it was captured in */
    int invalidated; /* an error invalidated the capture (CaptureEnd returns 507903) */
    task_t *head, *tail;
    size_t ntasks;
} model_t;

typedef struct stream {
    ctx_t *ctx;
    int32_t id; /* aclrtStreamGetId */
    int refs;
    int alive;
    int aborted;
    uint64_t mode;
    uint32_t priority; /* ACL_STREAM_ATTR_PRIORITY, 0 by default */
    aclError pending_err;
    task_t *head, *tail;
    size_t depth;
    int callers; /* host threads inside a blocking call on it (waiting for room, synchronizing) */
    uint64_t submitted, completed;
    uint32_t rt_next, rt_flip; /* the next task id (0..65534) and the flip count (next_task_id) */
    model_t *capture; /* aclmdlRICaptureBegin..End: tasks are recorded here, not queued */
    struct stream *next_all;
} stream_t;

typedef struct event {
    ctx_t *ctx;
    unsigned flags;
    int refs;
    int alive;
    int recorded;
    uint64_t gen;
    stream_t *rec_stream;
    uint64_t rec_seq;
    uint64_t timestamp_ns;
    uint64_t ts_gen;
} event_t;

typedef struct func { struct binary *bin; int kernel; } func_t;
/* kernel type of a binary: from the load magic (data), the JSON beside the file, or the chip's
   default (CUBE on A2/A3, cann-support.md §5.3); MIX ones get the hidden slots (§4) */
enum { KT_AICORE = 0, KT_CUBE = 1, KT_VECTOR = 2, KT_MIX = 3 };
typedef struct binary {
    int has_func[KN_COUNT];
    func_t funcs[KN_COUNT];
    int kernel_type;
    int lazy;
} binary_t; /* funcs[0] != the binary */

typedef struct { uint64_t dev; size_t size; unsigned char *host; int device; } dalloc_t;
typedef struct { unsigned char *ptr; size_t size; } halloc_t;

static int g_initialized;
static int g_device_count = 1;
static int g_dev_refs[MAX_DEVICES];
static ctx_t *g_default_ctx[MAX_DEVICES];
static ctx_t *g_contexts;
static stream_t *g_streams;
static size_t g_max_depth = 2013;
/* Streams destroyed while a host thread was inside a blocking call on them. The real runtime
   frees the Stream under that thread, which goes on using it (hicann/runtime@681ef76: the
   delete at stream.cc:4682-4686; a launch or record waiting for room in the loop of
   task_submit.cc:478-506, then event.cc:563-569; a synchronize at stream.cc:1947-2000): a
   crash. The double fails the call instead and counts the misuse for the tests to see. */
static int64_t g_freed_under_callers;
/* The real runtime on STARS chips: a failed task stops its stream's queue, and the runtime
   learns of it only when it reads the task's error completion, which only a stream (or device)
   synchronize does (hicann/runtime@681ef76: stream.cc:4438, stars_engine.cc:1398-1470; an event
   query reads the queue head alone: npu_driver_res.cc:861-878). With this set, a fault in
   stop-on-failure mode stays unread until then: event queries say NOT_READY, event synchronizes
   wait, other calls succeed, and nothing more runs. Off (the default), every call sees it at
   once. double_set_unread_faults() sets it. */
static int g_unread_faults;
static int32_t g_next_stream_id = 1;
static __thread ctx_t *t_ctx;
/* Destroyed contexts some thread still has current: not deleted yet (see bind_thread_locked). */
static size_t g_held_contexts;

/* The calling thread's current context becomes c (NULL: none). On the real runtime a thread's
   binding of a context that is not a device's primary one is a reference: a destroyed context
   (its default stream's queues and memory) is deleted only once no thread has it current, and a
   thread that ends keeps its binding (hicann/runtime@681ef76: common/inner_thread_local.cpp:
   56-78, UpdateThreadBinding and NeedThreadRef; context/context.cc:1898-1917,
   TryDeleteIfNeeded). Over tests/realrt's driver such a context kept ~21 MB of device memory
   and two hardware queues. Contexts are never freed here, so an old binding is safe to read. */
static void bind_thread_locked(ctx_t *c) {
    ctx_t *old = t_ctx;
    if (old == c) return;
    if (old && !old->is_default && old->thread_refs > 0 && --old->thread_refs == 0 &&
        old->destroyed)
        g_held_contexts--;
    if (c && !c->is_default) c->thread_refs++;
    t_ctx = c;
}

static dalloc_t *g_dallocs;
static size_t g_ndallocs, g_dallocs_cap;
static uint64_t g_next_dev = DEV_BASE;
static uint64_t g_mem_total = DOUBLE_MEM_TOTAL;
static uint64_t g_dev_used[MAX_DEVICES]; /* live device bytes (64-byte rounded) per device */
static uint64_t g_next_args = ARGS_BASE;
#define FREED_RING 4096
static uint64_t g_freed_dev[FREED_RING];
static uint64_t g_freed_host[FREED_RING];
static size_t g_freed_dev_n, g_freed_host_n;

static halloc_t *g_hallocs;
static size_t g_nhallocs, g_hallocs_cap;

static size_t g_live_streams, g_live_events, g_live_binaries, g_live_contexts, g_queued_tasks;
static size_t g_live_models;

static pthread_t g_device_thread;
static int g_device_thread_running;
static int g_stop;

/* last launch, as it crossed the boundary */
static struct {
    int valid;
    uint64_t raw[8];
    int cfg_null;
    uint64_t num_attrs;
    unsigned char attrs[64 * sizeof(aclrtLaunchKernelAttr)];
    uint64_t num_ph;
    unsigned char ph[256 * sizeof(aclrtPlaceHolderInfo)];
    size_t args_size;
    unsigned char args_pre[65536];
    unsigned char args_post[65536];
    uint64_t dev_args;
} g_last;
static char g_last_load_path[4096];
static uint64_t g_last_load_options_num;
static int g_last_load_options_null = 1;

/* ---- memory tables ------------------------------------------------------------------------ */

static dalloc_t *dev_find(uint64_t addr) {
    for (size_t i = 0; i < g_ndallocs; i++) {
        dalloc_t *a = &g_dallocs[i];
        if (addr >= a->dev && addr - a->dev < a->size) return a;
    }
    return NULL;
}

static struct task *g_starting; /* the kernel being started: dev_range notes what it touches */
static void note_touched(struct task *t, uint64_t base);

/* host pointer for [addr, addr+len) of device memory, or NULL */
static unsigned char *dev_range(uint64_t addr, size_t len) {
    dalloc_t *a = dev_find(addr);
    if (!a) return NULL;
    if (len > a->size - (addr - a->dev)) return NULL;
    if (g_starting) note_touched(g_starting, a->dev);
    return a->host + (addr - a->dev);
}

static halloc_t *host_find(uint64_t addr) {
    for (size_t i = 0; i < g_nhallocs; i++) {
        halloc_t *h = &g_hallocs[i];
        if (addr >= (uint64_t)(uintptr_t)h->ptr && addr - (uint64_t)(uintptr_t)h->ptr < h->size) return h;
    }
    return NULL;
}

static int ring_has(const uint64_t *ring, size_t n, uint64_t value) {
    size_t limit = n < FREED_RING ? n : FREED_RING;
    for (size_t i = 0; i < limit; i++)
        if (ring[i] == value) return 1;
    return 0;
}

static size_t rounded64(size_t size) { return (size + 63) & ~(size_t)63; }

static void free_all_device_memory(int device) {
    size_t j = 0;
    for (size_t i = 0; i < g_ndallocs; i++) {
        if (g_dallocs[i].device == device) {
            g_dev_used[device] -= rounded64(g_dallocs[i].size);
            g_freed_dev[g_freed_dev_n++ % FREED_RING] = g_dallocs[i].dev;
            free(g_dallocs[i].host);
        } else {
            g_dallocs[j++] = g_dallocs[i];
        }
    }
    g_ndallocs = j;
}

/* ---- streams, events, tasks -------------------------------------------------------------- */

static void stream_unref(stream_t *s) {
    if (--s->refs == 0) free(s);
}

static void event_unref(event_t *e) {
    if (--e->refs == 0) {
        if (e->rec_stream) stream_unref(e->rec_stream);
        free(e);
    }
}

static void task_free(task_t *t);

static void model_unref(model_t *m) {
    if (--m->refs) return;
    for (task_t *t = m->head, *next; t; t = next) {
        next = t->next;
        task_free(t);
    }
    free(m);
}

static void task_free(task_t *t) {
    if (t->kind == T_RECORD && t->event) event_unref(t->event);
    if (t->kind == T_WAIT && t->wait_stream) stream_unref(t->wait_stream);
    if (t->kind == T_MODEL) {
        if (t->cur) task_free(t->cur);
        model_unref(t->model);
    }
    free(t->args);
    free(t);
}

/* aclmdlRIDestroy, or the model's context going away: no longer a live handle (queued replays
   keep what they run). g_mu held. */
static void model_kill(model_t *m) {
    live_del(m);
    g_live_models--;
    model_unref(m);
}

/* The capture open on s, discarded (stream destroyed, or its context). g_mu held. */
static void capture_discard(stream_t *s) {
    if (s->capture) model_unref(s->capture);
    s->capture = NULL;
}

static void wake_device(void) { pthread_cond_signal(&g_work_cv); }

static void *device_main(void *arg);

static void ensure_device_thread(void) {
    if (!g_device_thread_running) {
        g_stop = 0;
        if (pthread_create(&g_device_thread, NULL, device_main, NULL) != 0) abort();
        g_device_thread_running = 1;
    }
}

/* A faulted context answers every later call with the fault's code and the same text. */
/* A stream or device synchronize reads an unread fault: from then on it is the context's. */
static void read_unread_fault(ctx_t *c) {
    if (c && c->unread_code && !c->fault_code) {
        c->fault_code = c->unread_code;
        snprintf(c->fault_msg, sizeof c->fault_msg, "%s", c->unread_msg);
        c->unread_code = 0;
        pthread_cond_broadcast(&g_done_cv);
    }
}

static aclError ctx_fault(ctx_t *c) {
    if (c && c->fault_code) {
        snprintf(t_msg, sizeof t_msg, "%s", c->fault_msg);
        t_last_err = c->fault_code;
        return c->fault_code;
    }
    return 0;
}

/* Discard queued work and mark the stream dead (force destroy / context teardown). */
static void stream_kill(stream_t *s) {
    task_t *t = s->head;
    while (t) {
        task_t *next = t->next;
        task_free(t);
        g_queued_tasks--;
        t = next;
    }
    s->head = s->tail = NULL;
    s->depth = 0;
    capture_discard(s);
    if (s->completed < s->submitted) s->aborted = 1;
    if (s->callers) g_freed_under_callers++;
    s->alive = 0;
    live_del(s);
    g_live_streams--;
    for (stream_t **pp = &g_streams; *pp; pp = &(*pp)->next_all) {
        if (*pp == s) {
            *pp = s->next_all;
            break;
        }
    }
    pthread_cond_broadcast(&g_done_cv);
    wake_device();
    stream_unref(s);
}

static void event_kill(event_t *e) {
    e->alive = 0;
    live_del(e);
    g_live_events--;
    pthread_cond_broadcast(&g_done_cv);
    event_unref(e);
}

static void destroy_context_locked(ctx_t *c) {
    for (stream_t *s = g_streams, *next; s; s = next) {
        next = s->next_all;
        if (s->ctx == c) stream_kill(s);
    }
    /* events of the context: collect first (killing mutates the registry) */
    size_t n = 0;
    event_t **events = NULL;
    for (size_t i = 0; i < g_live_cap; i++) {
        if (g_live[i].key && g_live[i].key != TOMB && g_live[i].kind == K_EVENT &&
            ((event_t *)g_live[i].key)->ctx == c) {
            event_t **grown = realloc(events, (n + 1) * sizeof *events);
            if (!grown) abort();
            events = grown;
            events[n++] = (event_t *)g_live[i].key;
        }
    }
    for (size_t i = 0; i < n; i++) event_kill(events[i]);
    /* and its models */
    n = 0;
    for (size_t i = 0; i < g_live_cap; i++) {
        if (g_live[i].key && g_live[i].key != TOMB && g_live[i].kind == K_MODEL &&
            ((model_t *)g_live[i].key)->ctx == c) {
            event_t **grown = realloc(events, (n + 1) * sizeof *events);
            if (!grown) abort();
            events = grown;
            events[n++] = (event_t *)g_live[i].key;
        }
    }
    for (size_t i = 0; i < n; i++) model_kill((model_t *)events[i]);
    free(events);
    live_del(c);
    g_live_contexts--;
    for (ctx_t **pp = &g_contexts; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    if (g_default_ctx[c->device] == c) g_default_ctx[c->device] = NULL;
    /* ContextDestroy lets go of the destroying thread's own binding only (api_impl.cc:
       4148-4154); other threads' keep it undeleted */
    if (t_ctx == c) bind_thread_locked(NULL);
    c->destroyed = 1;
    if (c->thread_refs > 0) g_held_contexts++;
    /* Never freed: a thread still bound to it must keep getting 107002, which a recycled
       address (a new context at the same place) would silently turn into a valid binding. */
    c->next = NULL;
}

static void drop_zombies(int device); /* acl_double_faults.h */

static void reset_device_locked(int device) {
    drop_zombies(device);
    for (ctx_t *c = g_contexts, *next; c; c = next) {
        next = c->next;
        if (c->device == device) destroy_context_locked(c);
    }
    free_all_device_memory(device);
    g_dev_refs[device] = 0;
}

/* The calling thread's live context, or NULL with 107002 set. g_mu held. */
static ctx_t *need_ctx(aclError *rc) {
    if (!t_ctx || !live_is(t_ctx, K_CTX)) { /* (a destroyed one stays bound: see above) */
        *rc = fail(ACL_ERROR_RT_CONTEXT_NULL,
                   "the calling thread has no current context (call aclrtSetCurrentContext)");
        return NULL;
    }
    return t_ctx;
}

/* A live stream of the current context, or NULL with the error set. g_mu held. */
static stream_t *need_stream(void *handle, ctx_t *c, aclError *rc) {
    if (!handle) {
        *rc = fail(ACL_ERROR_RT_PARAM_INVALID, "NULL (default) stream is not supported by the double");
        return NULL;
    }
    if (!live_is(handle, K_STREAM)) {
        *rc = fail(ACL_ERROR_RT_INVALID_HANDLE, "stream %p is not a live stream", handle);
        return NULL;
    }
    stream_t *s = handle;
    if (s->ctx != c) {
        *rc = fail(ACL_ERROR_RT_STREAM_CONTEXT, "stream %p belongs to another context", handle);
        return NULL;
    }
    return s;
}

static event_t *need_event(void *handle, aclError *rc) {
    if (!handle || !live_is(handle, K_EVENT)) {
        *rc = fail(ACL_ERROR_RT_INVALID_HANDLE, "event %p is not a live event", handle);
        return NULL;
    }
    return handle;
}

#include "acl_double_faults.h"

/* Append a task, blocking while the stream's queue is full (as the real runtime does). On a
   capturing stream the task is recorded into the capture instead (it does not run). */
static aclError enqueue(stream_t *s, task_t *t) {
    if (s->capture) {
        model_t *m = s->capture;
        t->seq = 0;
        t->next = NULL;
        if (m->tail) m->tail->next = t;
        else m->head = t;
        m->tail = t;
        m->ntasks++;
        return 0;
    }
    if (g_full_refusal && s->depth >= g_max_depth && s->alive && !s->ctx->fault_code) {
        task_free(t);
        return fail(g_full_refusal, "stream queue full (%zu tasks): refused (double_set_full_refusal)", s->depth);
    }
    /* the real runtime waits for room with no timeout, spinning, until room appears or the
       stream is aborted (task_submit.cc:478-506) */
    s->callers++;
    while (s->depth >= g_max_depth && s->alive && !s->ctx->fault_code) cv_wait(&g_done_cv, UINT64_MAX);
    s->callers--;
    if (!s->alive) {
        task_free(t);
        return fail(ACL_ERROR_RT_STREAM_ABORT, "stream destroyed while waiting for queue space");
    }
    if (s->ctx->fault_code) {
        aclError rc = ctx_fault(s->ctx);
        task_free(t);
        return rc;
    }
    t->seq = ++s->submitted;
    t->rt_id = next_task_id(s);
    t_last_task_id = t->rt_id;
    t->next = NULL;
    if (s->tail) s->tail->next = t;
    else s->head = t;
    s->tail = t;
    s->depth++;
    g_queued_tasks++;
    ensure_device_thread();
    wake_device();
    return 0;
}

/* ---- kernels ------------------------------------------------------------------------------ */

typedef struct { int state; aclError code; char msg[200]; uint64_t until_ns; } kres_t;
enum { KS_DONE, KS_SLEEP, KS_HANG, KS_FAULT };

static void kfault(kres_t *r, aclError code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void kfault(kres_t *r, aclError code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->state = KS_FAULT;
    r->code = code;
}

/* Translate a device address seen by a kernel: its own args slot, or live device memory (a
   device-args kernel reads everything, placeholder data included, from live device memory). */
static unsigned char *kaddr(task_t *t, uint64_t addr, uint64_t len) {
    if (!t->late_args && addr >= t->dev_args && addr - t->dev_args <= t->args_size &&
        len <= t->args_size - (addr - t->dev_args))
        return t->args + (addr - t->dev_args);
    if (len > SIZE_MAX) return NULL;
    return dev_range(addr, (size_t)len);
}

/* The kernels read their user parameters after the leading system slot the runtime lays out for
   them (t->lead: 8 bytes for a kernel with the inter-core sync slot, else 0). */
static int rd_u32(task_t *t, size_t off, uint32_t *out, kres_t *r) {
    off += t->lead;
    if (off + 4 > t->args_size) {
        kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION, "%s: args too short (%zu bytes, needs %zu)",
               KERNEL_NAMES[t->kernel], t->args_size, off + 4);
        return 0;
    }
    memcpy(out, t->args + off, 4);
    return 1;
}

static int rd_u64(task_t *t, size_t off, uint64_t *out, kres_t *r) {
    off += t->lead;
    if (off + 8 > t->args_size) {
        kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION, "%s: args too short (%zu bytes, needs %zu)",
               KERNEL_NAMES[t->kernel], t->args_size, off + 8);
        return 0;
    }
    memcpy(out, t->args + off, 8);
    return 1;
}

static float *kfloats(task_t *t, uint64_t addr, uint64_t count, const char *what, kres_t *r) {
    if (r->state != KS_FAULT && count > (1ull << 40)) {
        kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION, "%s: %s has an absurd size", KERNEL_NAMES[t->kernel], what);
        return NULL;
    }
    if (r->state == KS_FAULT) return NULL;
    unsigned char *p = kaddr(t, addr, count * 4);
    if (!p && count) {
        kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION,
               "%s: illegal address %s=0x%llx for %llu bytes", KERNEL_NAMES[t->kernel], what,
               (unsigned long long)addr, (unsigned long long)(count * 4));
        return NULL;
    }
    return (float *)(void *)p;
}

static void run_kernel(task_t *t, uint64_t now, kres_t *r) {
    uint64_t x, y, z, slot;
    uint32_t n, u;
    float a;
    r->state = KS_DONE;
    switch (t->kernel) {
    case KN_VECTOR_ADD: {
        if (!rd_u64(t, 0, &x, r) || !rd_u64(t, 8, &y, r) || !rd_u64(t, 16, &z, r) || !rd_u32(t, 24, &n, r)) return;
        float *px = kfloats(t, x, n, "x", r);
        float *py = kfloats(t, y, n, "y", r);
        float *pz = kfloats(t, z, n, "z", r);
        if (r->state == KS_FAULT) return;
        for (uint32_t i = 0; i < n; i++) pz[i] = px[i] + py[i];
        return;
    }
    case KN_AXPY: {
        if (!rd_u64(t, 0, &x, r) || !rd_u64(t, 8, &y, r) || !rd_u32(t, 16, &u, r) || !rd_u32(t, 20, &n, r)) return;
        memcpy(&a, &u, 4);
        float *px = kfloats(t, x, n, "x", r);
        float *py = kfloats(t, y, n, "y", r);
        if (r->state == KS_FAULT) return;
        for (uint32_t i = 0; i < n; i++) py[i] = a * px[i] + py[i];
        return;
    }
    case KN_SCALE: {
        if (!rd_u64(t, 0, &x, r) || !rd_u64(t, 8, &y, r) || !rd_u64(t, 16, &slot, r)) return;
        unsigned char *tiling = kaddr(t, slot, 8);
        if (!tiling) {
            kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION, "scale: illegal tiling address 0x%llx",
                   (unsigned long long)slot);
            return;
        }
        memcpy(&n, tiling, 4);
        memcpy(&a, tiling + 4, 4);
        float *px = kfloats(t, x, n, "x", r);
        float *py = kfloats(t, y, n, "y", r);
        if (r->state == KS_FAULT) return;
        for (uint32_t i = 0; i < n; i++) py[i] = a * px[i];
        return;
    }
    case KN_MATMUL: {
        uint64_t pa, pb, pc;
        uint32_t m, k;
        if (!rd_u64(t, 0, &pa, r) || !rd_u64(t, 8, &pb, r) || !rd_u64(t, 16, &pc, r) || !rd_u64(t, 24, &slot, r)) return;
        unsigned char *tiling = kaddr(t, slot, 12);
        if (!tiling) {
            kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION, "matmul: illegal tiling address 0x%llx",
                   (unsigned long long)slot);
            return;
        }
        memcpy(&m, tiling, 4);
        memcpy(&n, tiling + 4, 4);
        memcpy(&k, tiling + 8, 4);
        float *A = kfloats(t, pa, (uint64_t)m * k, "a", r);
        float *B = kfloats(t, pb, (uint64_t)k * n, "b", r);
        float *C = kfloats(t, pc, (uint64_t)m * n, "c", r);
        if (r->state == KS_FAULT) return;
        for (uint32_t i = 0; i < m; i++)
            for (uint32_t j = 0; j < n; j++) {
                float acc = 0.0f;
                for (uint32_t q = 0; q < k; q++) acc += A[(uint64_t)i * k + q] * B[(uint64_t)q * n + j];
                C[(uint64_t)i * n + j] = acc;
            }
        return;
    }
    case KN_SLEEP:
        if (!rd_u32(t, 0, &u, r)) return;
        if (t->args_size >= 16) { /* sleep(us, buffer): it uses the buffer until it ends */
            uint64_t buffer;
            if (!rd_u64(t, 8, &buffer, r)) return;
            if (buffer) (void)kaddr(t, buffer, 4);
        }
        r->state = KS_SLEEP;
        r->until_ns = now + (uint64_t)u * 1000ull;
        return;
    case KN_FAULT:
        if (!rd_u32(t, 0, &u, r)) return;
        kfault(r, u ? (aclError)u : ACL_ERROR_RT_AICORE_EXCEPTION,
               "fault kernel raised code %d on the device", u ? (int)u : ACL_ERROR_RT_AICORE_EXCEPTION);
        return;
    case KN_HANG:
        r->state = KS_HANG;
        return;
    case KN_MIX_ADD: {
        /* a MIX (cube + vector) kernel as the Ascend C compiler builds it for A2/A3: the FFTS
           sync address in slot 0 (unless it carries its own g_sysFftsAddr: no slot), the user
           parameters, the overflow address in the next 8-aligned slot (cann-support.md §4.2).
           It refuses to run without them. */
        uint64_t ffts = FFTS_ADDR, overflow;
        if (t->lead) {
            if (t->args_size < 8) {
                kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION, "mix_add: args too short for the sync slot");
                return;
            }
            memcpy(&ffts, t->args, 8);
        }
        if (!rd_u64(t, 0, &x, r) || !rd_u64(t, 8, &y, r) || !rd_u64(t, 16, &z, r) || !rd_u32(t, 24, &n, r) ||
            !rd_u64(t, 32, &overflow, r))
            return;
        if (ffts != FFTS_ADDR) {
            kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION,
                   "mix_add: slot 0 holds 0x%llx, not the inter-core sync address 0x%llx",
                   (unsigned long long)ffts, (unsigned long long)FFTS_ADDR);
            return;
        }
        if (overflow != t->overflow) {
            kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION,
                   "mix_add: the overflow slot (offset %zu) holds 0x%llx, not the context's overflow "
                   "address 0x%llx", t->lead + 32, (unsigned long long)overflow,
                   (unsigned long long)t->overflow);
            return;
        }
        float *px = kfloats(t, x, n, "x", r);
        float *py = kfloats(t, y, n, "y", r);
        float *pz = kfloats(t, z, n, "z", r);
        if (r->state == KS_FAULT) return;
        for (uint32_t i = 0; i < n; i++) pz[i] = px[i] + py[i];
        return;
    }
    default:
        return; /* noop */
    }
}

static void run_copy(task_t *t, kres_t *r) {
    unsigned char *dst, *src;
    r->state = KS_DONE;
    if (!t->count) return;
    if (t->copy_kind == ACL_MEMCPY_HOST_TO_DEVICE) {
        dst = dev_range(t->dst, t->count);
        if (!t->pageable) {
            halloc_t *h = host_find(t->src);
            if (!h || t->count > h->size - (t->src - (uint64_t)(uintptr_t)h->ptr)) {
                kfault(r, ACL_ERROR_RT_DEVICE_MEM_ERROR,
                       "memcpy: pinned source 0x%llx was freed before the copy executed",
                       (unsigned long long)t->src);
                return;
            }
        }
        src = (unsigned char *)(uintptr_t)t->src;
    } else if (t->copy_kind == ACL_MEMCPY_DEVICE_TO_HOST) {
        src = dev_range(t->src, t->count);
        if (!t->pageable) {
            halloc_t *h = host_find(t->dst);
            if (!h || t->count > h->size - (t->dst - (uint64_t)(uintptr_t)h->ptr)) {
                kfault(r, ACL_ERROR_RT_DEVICE_MEM_ERROR,
                       "memcpy: pinned destination 0x%llx was freed before the copy executed",
                       (unsigned long long)t->dst);
                return;
            }
        }
        dst = (unsigned char *)(uintptr_t)t->dst;
    } else {
        dst = dev_range(t->dst, t->count);
        src = dev_range(t->src, t->count);
    }
    if (!dst || !src) {
        kfault(r, ACL_ERROR_RT_DEVICE_MEM_ERROR,
               "memcpy: device memory (dst=0x%llx src=0x%llx, %zu bytes) was freed before the copy executed",
               (unsigned long long)t->dst, (unsigned long long)t->src, t->count);
        return;
    }
    memmove(dst, src, t->count);
}

static void run_memset(task_t *t, kres_t *r) {
    r->state = KS_DONE;
    if (!t->count) return;
    unsigned char *dst = dev_range(t->dst, t->count);
    if (!dst) {
        kfault(r, ACL_ERROR_RT_DEVICE_MEM_ERROR,
               "memset: device memory 0x%llx..+%zu is not inside one live allocation (freed, or "
               "never allocated)",
               (unsigned long long)t->dst, t->count);
        return;
    }
    memset(dst, t->fill, t->count);
}

/* ---- exception info (aclrtSetExceptionInfoCallback) ------------------------------------------ */

/* what the runtime hands an exception callback: rtExceptionInfo's fields (cann-support.md §7) */
typedef struct aclrtExceptionInfo {
    uint32_t taskid, streamid, tid, deviceid, retcode;
    void *func;
    uint64_t dev_args;
    uint32_t args_len;
} aclrtExceptionInfo;
typedef void (*aclrtExceptionInfoCallback)(aclrtExceptionInfo *exceptionInfo);
static aclrtExceptionInfoCallback g_exc_cb;

/* A task failed on the device: call the exception callback inline, on the device thread, before
   the fault is visible to queries (TaskFailCallBackManager::Notify calls callbacks inline in the
   notifying thread; cann-support.md §7). The info is valid only during the call. g_mu is held:
   the callback must not call back into the runtime (the docs forbid it; the getters take no
   lock). */
static void note_exception(stream_t *s, task_t *t, aclError code) {
    if (!g_exc_cb && !g_exc_registered_n) return;
    /* the task id is the runtime's (flip << 16) | id of the task (CovertToFlipTaskId:
       hicann/runtime@681ef76:src/runtime/core/src/task/task_info/task_manager.cc:477-495, 729-744),
       not its index on the stream */
    aclrtExceptionInfo info = {
        t->rt_id, (uint32_t)s->id, 0u, (uint32_t)s->ctx->device, (uint32_t)code,
        t->kind == T_KERNEL ? t->func : NULL, t->kind == T_KERNEL ? t->dev_args : 0,
        t->kind == T_KERNEL ? (uint32_t)t->args_size : 0u};
    if (g_exc_cb) g_exc_cb(&info);
    for (size_t i = 0; i < g_exc_registered_n; i++) g_exc_registered[i](&info);
}

/* ---- device args (aclrtLaunchKernel) --------------------------------------------------------- */

/* A device-args kernel starts: read its args from device memory now (they must be a live device
   allocation; the copy that fills them ran before it on the stream). 0: the kernel faulted. */
static int late_args_read(task_t *t, kres_t *r) {
    unsigned char *p = dev_range(t->dev_args, t->args_size);
    if (!p) {
        kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION,
               "%s: illegal args address 0x%llx (+%zu bytes): not inside one live device allocation",
               KERNEL_NAMES[t->kernel], (unsigned long long)t->dev_args, t->args_size);
        return 0;
    }
    free(t->args);
    t->args = malloc(t->args_size);
    if (!t->args) abort();
    memcpy(t->args, p, t->args_size);
    return 1;
}

/* A device-args kernel that ran for a while ends: a real kernel may read its args at any time
   while it runs, so args freed or overwritten meanwhile (a reused staging slot) fault it. */
static int late_args_intact(task_t *t, kres_t *r) {
    unsigned char *p = dev_range(t->dev_args, t->args_size);
    if (!p || memcmp(p, t->args, t->args_size) != 0) {
        kfault(r, ACL_ERROR_RT_AICORE_EXCEPTION,
               "%s: its args at 0x%llx were %s while the kernel ran", KERNEL_NAMES[t->kernel],
               (unsigned long long)t->dev_args, p ? "overwritten" : "freed");
        return 0;
    }
    return 1;
}

/* ---- the device thread --------------------------------------------------------------------- */

/* Try to finish the head task of s. Returns 1 when it completed. */
static int step(stream_t *s, task_t *t, uint64_t now, uint64_t *next_deadline) {
    kres_t r;
    memset(&r, 0, sizeof r);
    switch (t->kind) {
    case T_RECORD:
        if (t->event->gen == t->gen) {
            t->event->timestamp_ns = now;
            t->event->ts_gen = t->gen;
        }
        return 1;
    case T_WAIT:
        /* a record a forced destroy dropped never runs, so a wait on it waits for good: the
           pinned runtime over tests/realrt's driver keeps such a wait (and what follows it)
           pending, 2 s and more (tests/runtime/test_acl_faults.py,
           test_a_wait_on_a_record_a_forced_destroy_dropped_never_passes) */
        return !t->wait_stream || t->wait_stream->completed >= t->wait_seq;
    case T_COPY:
        run_copy(t, &r);
        break;
    case T_MEMSET:
        run_memset(t, &r);
        break;
    case T_MODEL:
        /* one stream task running the model's recorded tasks in order, each on a fresh copy
           (a kernel's args as copied at capture; a pinned copy reads its host side now) */
        for (;;) {
            if (!t->cur) {
                if (!t->next_rec) return 1;
                task_t *c = malloc(sizeof *c);
                if (!c) abort();
                *c = *t->next_rec;
                c->next = NULL;
                c->seq = t->seq;
                if (c->args) {
                    c->args = malloc(c->args_size);
                    if (!c->args) abort();
                    memcpy(c->args, t->next_rec->args, c->args_size);
                }
                t->cur = c;
                t->next_rec = t->next_rec->next;
            }
            if (!step(s, t->cur, now, next_deadline)) return 0;
            task_free(t->cur);
            t->cur = NULL;
            if (s->ctx->fault_code || s->ctx->unread_code) return 0; /* stop-on-failure */
        }
    case T_KERNEL:
        if (t->started) {
            if (t->times_out && now >= t->until_ns) { /* the kernel timeout of its cfg ran out */
                kfault(&r, ACL_ERROR_RT_AICORE_TIMEOUT, "%s: the kernel ran past its timeout of %llu us",
                       KERNEL_NAMES[t->kernel], (unsigned long long)(t->timeout_ns / 1000ull));
                break;
            }
            if (t->until_ns == UINT64_MAX) return 0; /* hang */
            if (now >= t->until_ns) {
                if (t->late_args && !late_args_intact(t, &r)) break;
                check_touched(t);
                return 1;
            }
            if (t->until_ns < *next_deadline) *next_deadline = t->until_ns;
            return 0;
        }
        t->started = 1;
        g_starting = t;
        if (t->late_args && !late_args_read(t, &r)) {
            g_starting = NULL;
            break;
        }
        run_kernel(t, now, &r);
        g_starting = NULL;
        if (r.state == KS_HANG || r.state == KS_SLEEP) {
            t->until_ns = r.state == KS_HANG ? UINT64_MAX : r.until_ns;
            if (t->timeout_ns && t->until_ns - now > t->timeout_ns) {
                t->until_ns = now + t->timeout_ns; /* it will time out */
                t->times_out = 1;
            }
            if (now >= t->until_ns && !t->times_out) return 1;
            if (t->until_ns < *next_deadline) *next_deadline = t->until_ns;
            return 0;
        }
        break;
    }
    if (r.state == KS_FAULT) {
        note_exception(s, t, r.code);
        if (s->mode == ACL_STOP_ON_FAILURE && g_unread_faults) {
            if (!s->ctx->fault_code && !s->ctx->unread_code) {
                s->ctx->unread_code = r.code;
                snprintf(s->ctx->unread_msg, sizeof s->ctx->unread_msg,
                         "[acl double] device fault %d: %s", r.code, r.msg);
            }
            return 0; /* the queue stops at the failed task until a synchronize reads it */
        }
        if (s->mode == ACL_STOP_ON_FAILURE) {
            if (!s->ctx->fault_code) {
                s->ctx->fault_code = r.code;
                snprintf(s->ctx->fault_msg, sizeof s->ctx->fault_msg, "[acl double] device fault %d: %s",
                         r.code, r.msg);
            }
        } else if (!s->pending_err) {
            s->pending_err = r.code;
        }
    }
    return 1;
}

static void *device_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_mu);
    while (!g_stop) {
        uint64_t now = now_ns(), next_deadline = UINT64_MAX;
        int progress = 0;
        for (stream_t *s = g_streams; s; s = s->next_all) {
            while (s->head && !s->ctx->fault_code && !s->ctx->unread_code) {
                task_t *t = s->head;
                if (!step(s, t, now, &next_deadline)) break;
                s->head = t->next;
                if (!s->head) s->tail = NULL;
                s->depth--;
                g_queued_tasks--;
                s->completed = t->seq;
                task_free(t);
                progress = 1;
            }
        }
        progress |= step_zombies(now, &next_deadline);
        if (progress) {
            pthread_cond_broadcast(&g_done_cv);
            continue;
        }
        cv_wait(&g_work_cv, next_deadline);
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

/* ---- event status -------------------------------------------------------------------------- */

/* 1 complete, 0 not ready, <0: -error (stream of the recording was aborted) */
static int event_done(const event_t *e) {
    if (!e->recorded) return 1;
    if (e->rec_stream->completed >= e->rec_seq) return 1;
    if (e->rec_stream->aborted) return -ACL_ERROR_RT_STREAM_ABORT;
    return 0;
}

/* What a capturing stream refuses, with ACL_ERROR_RT_STREAM_CAPTURED (107027) as the runtime does:
   a stream sync (hicann/runtime@681ef76:src/runtime/api/impl/api_error.cc:1446-1449), a model
   execution (api_error.cc:4056-4058), a second capture begin
   (src/runtime/feature/aclgraph/context_aclgraph.cc:292-296), a stream destroy (api_error.cc:1390-1392). */
static aclError capture_refusal(const char *what) {
    return fail(ACL_ERROR_RT_STREAM_CAPTURED, "stream is capturing (aclmdlRICaptureBegin): %s is not supported", what);
}

/* ================================ the ACL API ================================================ */

EXPORT aclError aclInit(const char *configPath) {
    ENTER("aclInit", 1, P(configPath));
    pthread_mutex_lock(&g_mu);
    if (g_initialized) LEAVE_UNLOCK(fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit was already called"));
    g_initialized = 1;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclFinalize(void) {
    ENTER("aclFinalize", 0, 0);
    pthread_mutex_lock(&g_mu);
    if (!g_initialized) LEAVE_UNLOCK(fail(ACL_ERROR_UNINITIALIZE, "aclInit was not called"));
    for (int d = 0; d < MAX_DEVICES; d++) reset_device_locked(d);
    g_initialized = 0;
    int running = g_device_thread_running;
    g_stop = 1;
    pthread_cond_broadcast(&g_work_cv);
    pthread_mutex_unlock(&g_mu);
    if (running) pthread_join(g_device_thread, NULL);
    pthread_mutex_lock(&g_mu);
    g_device_thread_running = 0;
    LEAVE_UNLOCK(0);
}

EXPORT const char *aclGetRecentErrMsg(void) {
    uint64_t args_[1] = {0};
    uint64_t log_index_ = log_call("aclGetRecentErrMsg", args_, 0);
    log_ret(log_index_, 0);
    if (!t_msg[0]) return NULL;
    memcpy(t_msg_out, t_msg, sizeof t_msg_out);
    t_msg[0] = 0;
    return t_msg_out;
}

EXPORT aclError aclrtGetDeviceCount(uint32_t *count) {
    ENTER("aclrtGetDeviceCount", 1, P(count));
    if (!count) LEAVE(fail(ACL_ERROR_INVALID_PARAM, "count is NULL"));
    pthread_mutex_lock(&g_mu);
    *count = (uint32_t)g_device_count;
    LEAVE_UNLOCK(0);
}

static uint64_t g_next_overflow = OVERFLOW_BASE;

static ctx_t *new_context(int device, int is_default) {
    ctx_t *c = calloc(1, sizeof *c);
    if (!c) abort();
    c->device = device;
    c->overflow_addr = g_next_overflow;
    g_next_overflow += 64;
    c->is_default = is_default;
    c->next = g_contexts;
    g_contexts = c;
    live_add(c, K_CTX);
    g_live_contexts++;
    return c;
}

EXPORT aclError aclrtSetDevice(int32_t deviceId) {
    ENTER("aclrtSetDevice", 1, I(deviceId));
    pthread_mutex_lock(&g_mu);
    if (!g_initialized) LEAVE_UNLOCK(fail(ACL_ERROR_UNINITIALIZE, "aclInit was not called"));
    if (deviceId < 0 || deviceId >= g_device_count || deviceId >= MAX_DEVICES)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_DEVICEID, "device %d does not exist (%d visible)",
                          deviceId, g_device_count));
    g_dev_refs[deviceId]++;
    if (!g_default_ctx[deviceId]) g_default_ctx[deviceId] = new_context(deviceId, 1);
    bind_thread_locked(g_default_ctx[deviceId]);
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtResetDevice(int32_t deviceId) {
    ENTER("aclrtResetDevice", 1, I(deviceId));
    pthread_mutex_lock(&g_mu);
    if (deviceId < 0 || deviceId >= g_device_count || deviceId >= MAX_DEVICES)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_DEVICEID, "device %d does not exist", deviceId));
    if (g_dev_refs[deviceId] > 0 && --g_dev_refs[deviceId] == 0) reset_device_locked(deviceId);
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId) {
    ENTER("aclrtCreateContext", 2, P(context), I(deviceId));
    pthread_mutex_lock(&g_mu);
    if (!g_initialized) LEAVE_UNLOCK(fail(ACL_ERROR_UNINITIALIZE, "aclInit was not called"));
    if (!context) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "context is NULL"));
    if (deviceId < 0 || deviceId >= g_device_count || deviceId >= MAX_DEVICES)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_DEVICEID, "device %d does not exist", deviceId));
    ctx_t *c = new_context(deviceId, 0);
    bind_thread_locked(c);
    *context = c;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtDestroyContext(aclrtContext context) {
    ENTER("aclrtDestroyContext", 1, P(context));
    pthread_mutex_lock(&g_mu);
    if (!live_is(context, K_CTX)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "context %p is not live", context));
    destroy_context_locked(context);
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtSetCurrentContext(aclrtContext context) {
    ENTER("aclrtSetCurrentContext", 1, P(context));
    pthread_mutex_lock(&g_mu);
    if (!context) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "context is NULL"));
    if (!live_is(context, K_CTX)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "context %p is not live", context));
    bind_thread_locked(context);
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtGetCurrentContext(aclrtContext *context) {
    ENTER("aclrtGetCurrentContext", 1, P(context));
    pthread_mutex_lock(&g_mu);
    if (!context) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "context is NULL"));
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    *context = c;
    LEAVE_UNLOCK(rc);
}

/* ---- streams ---- */

EXPORT aclError aclrtCreateStream(aclrtStream *stream) {
    ENTER("aclrtCreateStream", 1, P(stream));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!stream) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "stream is NULL"));
    stream_t *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->ctx = c;
    s->id = g_next_stream_id++;
    s->refs = 1;
    s->alive = 1;
    s->next_all = g_streams;
    g_streams = s;
    live_add(s, K_STREAM);
    g_live_streams++;
    *stream = s;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtSetStreamFailureMode(aclrtStream stream, uint64_t mode) {
    ENTER("aclrtSetStreamFailureMode", 2, P(stream), Z(mode));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if (mode > 1) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "mode %llu is not 0 or 1", (unsigned long long)mode));
    s->mode = mode;
    LEAVE_UNLOCK(0);
}

static aclError destroy_stream(void *stream, int force) {
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) return rc;
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) return rc;
    if (s->capture) return capture_refusal(force ? "aclrtDestroyStreamForce" : "aclrtDestroyStream");
    if (!force) {
        s->refs++;
        while (s->alive && s->completed < s->submitted && !s->ctx->fault_code) cv_wait(&g_done_cv, UINT64_MAX);
        int alive = s->alive;
        stream_unref(s);
        if (!alive) return 0; /* destroyed meanwhile (device reset) */
    } else {
        keep_running(s);
    }
    stream_kill(s);
    return 0;
}

EXPORT aclError aclrtDestroyStream(aclrtStream stream) {
    ENTER("aclrtDestroyStream", 1, P(stream));
    pthread_mutex_lock(&g_mu);
    LEAVE_UNLOCK(destroy_stream(stream, 0));
}

EXPORT aclError aclrtDestroyStreamForce(aclrtStream stream) {
    ENTER("aclrtDestroyStreamForce", 1, P(stream));
    pthread_mutex_lock(&g_mu);
    LEAVE_UNLOCK(destroy_stream(stream, 1));
}

EXPORT aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) {
    ENTER("aclrtSynchronizeStreamWithTimeout", 2, P(stream), I(timeout));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if (timeout == 0 || timeout < -1)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "timeout %d ms: must be -1 or > 0", timeout));
    if (s->capture) LEAVE_UNLOCK(capture_refusal("aclrtSynchronizeStreamWithTimeout"));
    uint64_t deadline = deadline_after_ms(timeout);
    s->refs++;
    s->callers++;
    for (;;) {
        read_unread_fault(c);
        if ((rc = ctx_fault(c))) break;
        if (s->completed >= s->submitted) {
            if (s->pending_err) {
                rc = fail(s->pending_err, "a task of this stream failed (continue-on-failure mode)");
                s->pending_err = 0;
            }
            break;
        }
        if (s->aborted || !s->alive) {
            rc = fail(ACL_ERROR_RT_STREAM_ABORT, "stream was destroyed while synchronizing");
            break;
        }
        if (now_ns() >= deadline) {
            rc = fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, "stream not idle after %d ms", timeout);
            break;
        }
        cv_wait(&g_done_cv, deadline);
    }
    s->callers--;
    stream_unref(s);
    LEAVE_UNLOCK(rc);
}

/* Never waits (hicann/runtime@681ef76): a NULL status is refused first
 * (src/acl/aclrt_impl/stream.cpp:170), a capturing stream next (api/impl/api_error.cc:1483), then
 * the context's failure (api/impl/api_impl.cc:1779); the answer is whether the stream's queue is
 * empty (core/src/stream/stream.cc:2119-2141: its pending count, or the SQ head against the
 * tail). A continue-on-failure stream whose failed task no synchronize has read answers NOT_READY:
 * a queue stopped at a failed SQE resumes only when the runtime says so
 * (engine/stars/stars_engine.cc:1398-1518; what the real runtime answered over our driver). A
 * NULL stream (the context's default stream on the runtime) is refused, as everywhere here. */
EXPORT aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status) {
    ENTER("aclrtStreamQuery", 2, P(stream), P(status));
    if (!status) LEAVE(fail(ACL_ERROR_INVALID_PARAM, "status is NULL"));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if (s->capture) LEAVE_UNLOCK(capture_refusal("aclrtStreamQuery"));
    if ((rc = ctx_fault(c))) LEAVE_UNLOCK(rc);
    int idle = s->completed >= s->submitted && !s->pending_err;
    *status = idle ? ACL_STREAM_STATUS_COMPLETE : ACL_STREAM_STATUS_NOT_READY;
    LEAVE_UNLOCK(0);
}

/* ---- events ---- */

EXPORT aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag) {
    ENTER("aclrtCreateEventExWithFlag", 2, P(event), Z(flag));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!event) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "event is NULL"));
    if (flag & ~(ACL_EVENT_SYNC | ACL_EVENT_CAPTURE_STREAM_PROGRESS | ACL_EVENT_TIME_LINE | ACL_EVENT_DEVICE_USE_ONLY))
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "unsupported event flag 0x%x", flag));
    event_t *e = calloc(1, sizeof *e);
    if (!e) abort();
    e->ctx = c;
    e->flags = flag;
    e->refs = 1;
    e->alive = 1;
    live_add(e, K_EVENT);
    g_live_events++;
    *event = e;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtDestroyEvent(aclrtEvent event) {
    ENTER("aclrtDestroyEvent", 1, P(event));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    event_t *e = need_event(event, &rc);
    if (!e) LEAVE_UNLOCK(rc);
    event_kill(e);
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
    ENTER("aclrtRecordEvent", 2, P(event), P(stream));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    event_t *e = need_event(event, &rc);
    if (!e) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if (e->ctx != c) LEAVE_UNLOCK(fail(ACL_ERROR_RT_STREAM_CONTEXT, "event belongs to another context"));
    if ((rc = ctx_fault(c))) LEAVE_UNLOCK(rc);
    task_t *t = calloc(1, sizeof *t);
    if (!t) abort();
    t->kind = T_RECORD;
    t->event = e;
    e->refs++;
    if (s->capture) {
        /* A record on a capturing stream is captured, not refused: it becomes a task of the model
           (hicann/runtime@681ef76:src/runtime/api/impl/api_impl.cc:2150-2160 checks the capture
           only for the external-record flag); it records the event when the model runs. */
        t->gen = e->gen;
        LEAVE_UNLOCK(enqueue(s, t));
    }
    t->gen = e->gen + 1;
    if ((rc = enqueue(s, t))) LEAVE_UNLOCK(rc);
    e->gen = t->gen;
    e->recorded = 1;
    s->refs++;
    if (e->rec_stream) stream_unref(e->rec_stream);
    e->rec_stream = s;
    e->rec_seq = t->seq;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status) {
    ENTER("aclrtQueryEventStatus", 2, P(event), P(status));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    event_t *e = need_event(event, &rc);
    if (!e) LEAVE_UNLOCK(rc);
    if (!status) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "status is NULL"));
    if ((rc = ctx_fault(e->ctx))) LEAVE_UNLOCK(rc);
    int done = event_done(e);
    if (done < 0) LEAVE_UNLOCK(fail(-done, "the stream the event was recorded on was destroyed"));
    *status = done ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout) {
    ENTER("aclrtSynchronizeEventWithTimeout", 2, P(event), I(timeout));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    event_t *e = need_event(event, &rc);
    if (!e) LEAVE_UNLOCK(rc);
    if (timeout == 0 || timeout < -1)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "timeout %d ms: must be -1 or > 0", timeout));
    uint64_t deadline = deadline_after_ms(timeout);
    e->refs++;
    for (;;) {
        if ((rc = ctx_fault(e->ctx))) break;
        if (!e->alive) {
            rc = fail(ACL_ERROR_RT_INVALID_HANDLE, "event destroyed while synchronizing");
            break;
        }
        int done = event_done(e);
        if (done < 0) {
            rc = fail(-done, "the stream the event was recorded on was destroyed");
            break;
        }
        if (done) break;
        if (now_ns() >= deadline) {
            rc = fail(ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, "event not complete after %d ms", timeout);
            break;
        }
        cv_wait(&g_done_cv, deadline);
    }
    event_unref(e);
    LEAVE_UNLOCK(rc);
}

EXPORT aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
    ENTER("aclrtStreamWaitEvent", 2, P(stream), P(event));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    event_t *e = need_event(event, &rc);
    if (!e) LEAVE_UNLOCK(rc);
    /* a wait on a capturing stream is captured like any task (api_impl.cc:1605-1620 checks the
       capture only for the external-wait flag) */
    if ((rc = ctx_fault(c))) LEAVE_UNLOCK(rc);
    task_t *t = calloc(1, sizeof *t);
    if (!t) abort();
    t->kind = T_WAIT;
    if (e->recorded) {
        t->wait_stream = e->rec_stream;
        t->wait_stream->refs++;
        t->wait_seq = e->rec_seq;
    }
    LEAVE_UNLOCK(enqueue(s, t));
}

EXPORT aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent) {
    ENTER("aclrtEventElapsedTime", 3, P(ms), P(startEvent), P(endEvent));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!ms) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "ms is NULL"));
    event_t *a = need_event(startEvent, &rc), *b;
    if (!a) LEAVE_UNLOCK(rc);
    if (!(b = need_event(endEvent, &rc))) LEAVE_UNLOCK(rc);
    if (!(a->flags & ACL_EVENT_TIME_LINE) || !(b->flags & ACL_EVENT_TIME_LINE))
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "both events need ACL_EVENT_TIME_LINE"));
    if (!a->recorded || !b->recorded || event_done(a) != 1 || event_done(b) != 1 ||
        a->ts_gen != a->gen || b->ts_gen != b->gen)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "both events must be recorded and complete"));
    *ms = (float)(((double)b->timestamp_ns - (double)a->timestamp_ns) / 1e6);
    LEAVE_UNLOCK(0);
}

/* ---- memory ---- */

EXPORT aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    ENTER("aclrtMalloc", 3, P(devPtr), Z(size), I(policy));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!devPtr) LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "devPtr is NULL"));
    if (size == 0) LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "size must be > 0"));
    /* the runtime adds 32 + the SoC's padding (32) before aligning, and refuses a size that
     * overflows: src/acl/aclrt_impl/memory.cpp:297-302 (GetAlignedAndPaddingSize) */
    if (size > SIZE_MAX - 64) LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "size too large: %zu", size));
    uint64_t free_bytes = g_mem_total > g_dev_used[c->device] ? g_mem_total - g_dev_used[c->device] : 0;
    if (size > free_bytes || rounded64(size) > free_bytes)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "cannot allocate %zu bytes: %llu of %llu bytes free", size,
                          (unsigned long long)free_bytes, (unsigned long long)g_mem_total));
    size_t rounded = rounded64(size);
    unsigned char *host = NULL;
    if (posix_memalign((void **)&host, 64, rounded)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of memory"));
    memset(host, 0, rounded);
    if (g_ndallocs == g_dallocs_cap) {
        size_t cap = g_dallocs_cap ? g_dallocs_cap * 2 : 64;
        dalloc_t *grown = realloc(g_dallocs, cap * sizeof *grown);
        if (!grown) abort();
        g_dallocs = grown;
        g_dallocs_cap = cap;
    }
    uint64_t dev = g_next_dev;
    g_next_dev += rounded + 4096; /* a guard gap: overruns hit unmapped addresses */
    g_dallocs[g_ndallocs++] = (dalloc_t){dev, size, host, c->device};
    g_dev_used[c->device] += rounded;
    *devPtr = (void *)(uintptr_t)dev;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtFree(void *devPtr) {
    ENTER("aclrtFree", 1, P(devPtr));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    uint64_t addr = (uint64_t)(uintptr_t)devPtr;
    for (size_t i = 0; i < g_ndallocs; i++) {
        if (g_dallocs[i].dev == addr) {
            check_free_under_running(addr);
            g_dev_used[g_dallocs[i].device] -= rounded64(g_dallocs[i].size);
            free(g_dallocs[i].host);
            g_dallocs[i] = g_dallocs[--g_ndallocs];
            g_freed_dev[g_freed_dev_n++ % FREED_RING] = addr;
            LEAVE_UNLOCK(0);
        }
    }
    if (ring_has(g_freed_dev, g_freed_dev_n, addr))
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "double free of device memory 0x%llx", (unsigned long long)addr));
    LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "0x%llx is not the start of a device allocation", (unsigned long long)addr));
}

EXPORT aclError aclrtMallocHost(void **hostPtr, size_t size) {
    ENTER("aclrtMallocHost", 2, P(hostPtr), Z(size));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!hostPtr) LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "hostPtr is NULL"));
    if (size == 0) LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "size must be > 0"));
    if (size > ((size_t)1 << 36)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "cannot allocate %zu bytes", size));
    unsigned char *p = NULL;
    if (posix_memalign((void **)&p, 64, (size + 63) & ~(size_t)63))
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of memory"));
    memset(p, 0, size);
    if (g_nhallocs == g_hallocs_cap) {
        size_t cap = g_hallocs_cap ? g_hallocs_cap * 2 : 64;
        halloc_t *grown = realloc(g_hallocs, cap * sizeof *grown);
        if (!grown) abort();
        g_hallocs = grown;
        g_hallocs_cap = cap;
    }
    g_hallocs[g_nhallocs++] = (halloc_t){p, size};
    *hostPtr = p;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtFreeHost(void *hostPtr) {
    ENTER("aclrtFreeHost", 1, P(hostPtr));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    for (size_t i = 0; i < g_nhallocs; i++) {
        if (g_hallocs[i].ptr == hostPtr) {
            free(g_hallocs[i].ptr);
            g_hallocs[i] = g_hallocs[--g_nhallocs];
            g_freed_host[g_freed_host_n++ % FREED_RING] = P(hostPtr);
            LEAVE_UNLOCK(0);
        }
    }
    if (ring_has(g_freed_host, g_freed_host_n, P(hostPtr)))
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "double free of pinned host memory %p", hostPtr));
    LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "%p was not allocated by aclrtMallocHost", hostPtr));
}

/* 1 pinned, 0 pageable, -1 straddles the end of a pinned allocation */
static int host_kind(uint64_t addr, size_t count) {
    halloc_t *h = host_find(addr);
    if (!h) return 0;
    return count <= h->size - (addr - (uint64_t)(uintptr_t)h->ptr) ? 1 : -1;
}

EXPORT aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                                 aclrtMemcpyKind kind, aclrtStream stream) {
    ENTER("aclrtMemcpyAsync", 6, P(dst), Z(destMax), P(src), Z(count), I(kind), P(stream));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if (!dst || !src) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "dst or src is NULL"));
    if (count > destMax) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "count %zu > destMax %zu", count, destMax));
    uint64_t d = P(dst), sr = P(src);
    int pageable = 0;
    switch (kind) {
    case ACL_MEMCPY_HOST_TO_DEVICE: {
        if (count && !dev_range(d, count))
            LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "dst 0x%llx..+%zu is not device memory", (unsigned long long)d, count));
        int hk = host_kind(sr, count);
        if (hk < 0) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "src runs past its pinned allocation"));
        pageable = !hk;
        break;
    }
    case ACL_MEMCPY_DEVICE_TO_HOST: {
        if (count && !dev_range(sr, count))
            LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "src 0x%llx..+%zu is not device memory", (unsigned long long)sr, count));
        int hk = host_kind(d, count);
        if (hk < 0) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "dst runs past its pinned allocation"));
        pageable = !hk;
        break;
    }
    case ACL_MEMCPY_DEVICE_TO_DEVICE:
        if (count && (!dev_range(d, count) || !dev_range(sr, count)))
            LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "device-to-device copy outside device memory"));
        break;
    default:
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "memcpy kind %d is not supported asynchronously", (int)kind));
    }
    if (pageable && s->capture)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID,
                          "stream is capturing: a copy from or to pageable host memory cannot be captured"));
    if ((rc = ctx_fault(c))) LEAVE_UNLOCK(rc);
    task_t *t = calloc(1, sizeof *t);
    if (!t) abort();
    t->kind = T_COPY;
    t->copy_kind = kind;
    t->pageable = pageable;
    t->dst = d;
    t->src = sr;
    t->count = count;
    if ((rc = enqueue(s, t))) LEAVE_UNLOCK(rc);
    if (pageable) {
        /* pageable host memory: the call returns only after the copy was performed */
        uint64_t seq = s->submitted;
        s->refs++;
        for (;;) {
            if ((rc = ctx_fault(c))) break;
            if (s->completed >= seq) break;
            if (s->aborted || !s->alive) {
                rc = fail(ACL_ERROR_RT_STREAM_ABORT, "stream destroyed during a pageable copy");
                break;
            }
            cv_wait(&g_done_cv, UINT64_MAX);
        }
        stream_unref(s);
    }
    LEAVE_UNLOCK(rc);
}

/* ---- stream attributes, memset, device information (absent from a -DACL_DOUBLE_LEGACY build) ---- */

/* the last aclrtSetStreamAttribute, as it crossed the boundary */
static struct {
    int valid;
    int attr;
    int value_null;
    unsigned char value[sizeof(aclrtStreamAttrValue)];
} g_last_attr;

#if !defined(ACL_DOUBLE_LEGACY) && HAS_83

EXPORT aclError aclrtSetStreamAttribute(aclrtStream stream, aclrtStreamAttr stmAttrType, aclrtStreamAttrValue *value) {
    ENTER("aclrtSetStreamAttribute", 3, P(stream), I(stmAttrType), P(value));
    pthread_mutex_lock(&g_mu);
    g_last_attr.valid = 1;
    g_last_attr.attr = (int)stmAttrType;
    g_last_attr.value_null = value == NULL;
    if (value) memcpy(g_last_attr.value, value, sizeof g_last_attr.value);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if (!value) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "value is NULL"));
    switch (stmAttrType) {
    case ACL_STREAM_ATTR_FAILURE_MODE:
        if (value->failureMode > 1)
            LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "failureMode %llu is not 0 or 1",
                              (unsigned long long)value->failureMode));
        s->mode = value->failureMode;
        break;
    case ACL_STREAM_ATTR_FLOAT_OVERFLOW_CHECK:
    case ACL_STREAM_ATTR_USER_CUSTOM_TAG:
    case ACL_STREAM_ATTR_CACHE_OP_INFO:
        break; /* accepted, not modelled */
    case ACL_STREAM_ATTR_PRIORITY:
        if (!HAS_91) /* not in the 8.5.0 / 9.0.0 headers (cann-support.md row 42) */
            LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "unknown stream attribute %d", (int)stmAttrType));
        if (value->streamPriority > STREAM_PRIORITY_LEAST)
            LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "streamPriority %u is out of range %d..%d",
                              value->streamPriority, STREAM_PRIORITY_GREATEST, STREAM_PRIORITY_LEAST));
        s->priority = value->streamPriority;
        break;
    default:
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "unknown stream attribute %d", (int)stmAttrType));
    }
    LEAVE_UNLOCK(0);
}
#endif

#if !defined(ACL_DOUBLE_LEGACY) && HAS_85
EXPORT aclError aclrtDeviceGetStreamPriorityRange(int32_t *leastPriority, int32_t *greatestPriority) {
    ENTER("aclrtDeviceGetStreamPriorityRange", 2, P(leastPriority), P(greatestPriority));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!leastPriority || !greatestPriority)
        LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "leastPriority or greatestPriority is NULL"));
    *leastPriority = STREAM_PRIORITY_LEAST;
    *greatestPriority = STREAM_PRIORITY_GREATEST;
    LEAVE_UNLOCK(0);
}
#endif

#ifndef ACL_DOUBLE_LEGACY
EXPORT aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream) {
    ENTER("aclrtMemsetAsync", 5, P(devPtr), Z(maxCount), I(value), Z(count), P(stream));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if (!devPtr) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "devPtr is NULL"));
    if (count > maxCount) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "count %zu > maxCount %zu", count, maxCount));
    if ((rc = ctx_fault(c))) LEAVE_UNLOCK(rc);
    task_t *t = calloc(1, sizeof *t);
    if (!t) abort();
    t->kind = T_MEMSET;
    t->dst = P(devPtr);
    t->count = count;
    t->fill = (unsigned char)value;
    LEAVE_UNLOCK(enqueue(s, t));
}
#endif

#if !defined(ACL_DOUBLE_LEGACY) && HAS_85
EXPORT aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion) {
    ENTER("aclrtGetVersion", 3, P(majorVersion), P(minorVersion), P(patchVersion));
    if (!majorVersion || !minorVersion || !patchVersion)
        LEAVE(fail(ACL_ERROR_INVALID_PARAM, "majorVersion, minorVersion or patchVersion is NULL"));
    *majorVersion = DOUBLE_VERSION_MAJOR;
    *minorVersion = DOUBLE_VERSION_MINOR;
    *patchVersion = DOUBLE_VERSION_PATCH;
    LEAVE(0);
}

EXPORT aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free_, size_t *total) {
    ENTER("aclrtGetMemInfo", 3, I(attr), P(free_), P(total));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!free_ || !total) LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "free or total is NULL"));
    switch (attr) {
    case ACL_HBM_MEM: {
        uint64_t used = g_dev_used[c->device];
        *total = (size_t)g_mem_total;
        *free_ = (size_t)(g_mem_total > used ? g_mem_total - used : 0);
        break;
    }
    case ACL_DDR_MEM:
        *free_ = *total = 0; /* the modelled SoC has no DDR device memory */
        break;
    default:
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "memory attribute %d is not modelled by the double "
                          "(ACL_DDR_MEM 0 and ACL_HBM_MEM 1 are)", (int)attr));
    }
    LEAVE_UNLOCK(0);
}
#endif

#ifndef ACL_DOUBLE_LEGACY
EXPORT const char *aclrtGetSocName(void) {
    uint64_t args_[1] = {0};
    uint64_t log_index_ = log_call("aclrtGetSocName", args_, 0);
    t_fn = "aclrtGetSocName";
    pthread_mutex_lock(&g_mu);
    int initialized = g_initialized;
    pthread_mutex_unlock(&g_mu);
    if (!initialized) {
        log_ret(log_index_, ACL_ERROR_UNINITIALIZE);
        fail(ACL_ERROR_UNINITIALIZE, "aclInit was not called");
        return NULL;
    }
    log_ret(log_index_, 0);
    return DOUBLE_SOC_NAME;
}

#endif /* ACL_DOUBLE_LEGACY */

/* ---- kernels ---- */

static int g_chip_a2a3 = 1; /* the modelled SoC is Atlas A2/A3 (CV separation, inter-core sync) */

/* Each built-in kernel's ELF metadata as far as the hidden arguments go: crossCoreSync (the
   function uses inter-core sync) and whether the ELF carries its own g_sysFftsAddr symbol
   (IsMetaFlagSupprotFfts). double_set_kernel_meta changes them for a test. */
static struct { int cross_core_sync; int own_ffts; } g_kernel_meta[KN_COUNT] = {
    [KN_MIX_ADD] = {1, 0},
};

/* Whether the runtime gives a function the inter-core sync slot (IsNeedSetFftsAddrInArg): the chip
   has FFTS+ (A2/A3 in the double), the ELF has no g_sysFftsAddr of its own, and the kernel is MIX
   or uses cross-core sync (hicann/runtime@681ef76:src/runtime/core/src/kernel/program.cc:1105-1118;
   a MIX kernel type here is what Magic2KernelAttrType makes of ELF_AICORE on A2/A3). Its overflow
   slot needs nothing: every non-CPU kernel has one (isSupportOverFlow_ defaults to true,
   src/runtime/core/inc/kernel/kernel.hpp:274; only CPU kernels clear it, program.cc:886). */
MAYBE_UNUSED static int needs_ffts(const func_t *f) {
    return g_chip_a2a3 && !g_kernel_meta[f->kernel].own_ffts &&
           (f->bin->kernel_type == KT_MIX || g_kernel_meta[f->kernel].cross_core_sync);
}

/* the leading system slot bytes of a function's args (GetToBeCalSystemParaNum, api_impl.cc:8399-8420) */
MAYBE_UNUSED static size_t kernel_lead(const func_t *f) { return needs_ffts(f) ? 8 : 0; }

EXPORT int double_set_kernel_meta(const char *name, int cross_core_sync, int own_ffts) {
    for (int k = 0; k < KN_COUNT; k++) {
        if (strcmp(KERNEL_NAMES[k], name) == 0) {
            pthread_mutex_lock(&g_mu);
            g_kernel_meta[k].cross_core_sync = cross_core_sync != 0;
            g_kernel_meta[k].own_ffts = own_ffts != 0;
            pthread_mutex_unlock(&g_mu);
            return 0;
        }
    }
    return -1;
}

MAYBE_UNUSED static aclError load_blob(const unsigned char *data, size_t length, int kernel_type, int lazy,
                          aclrtBinHandle *binHandle) {
    size_t magic = strlen(DOUBLE_BUILTINS_MAGIC);
    if (length < magic || memcmp(data, DOUBLE_BUILTINS_MAGIC, magic) != 0)
        return fail(ACL_ERROR_RT_PARAM_INVALID, "not a kernel binary this double understands (expected the %s marker)",
                    DOUBLE_BUILTINS_MAGIC);
    binary_t *b = calloc(1, sizeof *b);
    if (!b) abort();
    for (int k = 0; k < KN_COUNT; k++) {
        b->funcs[k].bin = b;
        b->funcs[k].kernel = k;
        b->has_func[k] = 1;
    }
    b->kernel_type = kernel_type;
    b->lazy = lazy;
    live_add(b, K_BIN);
    g_live_binaries++;
    *binHandle = b;
    return 0;
}

#define ACL_RT_BINARY_MAGIC_ELF_AICORE 0x43554245u
#define ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE 0x41415246u
#define ACL_RT_BINARY_MAGIC_ELF_CUBE_CORE 0x41494343u

/* the options of the last load, as they crossed the boundary */
static aclrtBinaryLoadOption g_last_load_opts[8];

MAYBE_UNUSED static void note_options(const aclrtBinaryLoadOptions *options) {
    g_last_load_options_null = options == NULL;
    g_last_load_options_num = options ? options->numOpt : 0;
    memset(g_last_load_opts, 0, sizeof g_last_load_opts);
    if (options && options->options) {
        size_t n = options->numOpt < 8 ? options->numOpt : 8;
        memcpy(g_last_load_opts, options->options, n * sizeof *g_last_load_opts);
    }
}

/* The chip's default kernel type without a magic: CUBE on CV-separated chips (A2/A3), else AICORE
   (runtime.cc GetDefaultKernelAttrType; cann-support.md §5.3). */
MAYBE_UNUSED static int default_kernel_type(void) { return g_chip_a2a3 ? KT_CUBE : KT_AICORE; }

/* Magic2KernelAttrType: ELF_AICORE means MIX on CV-separated chips. */
MAYBE_UNUSED static int magic_kernel_type(uint32_t magic) {
    switch (magic) {
    case ACL_RT_BINARY_MAGIC_ELF_AICORE: return g_chip_a2a3 ? KT_MIX : KT_AICORE;
    case ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE: return KT_VECTOR;
    case ACL_RT_BINARY_MAGIC_ELF_CUBE_CORE: return KT_CUBE;
    default: return -1;
    }
}

/* ParseLoadOptions (binary_loader.cc, cann-support.md §5.2): the kernel type and lazy flag, or an
   error. from_file: the magic option is refused; the JSON beside the file decides. */
MAYBE_UNUSED static aclError parse_options(const aclrtBinaryLoadOptions *options, int from_file, int *kernel_type, int *lazy) {
    *lazy = 0;
    if (!options) return 0;
    if (options->numOpt && !options->options) return fail(ACL_ERROR_RT_PARAM_INVALID, "options->options is NULL");
    for (size_t i = 0; i < options->numOpt; i++) {
        const aclrtBinaryLoadOption *o = &options->options[i];
        switch ((int)o->type) {
        case ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD:
            if (o->value.isLazyLoad > 1)
                return fail(ACL_ERROR_RT_PARAM_INVALID, "isLazyLoad %u is not 0 or 1", o->value.isLazyLoad);
            *lazy = (int)o->value.isLazyLoad;
            break;
        case ACL_RT_BINARY_LOAD_OPT_MAGIC:
            if (from_file)
                return fail(ACL_ERROR_RT_PARAM_INVALID, "RT_LOAD_BINARY_OPT_MAGIC does not support in load from file");
            if (magic_kernel_type(o->value.magic) < 0)
                return fail(ACL_ERROR_RT_PARAM_INVALID, "magic 0x%x is not ELF_AICORE, ELF_VECTOR_CORE or ELF_CUBE_CORE",
                            o->value.magic);
            *kernel_type = magic_kernel_type(o->value.magic);
            break;
        case ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE:
            if (from_file ? (o->value.cpuKernelMode != 0 && o->value.cpuKernelMode != 1) : o->value.cpuKernelMode != 2)
                return fail(ACL_ERROR_RT_PARAM_INVALID, "cpuKernelMode %d is invalid", o->value.cpuKernelMode);
            break;
        default:
            return fail(ACL_ERROR_RT_PARAM_INVALID, "unknown load option type %d", (int)o->type);
        }
    }
    return 0;
}

/* The kernel type the JSON beside a binary file gives ("<name>.json" for "<name>.o"): its "magic"
   (RT_DEV_BINARY_MAGIC_ELF[_AIVEC|_AICUBE], FFTS_BINARY_MAGIC_ELF_MIX_*) or "intercoreSync": 1;
   -1 without a JSON (jsonMagic > optionMagic > defaultMagic, cann-support.md §5.3). */
MAYBE_UNUSED static int json_kernel_type(const char *bin_path) {
    char path[4096];
    snprintf(path, sizeof path, "%s", bin_path);
    char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    if (dot && (!slash || dot > slash)) *dot = 0;
    if (strlen(path) + 6 > sizeof path) return -1;
    strcat(path, ".json");
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    if (strstr(text, "MIX") || strstr(text, "\"intercoreSync\": 1") || strstr(text, "\"intercoreSync\":1"))
        return KT_MIX;
    if (strstr(text, "RT_DEV_BINARY_MAGIC_ELF_AIVEC")) return KT_VECTOR;
    if (strstr(text, "RT_DEV_BINARY_MAGIC_ELF_AICUBE")) return KT_CUBE;
    if (strstr(text, "RT_DEV_BINARY_MAGIC_ELF")) return magic_kernel_type(ACL_RT_BINARY_MAGIC_ELF_AICORE);
    return -1;
}

#if HAS_83
EXPORT aclError aclrtBinaryLoadFromFile(const char *binPath, aclrtBinaryLoadOptions *options,
                                        aclrtBinHandle *binHandle) {
    ENTER("aclrtBinaryLoadFromFile", 3, P(binPath), P(options), P(binHandle));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!binPath || !binHandle) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "binPath or binHandle is NULL"));
    snprintf(g_last_load_path, sizeof g_last_load_path, "%s", binPath);
    note_options(options);
    int kernel_type = -1, lazy = 0;
    if ((rc = parse_options(options, 1, &kernel_type, &lazy))) LEAVE_UNLOCK(rc);
    if (binPath[0] != '/') LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "binPath must be absolute: %s", binPath));
    FILE *f = fopen(binPath, "rb");
    if (!f) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "cannot open %s: %s", binPath, strerror(errno)));
    unsigned char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    int from_json = json_kernel_type(binPath);
    kernel_type = from_json >= 0 ? from_json : default_kernel_type();
    LEAVE_UNLOCK(load_blob(buf, n, kernel_type, lazy, binHandle));
}

EXPORT aclError aclrtBinaryLoadFromData(const void *data, size_t length, const aclrtBinaryLoadOptions *options,
                                        aclrtBinHandle *binHandle) {
    ENTER("aclrtBinaryLoadFromData", 4, P(data), Z(length), P(options), P(binHandle));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!data || !binHandle) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "data or binHandle is NULL"));
    if (length == 0) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "length must be > 0"));
    g_last_load_path[0] = 0;
    note_options(options);
    int kernel_type = -1, lazy = 0;
    if ((rc = parse_options(options, 0, &kernel_type, &lazy))) LEAVE_UNLOCK(rc);
#if !HAS_85
    /* 8.2/8.3 document aclrtBinaryLoadFromData for AI CPU kernels only (pages 82RC1alpha003/1896,
       83RC1alpha001/1896; docs/cann-support.md §1.2 row 15); the double's kernels are AI Core
       kernels, so it refuses them (the code is the double's choice: no source of these releases
       says which one) */
    LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID,
                      "aclrtBinaryLoadFromData loads AI CPU kernels only in this release: load AI Core "
                      "kernels with aclrtBinaryLoadFromFile or aclrtCreateBinary + aclrtBinaryLoad"));
#endif
    if (kernel_type < 0) kernel_type = default_kernel_type();
    LEAVE_UNLOCK(load_blob(data, length, kernel_type, lazy, binHandle));
}
#endif

EXPORT aclError aclrtBinaryGetFunction(const aclrtBinHandle binHandle, const char *kernelName,
                                       aclrtFuncHandle *funcHandle) {
    ENTER("aclrtBinaryGetFunction", 3, P(binHandle), P(kernelName), P(funcHandle));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!live_is(binHandle, K_BIN)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "binary %p is not loaded", binHandle));
    if (!kernelName || !funcHandle) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "kernelName or funcHandle is NULL"));
    binary_t *b = binHandle;
    for (int k = 0; k < KN_COUNT; k++) {
        if (b->has_func[k] && strcmp(KERNEL_NAMES[k], kernelName) == 0) {
            if (!live_is(&b->funcs[k], K_FUNC)) live_add(&b->funcs[k], K_FUNC);
            *funcHandle = &b->funcs[k];
            LEAVE_UNLOCK(0);
        }
    }
    LEAVE_UNLOCK(fail(ACL_ERROR_RT_SYMBOL_NOT_FOUND, "kernel '%s' not found in the binary", kernelName));
}

EXPORT aclError aclrtBinaryUnLoad(aclrtBinHandle binHandle) {
    ENTER("aclrtBinaryUnLoad", 1, P(binHandle));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!live_is(binHandle, K_BIN)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "binary %p is not loaded", binHandle));
    binary_t *b = binHandle;
    for (int k = 0; k < KN_COUNT; k++) live_del(&b->funcs[k]);
    live_del(b);
    g_live_binaries--;
    free(b);
    LEAVE_UNLOCK(0);
}

/* Check a cfg like CANN (CheckKernelLaunchCfg); *timeout_ns: the kernel timeout it sets (0: none). */
static aclError check_cfg(const aclrtLaunchKernelCfg *cfg, uint64_t *timeout_ns) {
    *timeout_ns = 0;
    if (!cfg) return 0;
    if (!cfg->attrs) return fail(ACL_ERROR_RT_PARAM_INVALID, "cfg->attrs is NULL");
    if (cfg->numAttrs > 64) return fail(ACL_ERROR_RT_PARAM_INVALID, "cfg->numAttrs %zu is too large", cfg->numAttrs);
    int timeout = 0, timeout_us = 0;
    for (size_t i = 0; i < cfg->numAttrs; i++) {
        const aclrtLaunchKernelAttr *a = &cfg->attrs[i];
        switch (a->id) {
        case ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE:
            if (a->value.schemMode >= 2) return fail(ACL_ERROR_RT_PARAM_INVALID, "schemMode %u >= 2", a->value.schemMode);
            break;
        case ACL_RT_LAUNCH_KERNEL_ATTR_BLOCK_TASK_PREFETCH:
            if (a->value.isBlockTaskPrefetch > 1) return fail(ACL_ERROR_RT_PARAM_INVALID, "isBlockTaskPrefetch not 0/1");
            break;
        case ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP:
            if (a->value.isDataDump > 1) return fail(ACL_ERROR_RT_PARAM_INVALID, "isDataDump not 0/1");
            break;
        case ACL_RT_LAUNCH_KERNEL_ATTR_ENABLE_PROFILING:
            if (a->value.enableProfiling > 1) return fail(ACL_ERROR_RT_PARAM_INVALID, "enableProfiling not 0/1");
            break;
        case ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT:
            timeout = 1;
            *timeout_ns = (uint64_t)a->value.timeout * 1000000000ull; /* seconds, 0 = forever */
            break;
        case ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US:
            timeout_us = 1;
            *timeout_ns = (((uint64_t)a->value.timeoutUs.timeoutHigh << 32) | a->value.timeoutUs.timeoutLow) * 1000ull;
            break;
        case ACL_RT_LAUNCH_KERNEL_ATTR_DYN_UBUF_SIZE:
        case ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE:
        case ACL_RT_LAUNCH_KERNEL_ATTR_BLOCKDIM_OFFSET:
            break;
        default:
            return fail(ACL_ERROR_RT_PARAM_INVALID, "unknown launch attribute id %d", (int)a->id);
        }
    }
    if (timeout && timeout_us) return fail(ACL_ERROR_RT_PARAM_INVALID, "TIMEOUT and TIMEOUT_US are mutually exclusive");
    return 0;
}

/* Record a launch as it crossed the boundary, before any validation (path: 1 host args, 2 args handle). */
MAYBE_UNUSED static void note_launch(int path, const uint64_t *raw8, const aclrtLaunchKernelCfg *cfg, const void *args,
                        size_t argsSize, const aclrtPlaceHolderInfo *placeHolderArray, size_t placeHolderNum) {
    memset(&g_last, 0, offsetof(__typeof__(g_last), args_pre));
    g_last.valid = path;
    memcpy(g_last.raw, raw8, sizeof g_last.raw);
    g_last.cfg_null = cfg == NULL;
    if (cfg) {
        g_last.num_attrs = cfg->numAttrs;
        if (cfg->attrs) {
            size_t n = cfg->numAttrs < 64 ? cfg->numAttrs : 64;
            memcpy(g_last.attrs, cfg->attrs, n * sizeof(aclrtLaunchKernelAttr));
        }
    }
    g_last.num_ph = placeHolderNum;
    if (placeHolderArray) {
        size_t n = placeHolderNum < 256 ? placeHolderNum : 256;
        memcpy(g_last.ph, placeHolderArray, n * sizeof(aclrtPlaceHolderInfo));
    }
    g_last.args_size = argsSize;
    if (args && argsSize <= sizeof g_last.args_pre) memcpy(g_last.args_pre, args, argsSize);
}

/* The common launch: validate like CANN, patch placeholder device addresses into `args`, copy
   [0, argsSize) as the kernel's device args, queue the kernel. g_mu held. */
MAYBE_UNUSED static aclError launch_locked(aclrtFuncHandle funcHandle, uint32_t numBlocks, aclrtStream stream,
                              aclrtLaunchKernelCfg *cfg, void *hostArgs, size_t argsSize,
                              aclrtPlaceHolderInfo *placeHolderArray, size_t placeHolderNum) {
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) return rc;
    if (!live_is(funcHandle, K_FUNC)) return fail(ACL_ERROR_RT_INVALID_HANDLE, "function %p is not valid", funcHandle);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) return rc;
    if (!hostArgs) return fail(ACL_ERROR_RT_PARAM_INVALID, "hostArgs is NULL");
    if (argsSize == 0 || argsSize > 0xFFFFFFFFu)
        return fail(ACL_ERROR_RT_PARAM_INVALID, "argsSize %zu out of range 1..2**32-1", argsSize);
    if (numBlocks == 0 || numBlocks > 65535)
        return fail(ACL_ERROR_RT_PARAM_INVALID, "numBlocks %u out of range 1..65535", numBlocks);
    if (placeHolderNum && !placeHolderArray)
        return fail(ACL_ERROR_RT_PARAM_INVALID, "placeHolderArray is NULL with placeHolderNum %zu", placeHolderNum);
    for (size_t i = 0; i < placeHolderNum; i++) {
        uint64_t ao = placeHolderArray[i].addrOffset, dofs = placeHolderArray[i].dataOffset;
        if (ao + 8 > argsSize)
            return fail(ACL_ERROR_RT_PARAM_INVALID, "placeholder %zu: addrOffset %llu + 8 > argsSize %zu", i,
                        (unsigned long long)ao, argsSize);
        if (dofs >= argsSize)
            return fail(ACL_ERROR_RT_PARAM_INVALID, "placeholder %zu: dataOffset %llu >= argsSize %zu", i,
                        (unsigned long long)dofs, argsSize);
    }
    uint64_t timeout_ns = 0;
    if ((rc = check_cfg(cfg, &timeout_ns))) return rc;
    if ((rc = ctx_fault(c))) return rc;

    uint64_t dev_args = g_next_args;
    g_next_args += (argsSize + 63) & ~(uint64_t)63;
    for (size_t i = 0; i < placeHolderNum; i++) {
        uint64_t value = dev_args + placeHolderArray[i].dataOffset;
        memcpy((unsigned char *)hostArgs + placeHolderArray[i].addrOffset, &value, 8);
    }
    task_t *t = calloc(1, sizeof *t);
    if (!t) abort();
    t->args = malloc(argsSize);
    if (!t->args) abort();
    memcpy(t->args, hostArgs, argsSize);
    t->kind = T_KERNEL;
    t->kernel = ((func_t *)funcHandle)->kernel;
    t->func = funcHandle;
    t->blocks = numBlocks;
    t->args_size = argsSize;
    t->dev_args = dev_args;
    t->overflow = c->overflow_addr;
    t->lead = kernel_lead(funcHandle);
    t->timeout_ns = timeout_ns;
    g_last.dev_args = dev_args;
    if (argsSize <= sizeof g_last.args_post) memcpy(g_last.args_post, hostArgs, argsSize);
    return enqueue(s, t);
}

#if HAS_85
EXPORT aclError aclrtLaunchKernelWithHostArgs(aclrtFuncHandle funcHandle, uint32_t numBlocks, aclrtStream stream,
                                              aclrtLaunchKernelCfg *cfg, void *hostArgs, size_t argsSize,
                                              aclrtPlaceHolderInfo *placeHolderArray, size_t placeHolderNum) {
    ENTER("aclrtLaunchKernelWithHostArgs", 8, P(funcHandle), Z(numBlocks), P(stream), P(cfg), P(hostArgs),
          Z(argsSize), P(placeHolderArray), Z(placeHolderNum));
    pthread_mutex_lock(&g_mu);
    /* record what crossed the boundary, before any validation */
    note_launch(1, args_, cfg, hostArgs, argsSize, placeHolderArray, placeHolderNum);
    LEAVE_UNLOCK(launch_locked(funcHandle, numBlocks, stream, cfg, hostArgs, argsSize, placeHolderArray,
                               placeHolderNum));
}
#endif

/* ================================ control API for the tests =================================== */

EXPORT const char *double_builtins_magic(void) { return DOUBLE_BUILTINS_MAGIC; }
EXPORT uint64_t double_dev_base(void) { return DEV_BASE; }

EXPORT uint64_t double_log_count(void) {
    pthread_mutex_lock(&g_log_mu);
    uint64_t n = g_log_count;
    pthread_mutex_unlock(&g_log_mu);
    return n;
}

/* Entry i (0-based, global): name, up to 8 args, rc (-1 while running). 0 ok, -1 not retained. */
EXPORT int double_log_entry(uint64_t i, char *name, size_t name_len, uint64_t *args, int *nargs, int *rc) {
    pthread_mutex_lock(&g_log_mu);
    if (i >= g_log_count || g_log_count - i > LOG_CAP) {
        pthread_mutex_unlock(&g_log_mu);
        return -1;
    }
    log_entry_t *e = &g_log[i % LOG_CAP];
    snprintf(name, name_len, "%s", e->name);
    *nargs = e->nargs;
    *rc = e->rc;
    for (int k = 0; k < LOG_ARGS; k++) args[k] = k < e->nargs ? e->args[k] : 0;
    pthread_mutex_unlock(&g_log_mu);
    return 0;
}

/* The next call of `func` returns `code` with `msg` as its aclGetRecentErrMsg text. */
EXPORT int double_inject_error(const char *func, int code, const char *msg) {
    pthread_mutex_lock(&g_log_mu);
    for (int i = 0; i < MAX_INJECT; i++) {
        if (!g_inject[i].active) {
            snprintf(g_inject[i].func, sizeof g_inject[i].func, "%s", func);
            snprintf(g_inject[i].msg, sizeof g_inject[i].msg, "%s", msg ? msg : "");
            g_inject[i].code = code;
            g_inject[i].active = 1;
            pthread_mutex_unlock(&g_log_mu);
            return 0;
        }
    }
    pthread_mutex_unlock(&g_log_mu);
    return -1;
}

EXPORT void double_clear_injections(void) {
    pthread_mutex_lock(&g_log_mu);
    memset(g_inject, 0, sizeof g_inject);
    pthread_mutex_unlock(&g_log_mu);
}

/* Make `ctx` (NULL: every live context) faulted with `code`, as if a kernel had failed. */
EXPORT void double_set_unread_faults(int on) {
    pthread_mutex_lock(&g_mu);
    g_unread_faults = on;
    pthread_mutex_unlock(&g_mu);
}

EXPORT int double_set_fault(void *ctx, int code, const char *msg) {
    int n = 0;
    pthread_mutex_lock(&g_mu);
    for (ctx_t *c = g_contexts; c; c = c->next) {
        if (ctx && (void *)c != ctx) continue;
        c->fault_code = code;
        snprintf(c->fault_msg, sizeof c->fault_msg, "%s", msg ? msg : "injected device fault");
        n++;
    }
    pthread_cond_broadcast(&g_done_cv);
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* raw arguments of the last launch; 0 if there was none (aclrtLaunchKernel: func, numBlocks, stream, 0, argsData, argsSize, 0, 0) */
EXPORT int double_last_launch(uint64_t *out8) { /* 1 host args, 2 args handle, 3 device args */
    pthread_mutex_lock(&g_mu);
    int valid = g_last.valid;
    memcpy(out8, g_last.raw, sizeof g_last.raw);
    pthread_mutex_unlock(&g_mu);
    return valid;
}

/* -1 when the last launch had cfg == NULL; else numAttrs, with the raw attrs copied to buf */
EXPORT int64_t double_last_cfg(void *buf, size_t len) {
    pthread_mutex_lock(&g_mu);
    int64_t result = -1;
    if (!g_last.cfg_null) {
        size_t n = g_last.num_attrs < 64 ? g_last.num_attrs : 64;
        size_t bytes = n * sizeof(aclrtLaunchKernelAttr);
        memcpy(buf, g_last.attrs, bytes < len ? bytes : len);
        result = (int64_t)g_last.num_attrs;
    }
    pthread_mutex_unlock(&g_mu);
    return result;
}

EXPORT int64_t double_last_placeholders(void *buf, size_t len) {
    pthread_mutex_lock(&g_mu);
    size_t n = g_last.num_ph < 256 ? g_last.num_ph : 256;
    size_t bytes = n * sizeof(aclrtPlaceHolderInfo);
    memcpy(buf, g_last.ph, bytes < len ? bytes : len);
    int64_t result = (int64_t)g_last.num_ph;
    pthread_mutex_unlock(&g_mu);
    return result;
}

/* the args bytes as passed in (patched == 0) or after placeholder patching (patched != 0) */
EXPORT int64_t double_last_args(void *buf, size_t len, int patched) {
    pthread_mutex_lock(&g_mu);
    size_t n = g_last.args_size < sizeof g_last.args_pre ? g_last.args_size : sizeof g_last.args_pre;
    memcpy(buf, patched ? g_last.args_post : g_last.args_pre, n < len ? n : len);
    int64_t result = (int64_t)g_last.args_size;
    pthread_mutex_unlock(&g_mu);
    return result;
}

EXPORT uint64_t double_last_dev_args(void) {
    pthread_mutex_lock(&g_mu);
    uint64_t v = g_last.dev_args;
    pthread_mutex_unlock(&g_mu);
    return v;
}

/* path given to the last aclrtBinaryLoadFromFile ("" after FromData); returns options NULL? */
EXPORT int double_last_load(char *path, size_t len, uint64_t *num_options) {
    pthread_mutex_lock(&g_mu);
    snprintf(path, len, "%s", g_last_load_path);
    *num_options = g_last_load_options_num;
    int options_null = g_last_load_options_null;
    pthread_mutex_unlock(&g_mu);
    return options_null;
}

/* the attribute id of the last aclrtSetStreamAttribute (-1: none yet, -2: value was NULL), with
   the 16 bytes of its value copied to out16 */
EXPORT int double_last_stream_attr(unsigned char *out16) {
    pthread_mutex_lock(&g_mu);
    int result = g_last_attr.valid ? (g_last_attr.value_null ? -2 : g_last_attr.attr) : -1;
    memcpy(out16, g_last_attr.value, sizeof g_last_attr.value);
    pthread_mutex_unlock(&g_mu);
    return result;
}

/* the priority stored on a live stream (0 unless set), -1 if the handle is not a live stream */
EXPORT int64_t double_stream_priority(void *stream) {
    pthread_mutex_lock(&g_mu);
    int64_t result = live_is(stream, K_STREAM) ? (int64_t)((stream_t *)stream)->priority : -1;
    pthread_mutex_unlock(&g_mu);
    return result;
}

/* device memory per device (0: back to DOUBLE_MEM_TOTAL); live device bytes of `device` */
EXPORT void double_set_mem_total(uint64_t bytes) {
    pthread_mutex_lock(&g_mu);
    g_mem_total = bytes ? bytes : DOUBLE_MEM_TOTAL;
    pthread_mutex_unlock(&g_mu);
}

EXPORT uint64_t double_mem_used(int device) {
    pthread_mutex_lock(&g_mu);
    uint64_t used = device >= 0 && device < MAX_DEVICES ? g_dev_used[device] : 0;
    pthread_mutex_unlock(&g_mu);
    return used;
}

EXPORT void double_set_device_count(int n) {
    pthread_mutex_lock(&g_mu);
    g_device_count = n < 0 ? 0 : (n > MAX_DEVICES ? MAX_DEVICES : n);
    pthread_mutex_unlock(&g_mu);
}

EXPORT void double_set_max_depth(size_t depth) {
    pthread_mutex_lock(&g_mu);
    g_max_depth = depth ? depth : 1;
    pthread_cond_broadcast(&g_done_cv);
    pthread_mutex_unlock(&g_mu);
}

/* contexts, streams, events, device allocations, pinned allocations, binaries, queued tasks,
   device refcount of device 0, models (aclmdlRI), destroyed contexts a thread still holds */
EXPORT void double_live_counts(int64_t *out9) {
    int64_t *out8 = out9;
    pthread_mutex_lock(&g_mu);
    out8[0] = (int64_t)g_live_contexts;
    out8[1] = (int64_t)g_live_streams;
    out8[2] = (int64_t)g_live_events;
    out8[3] = (int64_t)g_ndallocs;
    out8[4] = (int64_t)g_nhallocs;
    out8[5] = (int64_t)g_live_binaries;
    out8[6] = (int64_t)g_queued_tasks;
    out8[7] = (int64_t)g_dev_refs[0];
    out9[8] = (int64_t)g_live_models;
    out9[9] = (int64_t)g_held_contexts;
    pthread_mutex_unlock(&g_mu);
}

/* threads that have the context current (contexts are never freed: any handle the double made
   may be asked, destroyed or not; a default context is never counted) */
EXPORT int64_t double_context_thread_refs(void *context) {
    pthread_mutex_lock(&g_mu);
    int64_t n = context ? ((ctx_t *)context)->thread_refs : -1;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* streams destroyed while a host thread was inside a blocking call on them (see above) */
EXPORT int64_t double_freed_under_callers(void) {
    pthread_mutex_lock(&g_mu);
    int64_t n = g_freed_under_callers;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* the number of tasks a live model recorded (-1: not a live model), and its capture mode */
EXPORT int64_t double_model_tasks(void *modelRI, int *mode) {
    pthread_mutex_lock(&g_mu);
    int64_t n = -1;
    if (modelRI && live_is(modelRI, K_MODEL)) {
        n = (int64_t)((model_t *)modelRI)->ntasks;
        if (mode) *mode = ((model_t *)modelRI)->mode;
    }
    pthread_mutex_unlock(&g_mu);
    return n;
}

EXPORT uint64_t double_event_generation(void *event) {
    pthread_mutex_lock(&g_mu);
    uint64_t gen = live_is(event, K_EVENT) ? ((event_t *)event)->gen : 0;
    pthread_mutex_unlock(&g_mu);
    return gen;
}

/* the calling thread's current context (no checks), for tests */
EXPORT void *double_current_context(void) { return t_ctx; }

EXPORT int double_context_fault(void *ctx) {
    pthread_mutex_lock(&g_mu);
    int code = live_is(ctx, K_CTX) ? ((ctx_t *)ctx)->fault_code : 0;
    pthread_mutex_unlock(&g_mu);
    return code;
}

/* The rest of the newer API, by persona: version and device info, the args-handle path, hidden MIX
   arguments, parameter info, exception info, stubs of what the double does not model. */
#include "acl_double_cann.c"
