/*
 * Fault attribution and forced destruction in the test double, modelled on the CANN runtime's
 * source (hicann/runtime @ 681ef76; included by acl_double.c before enqueue(), so that its
 * streams, tasks and lock are in scope). Each behaviour carries its citation; docs/cann-support.md
 * ("Modelled behaviours") says what each still needs hardware for.
 *
 *  - Task ids: each task a stream runs takes the stream's next id, (id + 1) % 0xFFFF from the
 *    last (0..65534, then 0 again), and the flip count goes up when the id wraps; the id the
 *    runtime reports is (flip << 16) | id. Runtime-internal tasks take ids too
 *    (double_set_internal_tasks: every Nth submission is preceded by one).
 *  - aclrtGetThreadLastTaskId (8.2 on): the flip task id of the last task the calling thread
 *    submitted (any stream), kept per thread.
 *  - aclrtDestroyStreamForce does not wait for, nor stop, the task running on the stream: it
 *    goes on to its end (a "zombie" here) and a kernel writes the device memory it read at its
 *    start when it finishes; touching memory freed meanwhile is counted (double_use_after_free).
 *  - aclrtSynchronizeDeviceWithTimeout: waits for every task of the device, zombies included.
 *  - aclrtExceptionInfoCallbackRegister / Unregister (newest persona): any number of callbacks,
 *    each identified by its function pointer; registering one twice adds nothing.
 *  - double_set_full_refusal: a full stream queue refuses a submission with the given code
 *    instead of blocking (the runtime blocks; the control stands for a runtime that gives up).
 */

struct aclrtExceptionInfo;
static int step(stream_t *s, task_t *t, uint64_t now, uint64_t *next_deadline);

/* The last task id a thread submitted. Before its first task the runtime's thread-local is 0
   (InnerThreadLocalContainer::GetLastTaskId, api_impl.cc:8353-8357 reads it as is). */
static __thread uint32_t t_last_task_id;
static aclError g_full_refusal;      /* double_set_full_refusal: 0 = block as the runtime does */
static uint32_t g_internal_every;    /* double_set_internal_tasks: 0 = none */
static uint64_t g_use_after_free;    /* a running kernel touched device memory freed under it */

#define MAX_REGISTERED 8
static void (*g_exc_registered[MAX_REGISTERED])(struct aclrtExceptionInfo *);
static size_t g_exc_registered_n;

/* The stream's next task id, taken by a task as it is queued.
   hicann/runtime@681ef76:src/runtime/core/src/task/task_submit/v100/task_submit.cc:232-233:
     taskId = (last != MAX_UINT16_NUM) ? ((last + 1) % MAX_UINT16_NUM) : 0   (ids 0..65534);
   stream.cc:2351-2355 (SetMaxTaskId: maxTaskId_ = 0xFFFF - 1) and task_manager.cc:348-361
   (UpdateFlipNum: the flip count goes up after the task with the max id); task_manager.cc:469-475
   (GetFlipTaskId: (flipNum << 16) | id). A runtime-internal task (e.g. the flip task of
   task_submit.cc:706) takes an id the same way. */
static uint32_t take_task_id(stream_t *s) {
    uint32_t id = s->rt_next, flip = s->rt_flip;
    if (id == 0xFFFFu - 1u) {
        s->rt_next = 0;
        s->rt_flip = (s->rt_flip + 1u) & 0xFFFFu;
    } else {
        s->rt_next = id + 1u;
    }
    return (flip << 16) | id;
}

static uint32_t next_task_id(stream_t *s) {
    if (g_internal_every && s->submitted % g_internal_every == 0) (void)take_task_id(s);
    return take_task_id(s);
}

static void note_touched(task_t *t, uint64_t base) {
    for (int i = 0; i < t->ntouched; i++)
        if (t->touched[i] == base) return;
    if (t->ntouched < 4) t->touched[t->ntouched++] = base;
}

/* A kernel finishes: it writes back what it read at its start. Memory freed meanwhile is a
   use after free (the runtime frees at once: docs/zh/api_ref/11-01_device_memory_malloc_and_free.md,
   aclrtFree does not wait for tasks using it). */
static void check_touched(task_t *t) {
    for (int i = 0; i < t->ntouched; i++)
        if (!dev_find(t->touched[i])) g_use_after_free++;
}

static int touched_by(const task_t *t, uint64_t base) {
    for (int i = 0; i < t->ntouched; i++)
        if (t->touched[i] == base) return 1;
    return 0;
}

/* ---- aclrtDestroyStreamForce keeps the running task ------------------------------------------ */

