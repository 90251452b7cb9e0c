/*
 * The newer part of the CANN runtime API in the test double, by persona (included at the end of
 * acl_double.c; see its header for the model and the personas). Sources for what is modelled:
 * docs/cann-support.md (the section named at each function).
 *
 *  - aclsysGetCANNVersion (8.3+): DOUBLE_CANN_VERSION for ACL_PKG_NAME_CANN and _RUNTIME.
 *  - aclrtGetDeviceInfo (8.3+): AI core 24, cube 24, vector 48, AI CPU 6; other attributes 107000.
 *  - aclrtStreamGetId (8.3+): a process-wide stream number (the exception info's stream id).
 *  - The args-handle path (8.3+, §3.2, §4.1): aclrtKernelArgsInit returns the thread's one handle;
 *    Append pads to the next 8-byte boundary before each parameter; AppendPlaceHolder takes an
 *    8-byte slot; the first GetPlaceHolderBuffer appends the context's overflow address in the
 *    next 8-aligned slot and places each data block 8-aligned after it; Finalize appends the
 *    overflow slot if no placeholder did and, for a MIX kernel on A2/A3, writes the inter-core
 *    sync address into slot 0 (which Init reserved); aclrtLaunchKernelWithConfig then launches
 *    the handle's buffer like a host-args launch with its placeholders.
 *  - aclrtGetHardwareSyncAddr (8.5+; 207000 unless the chip is A2/A3) and
 *    aclrtCtxGetFloatOverflowAddr (8.5+): the addresses the args-handle path writes, for a
 *    host-args caller to supply itself (§4.3). aclrtCreateStreamWithConfig (8.5+): priority 0..7.
 *  - aclrtFunctionGetParamCount / GetParamInfo (9.1+): the built-in kernels' user parameters
 *    (offset, size), as the double's kernels decode them.
 *  - aclrtSetExceptionInfoCallback (all): the last callback set wins; called on the device
 *    thread, inline, when a task fails (before the fault is visible to queries), with the
 *    stream id and the task's runtime id as task id (§7; acl_double_faults.h).
 *    aclrtGetLastError / PeekAtLastError: the thread's last code.
 *  - Model-RI capture (8.3+, not in the -DACL_DOUBLE_LEGACY build; §9 row 45): aclmdlRICaptureBegin
 *    (any of the three modes; 107000 on a stream already capturing) makes the stream record the
 *    launches, copies and memsets submitted to it instead of queueing them: a launch's args are
 *    copied at the call (as the runtime copies host args), a pinned copy's host side is read when
 *    the recorded copy runs (each replay). On a capturing stream aclrtRecordEvent,
 *    aclrtStreamWaitEvent, aclrtSynchronizeStreamWithTimeout, pageable copies and
 *    aclmdlRIExecuteAsync fail with 107000 (the docs list "107024-107038 capture errors" without
 *    names). aclmdlRICaptureEnd (107000 when not capturing) returns the model; a stream destroyed
 *    while capturing discards its capture. aclmdlRIExecuteAsync queues ONE stream task that runs
 *    the recorded tasks in order (a fault stops it like any task); aclmdlRIDestroy frees the
 *    handle at once (queued replays keep what they run); a destroyed or unknown handle: 107017.
 *    Models are counted in double_live_counts and die with their context.
 *  - The legacy loader and the device-args launch (every persona; the launch path of 8.0, §2):
 *    aclrtCreateBinary returns a descriptor of the pointer and length (NULL + 100000 for NULL data
 *    or length 0), aclrtBinaryLoad loads it like aclrtBinaryLoadFromData without options,
 *    aclrtDestroyBinary (8.5+: H850; unknown in 8.0, so not in its persona) frees it.
 *    aclrtLaunchKernel takes its args in DEVICE memory and checks only handles and sizes at the
 *    call; the kernel reads the args from device memory when it starts (a range outside one live
 *    allocation faults it with 507015) and every address in them (placeholder data included)
 *    from live device memory; a kernel that runs for a while faults if its args were freed or
 *    overwritten before it ended. -DACL_DOUBLE_NO_LAUNCH_KERNEL leaves aclrtLaunchKernel out (an
 *    install with no launch path at all, for the refusal tests).
 *  - aclrtKernelArgsGetHandleMemSize, GetMemSize, InitByUserMem (8.3+): the args handle in the
 *    caller's memory over the caller's buffer, as the runtime's source builds it (cited there).
 *  - Stubs, failing with 200006 ("not modelled"): aclrtLaunchKernelV2,
 *    aclrtLaunchKernelWithArgsArray: exported so that each persona's symbol set is exactly the
 *    documented one.
 */

#define ACL_ERROR_FEATURE_UNSUPPORTED 200006
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT 207000
#define MAX_ARGS_BUFF_SIZE 65536
#define MAX_KERNEL_PARAMS 128