/* hicann/runtime@681ef76:docs/zh/api_ref/06_stream_management.md:8 (and :272-310):
   aclrtDestroyStreamForce "does not wait for unfinished tasks, destroys the stream at once";
   stopping a running task is aclrtStreamAbort's (:15), not this call's. So the task already
   running goes on to its end; only the queued ones are dropped. */
typedef struct zombie { struct zombie *next; stream_t *s; task_t *t; int device; } zombie_t;
static zombie_t *g_zombies;

static void keep_running(stream_t *s) {
    task_t *t = s->head;
    if (!t || t->kind != T_KERNEL || !t->started) return;
    s->head = t->next;
    if (!s->head) s->tail = NULL;
    s->depth--;
    g_queued_tasks--;
    zombie_t *z = malloc(sizeof *z);
    if (!z) abort();
    s->refs++; /* the zombie's step still reads its stream (failure mode, exception info) */
    *z = (zombie_t){g_zombies, s, t, s->ctx->device};
    g_zombies = z;
}

static void zombie_free(zombie_t *z) {
    task_free(z->t);
    stream_unref(z->s);
    free(z);
}

/* Run the zombies (device thread, g_mu held): 1 if one finished. */
static int step_zombies(uint64_t now, uint64_t *next_deadline) {
    int progress = 0;
    for (zombie_t **pp = &g_zombies; *pp;) {
        zombie_t *z = *pp;
        if (!z->s->ctx->fault_code && step(z->s, z->t, now, next_deadline)) {
            *pp = z->next;
            zombie_free(z);
            progress = 1;
        } else {
            pp = &z->next;
        }
    }
    return progress;
}

/* aclrtResetDevice / aclFinalize: nothing of the device runs on. */
static void drop_zombies(int device) {
    for (zombie_t **pp = &g_zombies; *pp;) {
        zombie_t *z = *pp;
        if (z->device == device) {
            *pp = z->next;
            zombie_free(z);
        } else {
            pp = &z->next;
        }
    }
}

/* Is any task of the context unfinished (zombies included)? g_mu held. The double waits for
   the current context's tasks only: whether the runtime also waits for other contexts on the
   device is not settled by the docs ("the Device of the current Context"). */
static int device_busy(ctx_t *c) {
    if (c->fault_code) return 0;
    for (zombie_t *z = g_zombies; z; z = z->next)
        if (z->s->ctx == c) return 1;
    for (stream_t *s = g_streams; s; s = s->next_all)
        if (s->ctx == c && s->completed < s->submitted) return 1;
    return 0;
}

/* aclrtFree of `base`: a kernel still running that uses it will write freed memory. g_mu held. */
static void check_free_under_running(uint64_t base) {
    for (zombie_t *z = g_zombies; z; z = z->next)
        if (touched_by(z->t, base)) g_use_after_free++;
    for (stream_t *s = g_streams; s; s = s->next_all)
        if (s->head && s->head->kind == T_KERNEL && s->head->started && touched_by(s->head, base))
            g_use_after_free++;
}

/* ---- the API ------------------------------------------------------------------------------ */

/* hicann/runtime@681ef76:docs/zh/api_ref/04_device_management.md:1174-1200: blocks until the
   device of the current context has finished; returns ACL_ERROR_RT_STREAM_SYNC_TIMEOUT when the
   timeout runs out (-1: no timeout). A faulted context answers with its fault. */
#ifndef ACL_DOUBLE_LEGACY /* the legacy build stands for a release without it */
EXPORT aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout) {
    ENTER("aclrtSynchronizeDeviceWithTimeout", 1, I(timeout));
    pthread_mutex_lock(&g_mu);
    aclError rc = 0;
    ctx_t *c = need_ctx(&rc);
    if (!c) LEAVE_UNLOCK(rc);
    if (timeout == 0 || timeout < -1)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "timeout %d ms: must be -1 or > 0", timeout));
    uint64_t deadline = deadline_after_ms(timeout);
    for (;;) {
        read_unread_fault(c);
        if ((rc = ctx_fault(c))) break;
        if (!device_busy(c)) break;
        if (now_ns() >= deadline) {
            rc = fail(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, "device not idle after %d ms", timeout);
            break;
        }
        cv_wait(&g_done_cv, deadline);
    }
    LEAVE_UNLOCK(rc);
}
#endif

#if HAS_83 && !defined(ACL_DOUBLE_LEGACY)
/* hicann/runtime@681ef76:src/runtime/api/impl/api_impl.cc:8353-8357: the calling thread's
   InnerThreadLocalContainer::GetLastTaskId(), set by each submission of the thread to its task's
   flip id (inner_thread_local.hpp:85-91, GET_THREAD_TASKID_AND_STREAMID). Listed from 8.2.RC1. */