typedef void *aclrtArgsHandle;
typedef void *aclrtParamHandle;
typedef void *aclrtBinary;
typedef void *aclmdlRI;
typedef enum {
    ACL_MODEL_RI_CAPTURE_MODE_GLOBAL = 0, ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL, ACL_MODEL_RI_CAPTURE_MODE_RELAXED
} aclmdlRICaptureMode;

/* ---- stubs of what the double does not model ------------------------------------------------ */

#define NOT_MODELLED(name) fail(ACL_ERROR_FEATURE_UNSUPPORTED, "%s is not modelled by the test double", name)

/* ---- the legacy loader and the device-args launch (every persona; the 8.0 path) ------------- */

/* aclrtCreateBinary's descriptor: the pointer and length only, like rtDevBinary_t (the data is
   read by aclrtBinaryLoad) */
typedef struct { const void *data; size_t length; } bindesc_t;

EXPORT aclrtBinary aclrtCreateBinary(const void *data, size_t dataLen) {
    uint64_t args_[2] = {P(data), Z(dataLen)};
    uint64_t log_index_ = log_call("aclrtCreateBinary", args_, 2);
    t_fn = "aclrtCreateBinary";
    if (!data || !dataLen) {
        log_ret(log_index_, fail(ACL_ERROR_INVALID_PARAM, "data is NULL or dataLen is 0"));
        return NULL;
    }
    bindesc_t *d = malloc(sizeof *d);
    if (!d) abort();
    d->data = data;
    d->length = dataLen;
    pthread_mutex_lock(&g_mu);
    live_add(d, K_BINDESC);
    pthread_mutex_unlock(&g_mu);
    log_ret(log_index_, 0);
    return d;
}

EXPORT aclError aclrtBinaryLoad(const aclrtBinary binary, aclrtBinHandle *binHandle) {
    ENTER("aclrtBinaryLoad", 2, P(binary), P(binHandle));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!binHandle) LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "binHandle is NULL"));
    if (!live_is(binary, K_BINDESC))
        LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "binary %p is not a descriptor of aclrtCreateBinary", binary));
    const bindesc_t *d = binary;
    g_last_load_path[0] = 0;
    note_options(NULL); /* the legacy loader has no options: the chip's default kernel type */
    LEAVE_UNLOCK(load_blob(d->data, d->length, default_kernel_type(), 0, binHandle));
}

#if HAS_85 /* in H850 on; not seen in an 8.0 page (cann-support.md §9) */
EXPORT aclError aclrtDestroyBinary(aclrtBinary binary) {
    ENTER("aclrtDestroyBinary", 1, P(binary));
    pthread_mutex_lock(&g_mu);
    if (!live_is(binary, K_BINDESC))
        LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "binary %p is not a live descriptor", binary));
    live_del(binary);
    free(binary);
    LEAVE_UNLOCK(0);
}
#endif

#ifndef ACL_DOUBLE_NO_LAUNCH_KERNEL
/* aclrtLaunchKernel (aclrtLaunchKernelImpl -> rtLaunchKernelByFuncHandleV3, isNoNeedH2DCopy = 1):
   argsData is DEVICE memory, passed to the kernel as is; nothing is copied or checked at the call
   beyond the handles and sizes. The kernel reads the args (and placeholder data through the
   addresses in them) from device memory when it runs, and faults if they are not a live device
   allocation then, or were freed or overwritten before it ended. */
EXPORT aclError aclrtLaunchKernel(aclrtFuncHandle funcHandle, uint32_t numBlocks, const void *argsData,
                                  size_t argsSize, aclrtStream stream) {
    ENTER("aclrtLaunchKernel", 5, P(funcHandle), Z(numBlocks), P(argsData), Z(argsSize), P(stream));
    pthread_mutex_lock(&g_mu);
    uint64_t raw8[8] = {P(funcHandle), Z(numBlocks), P(stream), 0, P(argsData), Z(argsSize), 0, 0};
    note_launch(3, raw8, NULL, NULL, argsSize, NULL, 0);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!funcHandle || !argsData) LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "funcHandle or argsData is NULL"));
    if (!live_is(funcHandle, K_FUNC)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "function %p is not valid", funcHandle));
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if (argsSize == 0 || argsSize > 0xFFFFFFFFu) /* the runtime keeps it as a uint32 */
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "argsSize %zu out of range 1..2**32-1", argsSize));
    if (numBlocks == 0 || numBlocks > 65535)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "numBlocks %u out of range 1..65535", numBlocks));
    if ((rc = ctx_fault(c))) LEAVE_UNLOCK(rc);
    task_t *t = calloc(1, sizeof *t);
    if (!t) abort();
    t->kind = T_KERNEL;
    t->kernel = ((func_t *)funcHandle)->kernel;
    t->func = funcHandle;
    t->blocks = numBlocks;
    t->args_size = argsSize;
    t->dev_args = P(argsData);
    t->late_args = 1;
    t->overflow = c->overflow_addr;
    t->lead = kernel_lead(funcHandle);
    g_last.dev_args = P(argsData);
    LEAVE_UNLOCK(enqueue(s, t));
}
#endif


/* ---- model-RI capture (8.3+; not in the -DACL_DOUBLE_LEGACY build) --------------------------- */

#if HAS_83 && !defined(ACL_DOUBLE_LEGACY)
static int g_invalidate_captures; /* double_invalidate_captures: every capture begun is invalidated */

EXPORT aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode) {
    ENTER("aclmdlRICaptureBegin", 2, P(stream), I(mode));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if ((int)mode < ACL_MODEL_RI_CAPTURE_MODE_GLOBAL || (int)mode > ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "capture mode %d is not an aclmdlRICaptureMode", (int)mode));
    if (s->capture) LEAVE_UNLOCK(capture_refusal("aclmdlRICaptureBegin"));
    if ((rc = ctx_fault(c))) LEAVE_UNLOCK(rc);
    model_t *m = calloc(1, sizeof *m);
    if (!m) abort();
    m->ctx = c;
    m->refs = 1;
    m->mode = (int)mode;
    m->invalidated = g_invalidate_captures;
    s->capture = m;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI *modelRI) {
    ENTER("aclmdlRICaptureEnd", 2, P(stream), P(modelRI));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if (!modelRI) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "modelRI is NULL"));
    /* not capturing: 107029 (hicann/runtime@681ef76:src/runtime/feature/aclgraph/context_aclgraph.cc:514-517) */
    if (!s->capture)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_STREAM_NOT_CAPTURED, "stream %p is not in capture status", stream));
    model_t *m = s->capture;
    s->capture = NULL; /* the stream leaves capture mode whatever the outcome (CaptureModeExit, :531) */
    if (m->invalidated) {
        /* an invalidated capture: the model is cleared and 507903 returned, no model handed out
           (context_aclgraph.cc:544-561, ClearCaptureModel) */
        model_unref(m);
        *modelRI = NULL;
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
                          "an error has invalidated the stream capture sequence"));
    }
    live_add(m, K_MODEL);
    g_live_models++;
    *modelRI = m;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream) {
    ENTER("aclmdlRIExecuteAsync", 2, P(modelRI), P(stream));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!modelRI || !live_is(modelRI, K_MODEL))
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "modelRI %p is not a live model", modelRI));
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    model_t *m = modelRI;
    if (m->ctx != c) LEAVE_UNLOCK(fail(ACL_ERROR_RT_STREAM_CONTEXT, "modelRI belongs to another context"));
    if (s->capture) LEAVE_UNLOCK(capture_refusal("aclmdlRIExecuteAsync"));
    if ((rc = ctx_fault(c))) LEAVE_UNLOCK(rc);
    task_t *t = calloc(1, sizeof *t);
    if (!t) abort();
    t->kind = T_MODEL;
    t->model = m;
    m->refs++;
    t->next_rec = m->head;
    LEAVE_UNLOCK(enqueue(s, t));
}

EXPORT aclError aclmdlRIDestroy(aclmdlRI modelRI) {
    ENTER("aclmdlRIDestroy", 1, P(modelRI));
    pthread_mutex_lock(&g_mu);
    if (!modelRI || !live_is(modelRI, K_MODEL))
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "modelRI %p is not a live model", modelRI));
    model_kill(modelRI);
    LEAVE_UNLOCK(0);
}

#endif

#if HAS_85
EXPORT aclError aclrtLaunchKernelV2(aclrtFuncHandle funcHandle, uint32_t numBlocks, const void *argsData,
                                    size_t argsSize, aclrtLaunchKernelCfg *cfg, aclrtStream stream) {
    ENTER("aclrtLaunchKernelV2", 6, P(funcHandle), Z(numBlocks), P(argsData), Z(argsSize), P(cfg), P(stream));
    LEAVE(NOT_MODELLED("aclrtLaunchKernelV2"));
}
#endif

#if HAS_91
EXPORT aclError aclrtLaunchKernelWithArgsArray(void *func, uint32_t numBlocks, aclrtStream stream,
                                               aclrtLaunchKernelCfg *cfg, void **args) {
    ENTER("aclrtLaunchKernelWithArgsArray", 5, P(func), Z(numBlocks), P(stream), P(cfg), P(args));
    LEAVE(NOT_MODELLED("aclrtLaunchKernelWithArgsArray"));
}
#endif

/* ---- last error (all personas) -------------------------------------------------------------- */

EXPORT aclError aclrtGetLastError(int level) {
    uint64_t args_[1] = {I(level)};
    uint64_t log_index_ = log_call("aclrtGetLastError", args_, 1);
    aclError code = level == 0 ? t_last_err : ACL_ERROR_INVALID_PARAM;
    if (level == 0) t_last_err = 0;
    return log_ret(log_index_, code);
}

EXPORT aclError aclrtPeekAtLastError(int level) {
    uint64_t args_[1] = {I(level)};
    uint64_t log_index_ = log_call("aclrtPeekAtLastError", args_, 1);
    return log_ret(log_index_, level == 0 ? t_last_err : ACL_ERROR_INVALID_PARAM);
}