EXPORT aclError aclrtGetThreadLastTaskId(uint32_t *taskId) {
    ENTER("aclrtGetThreadLastTaskId", 1, P(taskId));
    if (!taskId) LEAVE(fail(ACL_ERROR_RT_PARAM_INVALID, "taskId is NULL"));
    *taskId = t_last_task_id;
    LEAVE(0);
}
#endif

#if HAS_91 && !defined(ACL_DOUBLE_LEGACY)
/* hicann/runtime@681ef76:include/external/acl/acl_rt.h:1196-1222 and
   src/acl/aclrt_impl/callback.cpp:53-74: each callback is registered under a name made from its
   pointer, so several coexist (the deprecated aclrtSetExceptionInfoCallback keeps its one
   module-wide slot); registering the same one again adds nothing; unregistering one that is not
   registered succeeds; NULL is refused. */
EXPORT aclError aclrtExceptionInfoCallbackRegister(void (*callback)(struct aclrtExceptionInfo *)) {
    ENTER("aclrtExceptionInfoCallbackRegister", 1, P(callback));
    pthread_mutex_lock(&g_mu);
    if (!callback) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "callback is NULL"));
    for (size_t i = 0; i < g_exc_registered_n; i++)
        if (g_exc_registered[i] == callback) LEAVE_UNLOCK(0);
    if (g_exc_registered_n == MAX_REGISTERED)
        LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "too many exception callbacks (double limit)"));
    g_exc_registered[g_exc_registered_n++] = callback;
    LEAVE_UNLOCK(0);
}

EXPORT aclError aclrtExceptionInfoCallbackUnregister(void (*callback)(struct aclrtExceptionInfo *)) {
    ENTER("aclrtExceptionInfoCallbackUnregister", 1, P(callback));
    pthread_mutex_lock(&g_mu);
    if (!callback) LEAVE_UNLOCK(fail(ACL_ERROR_RT_PARAM_INVALID, "callback is NULL"));
    for (size_t i = 0; i < g_exc_registered_n; i++) {
        if (g_exc_registered[i] == callback) {
            g_exc_registered[i] = g_exc_registered[--g_exc_registered_n];
            break;
        }
    }
    LEAVE_UNLOCK(0);
}
#endif

/* ---- controls ----------------------------------------------------------------------------- */

/* Start a stream's task ids at (flip << 16) | id, to cross the wrap in a test. */
EXPORT int double_set_next_task_id(void *stream, uint32_t id, uint32_t flip) {
    pthread_mutex_lock(&g_mu);
    int ok = live_is(stream, K_STREAM) && id < 0xFFFFu;
    if (ok) {
        ((stream_t *)stream)->rt_next = id;
        ((stream_t *)stream)->rt_flip = flip & 0xFFFFu;
    }
    pthread_mutex_unlock(&g_mu);
    return ok ? 0 : -1;
}

/* Every Nth submission on a stream is preceded by a runtime-internal task taking an id (0: none). */
EXPORT void double_set_internal_tasks(uint32_t every) {
    pthread_mutex_lock(&g_mu);
    g_internal_every = every;
    pthread_mutex_unlock(&g_mu);
}

/* A full stream refuses a submission with `code` instead of blocking (0: block again). */
EXPORT void double_set_full_refusal(int code) {
    pthread_mutex_lock(&g_mu);
    g_full_refusal = code;
    pthread_mutex_unlock(&g_mu);
}

/* The next stream created gets this id (the runtime reuses a destroyed stream's id). */
EXPORT void double_set_next_stream_id(int32_t id) {
    pthread_mutex_lock(&g_mu);
    g_next_stream_id = id;
    pthread_mutex_unlock(&g_mu);
}

EXPORT uint64_t double_use_after_free(void) {
    pthread_mutex_lock(&g_mu);
    uint64_t n = g_use_after_free;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* End the device's tasks that outlived their stream (a test's hung kernel), as a reset would. */
EXPORT void double_drop_zombies(int device) {
    pthread_mutex_lock(&g_mu);
    drop_zombies(device);
    pthread_cond_broadcast(&g_done_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Tasks still running after their stream was destroyed by force. */
EXPORT int64_t double_zombies(void) {
    pthread_mutex_lock(&g_mu);
    int64_t n = 0;
    for (zombie_t *z = g_zombies; z; z = z->next) n++;
    pthread_mutex_unlock(&g_mu);
    return n;
}