/* ---- exception info (all personas; args/func getters 9.0+) ---------------------------------- */

EXPORT aclError aclrtSetExceptionInfoCallback(aclrtExceptionInfoCallback callback) {
    ENTER("aclrtSetExceptionInfoCallback", 1, P(callback));
    pthread_mutex_lock(&g_mu);
    g_exc_cb = callback; /* the last one set wins; NULL clears it */
    LEAVE_UNLOCK(0);
}

#define EXC_FIELD(getter, field)                                               \
    EXPORT uint32_t getter(const aclrtExceptionInfo *info) {                   \
        return info ? info->field : 0xFFFFFFFFu;                               \
    }
EXC_FIELD(aclrtGetTaskIdFromExceptionInfo, taskid)
EXC_FIELD(aclrtGetStreamIdFromExceptionInfo, streamid)
EXC_FIELD(aclrtGetThreadIdFromExceptionInfo, tid)
EXC_FIELD(aclrtGetDeviceIdFromExceptionInfo, deviceid)
EXC_FIELD(aclrtGetErrorCodeFromExceptionInfo, retcode)

#if HAS_90
EXPORT aclError aclrtGetArgsFromExceptionInfo(const aclrtExceptionInfo *info, void **devArgsPtr, uint32_t *devArgsLen) {
    if (!info || !devArgsPtr || !devArgsLen) return ACL_ERROR_INVALID_PARAM;
    *devArgsPtr = (void *)(uintptr_t)info->dev_args;
    *devArgsLen = info->args_len;
    return 0;
}

EXPORT aclError aclrtGetFuncHandleFromExceptionInfo(const aclrtExceptionInfo *info, aclrtFuncHandle *func) {
    if (!info || !func) return ACL_ERROR_INVALID_PARAM;
    *func = info->func;
    return 0;
}
#endif

/* ---- version, device information, stream ids (8.3+) ------------------------------------------ */

#if HAS_83
typedef struct aclCANNPackageVersion {
    char version[128];
    char majorVersion[64];
    char minorVersion[64];
    char releaseVersion[64];
    char patchVersion[64];
    char reserved[128];
} aclCANNPackageVersion;
_Static_assert(sizeof(aclCANNPackageVersion) == 512, "aclCANNPackageVersion");

EXPORT aclError aclsysGetCANNVersion(int name, aclCANNPackageVersion *version) {
    ENTER("aclsysGetCANNVersion", 2, I(name), P(version));
    if (!version) LEAVE(fail(ACL_ERROR_INVALID_PARAM, "version is NULL"));
    if (name != 0 && name != 1) /* ACL_PKG_NAME_CANN, ACL_PKG_NAME_RUNTIME */
        LEAVE(fail(ACL_ERROR_INVALID_PARAM, "package %d is not installed in the double", name));
    memset(version, 0, sizeof *version);
    snprintf(version->version, sizeof version->version, "%s", DOUBLE_CANN_VERSION);
    char copy[64];
    snprintf(copy, sizeof copy, "%s", DOUBLE_CANN_VERSION);
    char *parts[3] = {copy, NULL, NULL};
    for (int i = 1; i < 3 && parts[i - 1]; i++) {
        char *dot = strchr(parts[i - 1], '.');
        if (dot) {
            *dot = 0;
            parts[i] = dot + 1;
        }
    }
    snprintf(version->majorVersion, sizeof version->majorVersion, "%s", parts[0] ? parts[0] : "");
    snprintf(version->minorVersion, sizeof version->minorVersion, "%s", parts[1] ? parts[1] : "");
    snprintf(version->releaseVersion, sizeof version->releaseVersion, "%s", parts[2] ? parts[2] : "");
    LEAVE(0);
}

EXPORT aclError aclrtGetDeviceInfo(uint32_t deviceId, int attr, int64_t *value) {
    ENTER("aclrtGetDeviceInfo", 3, Z(deviceId), I(attr), P(value));
    pthread_mutex_lock(&g_mu);
    if (!g_initialized) LEAVE_UNLOCK(fail(ACL_ERROR_UNINITIALIZE, "aclInit was not called"));
    if (!value) LEAVE_UNLOCK(fail(ACL_ERROR_INVALID_PARAM, "value is NULL"));
    if ((int)deviceId >= g_device_count)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_DEVICEID, "device %u does not exist", deviceId));
    switch (attr) {
    case 1: *value = 6; break;    /* ACL_DEV_ATTR_AICPU_CORE_NUM */
    case 101: *value = 24; break; /* ACL_DEV_ATTR_AICORE_CORE_NUM */
    case 102: *value = 24; break; /* ACL_DEV_ATTR_CUBE_CORE_NUM */
    case 201: *value = 48; break; /* ACL_DEV_ATTR_VECTOR_CORE_NUM */
    default: LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "device attribute %d is not modelled by the double", attr));
    }
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtStreamGetId(aclrtStream stream, int32_t *streamId) {
    ENTER("aclrtStreamGetId", 2, P(stream), P(streamId));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    stream_t *s = need_stream(stream, c, &rc);
    if (!s) LEAVE_UNLOCK(rc);
    if (!streamId) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "streamId is NULL"));
    *streamId = s->id;
    LEAVE_UNLOCK(0);
}

/* (offset, size) of each user parameter of the built-in kernels, as run_kernel decodes them */
static const struct { int n; size_t at[4][2]; } KERNEL_PARAMS[KN_COUNT] = {
    [KN_VECTOR_ADD] = {4, {{0, 8}, {8, 8}, {16, 8}, {24, 4}}},
    [KN_AXPY] = {4, {{0, 8}, {8, 8}, {16, 4}, {20, 4}}},
    [KN_SCALE] = {3, {{0, 8}, {8, 8}, {16, 8}}},
    [KN_MATMUL] = {4, {{0, 8}, {8, 8}, {16, 8}, {24, 8}}},
    [KN_SLEEP] = {1, {{0, 4}}},
    [KN_FAULT] = {1, {{0, 4}}},
    [KN_HANG] = {0, {{0, 0}}},
    [KN_NOOP] = {0, {{0, 0}}},
    [KN_MIX_ADD] = {4, {{0, 8}, {8, 8}, {16, 8}, {24, 4}}},
};

/* ---- the args-handle path (8.3+) -------------------------------------------------------------- */

typedef struct {
    size_t offset;
    int placeholder;
    int has_data;
    size_t data_offset;
} kparam_t;

/* An args handle: the thread's own (aclrtKernelArgsInit, its buffer MAX_ARGS_BUFF_SIZE bytes) or
   one in the caller's memory over the caller's buffer (aclrtKernelArgsInitByUserMem). */
#define USER_ARGS_MAGIC 0x5553455241524753ull /* an initialised user-memory handle */

typedef struct {
    uint64_t magic; /* USER_ARGS_MAGIC in a user-memory handle */
    func_t *func;
    int finalized;
    int overflow_done;
    size_t size; /* argsSize */
    size_t cap;  /* bufferSize */
    size_t max_params; /* maxUserParamNum */
    size_t nparams;
    kparam_t params[MAX_KERNEL_PARAMS];
    unsigned char *buf;
} args_handle_t;

static __thread args_handle_t *t_args; /* aclrtKernelArgsInit's thread_local handle */

static args_handle_t *need_handle(aclrtArgsHandle h, aclError *rc) {
    args_handle_t *a = h;
    /* a user-memory handle lives in the caller's memory, which may be freed and reused at any
       time: it is recognised by its magic, never kept in the live table */
    if (!a || (a != t_args && a->magic != USER_ARGS_MAGIC) || !a->func) {
        *rc = fail(ACL_ERROR_RT_PARAM_INVALID, "argsHandle %p is not an initialised args handle", h);
        return NULL;
    }
    return a;
}

static kparam_t *need_param(args_handle_t *a, aclrtParamHandle ph, aclError *rc) {
    kparam_t *p = ph;
    if (!p || p < a->params || p >= a->params + a->nparams) {
        *rc = fail(ACL_ERROR_RT_PARAM_INVALID, "paramHandle %p is not a parameter of the args handle", ph);
        return NULL;
    }
    return p;
}

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* ProcessOverFlowArgs: the context overflow address in the next 8-aligned slot, once. */
static aclError process_overflow(args_handle_t *a, ctx_t *c) {
    if (a->overflow_done) return 0;
    size_t at = align8(a->size);
    if (at + 8 > a->cap) return fail(ACL_ERROR_RT_PARAM_INVALID, "args exceed %zu bytes", a->cap);
    memcpy(a->buf + at, &c->overflow_addr, 8); /* the padding before it is left as it was */
    a->size = at + 8;
    a->overflow_done = 1;
    return 0;
}

EXPORT aclError aclrtKernelArgsInit(aclrtFuncHandle funcHandle, aclrtArgsHandle *argsHandle) {
    ENTER("aclrtKernelArgsInit", 2, P(funcHandle), P(argsHandle));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!live_is(funcHandle, K_FUNC)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "function %p is not valid", funcHandle));
    if (!argsHandle) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "argsHandle is NULL"));
    if (!t_args) {
        if (!(t_args = calloc(1, sizeof *t_args)) || !(t_args->buf = malloc(MAX_ARGS_BUFF_SIZE))) abort();
    }
    t_args->func = funcHandle;
    t_args->finalized = t_args->overflow_done = 0;
    t_args->nparams = 0;
    t_args->cap = MAX_ARGS_BUFF_SIZE;
    t_args->max_params = MAX_KERNEL_PARAMS;
    /* the leading system slot: the FFTS address of a MIX kernel on A2/A3 (GetToBeCalSystemParaNum) */
    t_args->size = kernel_lead(funcHandle);
    memset(t_args->buf, 0, 8);
    *argsHandle = t_args;
    LEAVE_UNLOCK(0);
}

/* The user-memory args handle (hicann/runtime@681ef76:src/runtime/api/impl/api_impl.cc):
   aclrtKernelArgsGetHandleMemSize gives the handle's size (:8475-8487), aclrtKernelArgsGetMemSize
   the buffer a non-CPU kernel needs: the user args + 8 system slots of 8 bytes + 8 bytes of
   padding per user parameter (:8547-8556), aclrtKernelArgsInitByUserMem builds the handle over
   the caller's buffer without writing to it: maxUserParamNum is the kernel's user parameter
   count, argsSize starts at the leading system slots, the sync slot is only reserved
   (:8512-8545); Append, AppendPlaceHolder, GetPlaceHolderBuffer and Finalize then work as on the
   thread's handle, Finalize writing the sync address into slot 0 and the overflow address after
   the parameters (:8489-8510, :8422-8458). */
#define MAX_SYSTEM_PARAM_CNT 8 /* src/runtime/core/src/kernel/args/args_handle_allocator.hpp:22 */

EXPORT aclError aclrtKernelArgsGetHandleMemSize(aclrtFuncHandle funcHandle, size_t *memSize) {
    ENTER("aclrtKernelArgsGetHandleMemSize", 2, P(funcHandle), P(memSize));
    pthread_mutex_lock(&g_mu);
    if (!live_is(funcHandle, K_FUNC)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "function %p is not valid", funcHandle));
    if (!memSize) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "memSize is NULL"));
    *memSize = sizeof(args_handle_t);
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtKernelArgsGetMemSize(aclrtFuncHandle funcHandle, size_t userArgsSize, size_t *actualArgsSize) {
    ENTER("aclrtKernelArgsGetMemSize", 3, P(funcHandle), Z(userArgsSize), P(actualArgsSize));
    pthread_mutex_lock(&g_mu);
    if (!live_is(funcHandle, K_FUNC)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "function %p is not valid", funcHandle));
    if (!actualArgsSize) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "actualArgsSize is NULL"));
    size_t params = (size_t)KERNEL_PARAMS[((func_t *)funcHandle)->kernel].n;
    *actualArgsSize = userArgsSize + MAX_SYSTEM_PARAM_CNT * 8 + params * 8;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtKernelArgsInitByUserMem(aclrtFuncHandle funcHandle, aclrtArgsHandle argsHandle,
                                             void *userHostMem, size_t actualArgsSize) {
    ENTER("aclrtKernelArgsInitByUserMem", 4, P(funcHandle), P(argsHandle), P(userHostMem), Z(actualArgsSize));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!live_is(funcHandle, K_FUNC)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "function %p is not valid", funcHandle));
    if (!argsHandle || !userHostMem || !actualArgsSize)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "argsHandle, userHostMem or actualArgsSize is 0"));
    args_handle_t *a = argsHandle;
    memset(a, 0, sizeof *a);
    a->func = funcHandle;
    a->buf = userHostMem;
    a->cap = actualArgsSize;
    a->max_params = (size_t)KERNEL_PARAMS[((func_t *)funcHandle)->kernel].n;
    a->size = kernel_lead(funcHandle);
    a->magic = USER_ARGS_MAGIC;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtKernelArgsAppend(aclrtArgsHandle argsHandle, void *param, size_t paramSize,
                                      aclrtParamHandle *paramHandle) {
    ENTER("aclrtKernelArgsAppend", 4, P(argsHandle), P(param), Z(paramSize), P(paramHandle));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    args_handle_t *a = need_handle(argsHandle, &rc);
    if (!a) LEAVE_UNLOCK(rc);
    if (!param || !paramSize || !paramHandle) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "param, paramSize or paramHandle is 0"));
    if (a->overflow_done) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "a parameter appended after the placeholder buffers"));
    /* maxUserParamNum (api_impl.cc:8715-8718) */
    if (a->nparams >= a->max_params) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "more than %zu parameters", a->max_params));
    size_t at = align8(a->size); /* NON_CPU_KERNEL_ARGS_ALIGN_SIZE: every parameter starts 8-aligned */
    if (at + paramSize > a->cap) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "args exceed %zu bytes", a->cap));
    if (a == t_args) memset(a->buf + a->size, 0, at - a->size); /* the caller's buffer: left as it was */
    memcpy(a->buf + at, param, paramSize);
    a->params[a->nparams] = (kparam_t){at, 0, 0, 0};
    *paramHandle = &a->params[a->nparams++];
    a->size = at + paramSize;
    a->finalized = 0;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtKernelArgsAppendPlaceHolder(aclrtArgsHandle argsHandle, aclrtParamHandle *paramHandle) {
    ENTER("aclrtKernelArgsAppendPlaceHolder", 2, P(argsHandle), P(paramHandle));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    args_handle_t *a = need_handle(argsHandle, &rc);
    if (!a) LEAVE_UNLOCK(rc);
    if (!paramHandle) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "paramHandle is NULL"));
    if (a->overflow_done) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "a placeholder appended after the placeholder buffers"));
    if (a->nparams >= a->max_params) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "more than %zu parameters", a->max_params));
    size_t at = align8(a->size);
    if (at + 8 > a->cap) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "args exceed %zu bytes", a->cap));
    memset(a->buf + a->size, 0, at + 8 - a->size);
    a->params[a->nparams] = (kparam_t){at, 1, 0, 0};
    *paramHandle = &a->params[a->nparams++];
    a->size = at + 8;
    a->finalized = 0;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtKernelArgsGetPlaceHolderBuffer(aclrtArgsHandle argsHandle, aclrtParamHandle paramHandle,
                                                    size_t dataSize, void **bufferAddr) {
    ENTER("aclrtKernelArgsGetPlaceHolderBuffer", 4, P(argsHandle), P(paramHandle), Z(dataSize), P(bufferAddr));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    args_handle_t *a = need_handle(argsHandle, &rc);
    if (!a) LEAVE_UNLOCK(rc);
    kparam_t *p = need_param(a, paramHandle, &rc);
    if (!p) LEAVE_UNLOCK(rc);
    if (!p->placeholder) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "paramHandle is not a placeholder"));
    if (p->has_data) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "the placeholder already has its buffer"));
    if (!dataSize || !bufferAddr) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "dataSize or bufferAddr is 0"));
    if ((rc = process_overflow(a, c))) LEAVE_UNLOCK(rc);
    size_t at = align8(a->size);
    if (at + dataSize > a->cap) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "args exceed %zu bytes", a->cap));
    memset(a->buf + a->size, 0, at + dataSize - a->size);
    p->has_data = 1;
    p->data_offset = at;
    a->size = at + dataSize;
    a->finalized = 0;
    *bufferAddr = a->buf + at;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtKernelArgsFinalize(aclrtArgsHandle argsHandle) {
    ENTER("aclrtKernelArgsFinalize", 1, P(argsHandle));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    args_handle_t *a = need_handle(argsHandle, &rc);
    if (!a) LEAVE_UNLOCK(rc);
    for (size_t i = 0; i < a->nparams; i++)
        if (a->params[i].placeholder && !a->params[i].has_data)
            LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "placeholder parameter %zu has no data buffer", i));
    if ((rc = process_overflow(a, c))) LEAVE_UNLOCK(rc);
    if (needs_ffts(a->func)) {
        uint64_t ffts = FFTS_ADDR; /* GetC2cCtrlAddr into slot 0 */
        memcpy(a->buf, &ffts, 8);
    }
    a->finalized = 1;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtLaunchKernelWithConfig(aclrtFuncHandle funcHandle, uint32_t numBlocks, aclrtStream stream,
                                            aclrtLaunchKernelCfg *cfg, aclrtArgsHandle argsHandle, void *reserve) {
    ENTER("aclrtLaunchKernelWithConfig", 6, P(funcHandle), Z(numBlocks), P(stream), P(cfg), P(argsHandle), P(reserve));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    args_handle_t *a = need_handle(argsHandle, &rc);
    if (!a) LEAVE_UNLOCK(rc);
    aclrtPlaceHolderInfo table[MAX_KERNEL_PARAMS];
    size_t n = 0;
    for (size_t i = 0; i < a->nparams; i++)
        if (a->params[i].placeholder)
            table[n++] = (aclrtPlaceHolderInfo){(uint32_t)a->params[i].offset, (uint32_t)a->params[i].data_offset};
    uint64_t raw[8] = {P(funcHandle), Z(numBlocks), P(stream), P(cfg), P(a->buf), Z(a->size), P(table), Z(n)};
    note_launch(2, raw, cfg, a->buf, a->size, table, n);
    if (reserve) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "reserve must be NULL"));
    if (!a->finalized) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "the args handle is not finalized"));
    if ((void *)a->func != funcHandle)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "the args handle was built for another function"));
    LEAVE_UNLOCK(launch_locked(funcHandle, numBlocks, stream, cfg, a->buf, a->size, table, n));
}
#endif /* HAS_83 */

/* ---- hidden-argument addresses, stream config (8.5+) ----------------------------------------- */

#if HAS_85
EXPORT aclError aclrtGetHardwareSyncAddr(void **addr) {
    ENTER("aclrtGetHardwareSyncAddr", 1, P(addr));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!addr) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "addr is NULL"));
    if (!g_chip_a2a3)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "the chip has no inter-core sync address (A2/A3 only)"));
    *addr = (void *)(uintptr_t)FFTS_ADDR;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtCtxGetFloatOverflowAddr(void **overflowAddr) {
    ENTER("aclrtCtxGetFloatOverflowAddr", 1, P(overflowAddr));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!overflowAddr) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "overflowAddr is NULL"));
    *overflowAddr = (void *)(uintptr_t)c->overflow_addr;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag) {
    ENTER("aclrtCreateStreamWithConfig", 3, P(stream), Z(priority), Z(flag));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (!stream) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "stream is NULL"));
    if (priority > STREAM_PRIORITY_LEAST)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "priority %u is out of range %d..%d", priority,
                          STREAM_PRIORITY_GREATEST, STREAM_PRIORITY_LEAST));
    if (flag & ~0x3Fu) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "unsupported stream flag 0x%x", flag));
    stream_t *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->ctx = c;
    s->id = g_next_stream_id++;
    s->refs = 1;
    s->alive = 1;
    s->priority = priority;
    s->next_all = g_streams;
    g_streams = s;
    live_add(s, K_STREAM);
    g_live_streams++;
    *stream = s;
    LEAVE_UNLOCK(0);
}
#endif /* HAS_85 */

/* ---- parameter information (9.1+) ------------------------------------------------------------- */


#if HAS_91
EXPORT aclError aclrtFunctionGetParamCount(const void *func, size_t *paramCount) {
    ENTER("aclrtFunctionGetParamCount", 2, P(func), P(paramCount));
    pthread_mutex_lock(&g_mu);
    if (!live_is(func, K_FUNC)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "function %p is not valid", func));
    if (!paramCount) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "paramCount is NULL"));
    *paramCount = (size_t)KERNEL_PARAMS[((const func_t *)func)->kernel].n;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtFunctionGetParamInfo(const void *func, size_t paramIndex, size_t *paramOffset, size_t *paramSize) {
    ENTER("aclrtFunctionGetParamInfo", 4, P(func), Z(paramIndex), P(paramOffset), P(paramSize));
    pthread_mutex_lock(&g_mu);
    if (!live_is(func, K_FUNC)) LEAVE_UNLOCK(fail(ACL_ERROR_RT_INVALID_HANDLE, "function %p is not valid", func));
    if (!paramOffset || !paramSize) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "paramOffset or paramSize is NULL"));
    int kernel = ((const func_t *)func)->kernel;
    if (paramIndex >= (size_t)KERNEL_PARAMS[kernel].n)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "paramIndex %zu >= %d parameters", paramIndex, KERNEL_PARAMS[kernel].n));
    *paramOffset = KERNEL_PARAMS[kernel].at[paramIndex][0];
    *paramSize = KERNEL_PARAMS[kernel].at[paramIndex][1];
    LEAVE_UNLOCK(0);
}
#endif

/* ---- controls for the tests --------------------------------------------------------------------- */

#if HAS_83 && !defined(ACL_DOUBLE_LEGACY)
/* Invalidate the capture open on a stream, as the runtime does when a captured task cannot be
   allocated (hicann/runtime@681ef76:src/runtime/feature/aclgraph/stream_capture.cc:20-29, 113-118):
   1 if the stream was capturing. */
EXPORT int double_invalidate_capture(void *stream) {
    pthread_mutex_lock(&g_mu);
    int done = 0;
    if (live_is(stream, K_STREAM) && ((stream_t *)stream)->capture) {
        ((stream_t *)stream)->capture->invalidated = 1;
        done = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return done;
}

/* While on, every capture begun is invalidated at once (as above), for tests that cannot reach
   the stream between the begin and the end. */
EXPORT void double_invalidate_captures(int on) {
    pthread_mutex_lock(&g_mu);
    g_invalidate_captures = on != 0;
    pthread_mutex_unlock(&g_mu);
}
#endif

EXPORT int double_persona(void) { return ACL_PERSONA; }
EXPORT uint64_t double_ffts_addr(void) { return FFTS_ADDR; }

/* whether the modelled chip is Atlas A2/A3 (inter-core sync address, CUBE default) */
EXPORT void double_set_chip_a2a3(int on) {
    pthread_mutex_lock(&g_mu);
    g_chip_a2a3 = on != 0;
    pthread_mutex_unlock(&g_mu);
}

/* the overflow address of a live context (0 if not live) */
EXPORT uint64_t double_context_overflow(void *ctx) {
    pthread_mutex_lock(&g_mu);
    uint64_t v = live_is(ctx, K_CTX) ? ((ctx_t *)ctx)->overflow_addr : 0;
    pthread_mutex_unlock(&g_mu);
    return v;
}

/* the kernel type (KT_*) and lazy flag of a loaded binary; -1 if not loaded */
EXPORT int double_binary_kernel_type(void *binary, int *lazy) {
    pthread_mutex_lock(&g_mu);
    int result = -1;
    if (live_is(binary, K_BIN)) {
        result = ((binary_t *)binary)->kernel_type;
        *lazy = ((binary_t *)binary)->lazy;
    }
    pthread_mutex_unlock(&g_mu);
    return result;
}

/* the options of the last load (up to 8 raw 20-byte entries copied to buf); returns numOpt */
EXPORT uint64_t double_last_load_options(void *buf, size_t len) {
    pthread_mutex_lock(&g_mu);
    size_t n = g_last_load_options_num < 8 ? g_last_load_options_num : 8;
    size_t bytes = n * sizeof(aclrtBinaryLoadOption);
    memcpy(buf, g_last_load_opts, bytes < len ? bytes : len);
    uint64_t result = g_last_load_options_num;
    pthread_mutex_unlock(&g_mu);
    return result;
}
