/* aio_ascend._runtime.acl._native: submit a run of kernel launches in one call.
 *
 * One call reads the launches' fields from the request objects (GIL held), then calls
 * aclrtLaunchKernelWithHostArgs for each of them with the GIL released, reading the runtime's
 * task id after each one (aclrtGetThreadLastTaskId, where the library has it), and stops at the
 * first refusal. Nothing is linked against libascendcl: the caller passes the addresses of the
 * functions in the library it loaded with ctypes, so the same functions (and the same
 * per-thread state: current context, last task id, last error text) are reached as through
 * ctypes. Built when a C compiler is present at install (setup.py); without it the acl backend
 * launches one by one through ctypes (aio_ascend/_runtime/acl/batch.py).
 *
 * launch_batch(launch, task_id, requests, check_table, limits) -> (submitted, status)
 *   launch:      address of aclrtLaunchKernelWithHostArgs
 *   task_id:     address of aclrtGetThreadLastTaskId, or 0 (positions are then -1)
 *   requests:    a list of objects with func, blocks, cfg, host.addr, nbytes, table_offset,
 *                placeholder_count and lane.handle; each submitted one gets `position`
 *   check_table: called as check_table(table_addr, count, args_size) for a launch with
 *                placeholders, before anything is launched (the one definition of the table's
 *                rules); if it raises, that launch is left to the per-launch path
 *   limits:      (max blocks, max args size, max placeholders): the fast check's bounds
 *   submitted:   how many of requests (from the first) were submitted
 *   status:      0: all of them; > 0: the aclError that refused requests[submitted];
 *                -1: requests[submitted] is not for this path (a launch config, a value the
 *                fast check does not pass, a table check that raised): the caller submits it
 *                through the per-launch method, which raises the precise error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*launch_fn)(void *func, uint32_t num_blocks, void *stream, void *cfg, void *host_args,
                         size_t args_size, void *placeholders, size_t placeholder_num);
typedef int (*task_id_fn)(uint32_t *task_id);

typedef struct {
    uint64_t func, stream, addr, nbytes, table, count;
    uint32_t blocks;
} item_t;

static PyObject *s_func, *s_blocks, *s_cfg, *s_host, *s_addr, *s_nbytes, *s_table_offset,
    *s_placeholder_count, *s_lane, *s_handle, *s_position, *s_spec;

/* an int attribute as uint64 (0 on success); -1 when absent, not an exact int, or negative */
static int get_u64(PyObject *obj, PyObject *name, uint64_t *out) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) return -1;
    int ok = PyLong_CheckExact(value);
    if (ok) {
        *out = PyLong_AsUnsignedLongLong(value);
        ok = !(*out == (uint64_t)-1 && PyErr_Occurred());
    }
    Py_DECREF(value);
    return ok ? 0 : -1;
}

/* what a launch's spec gives, read once per run of launches of one spec */
typedef struct {
    PyObject *spec; /* borrowed: the requests hold their specs */
    uint64_t func, blocks, nbytes, table_offset, count;
} spec_t;

static int read_spec(PyObject *spec, spec_t *sp) {
    PyObject *cfg = PyObject_GetAttr(spec, s_cfg);
    if (cfg == NULL) return -1;
    int plain = cfg == Py_None;
    Py_DECREF(cfg);
    if (!plain || get_u64(spec, s_func, &sp->func) || get_u64(spec, s_blocks, &sp->blocks) ||
        get_u64(spec, s_nbytes, &sp->nbytes) || get_u64(spec, s_table_offset, &sp->table_offset) ||
        get_u64(spec, s_placeholder_count, &sp->count))
        return -1;
    sp->spec = spec;
    return 0;
}

/* requests[i] as a C launch; 0 on success, -1 when it is not for this path (no error set) */
static int read_item(PyObject *req, item_t *it, PyObject **last_lane, uint64_t *last_stream,
                     spec_t *last_spec, PyObject *check_table, const uint64_t *limits) {
    PyObject *spec = PyObject_GetAttr(req, s_spec);
    if (spec == NULL) goto refuse;
    int bad_spec = spec != last_spec->spec && read_spec(spec, last_spec);
    Py_DECREF(spec); /* borrowed from here on: the request holds its spec */
    if (bad_spec) {
        last_spec->spec = NULL;
        goto refuse;
    }
    PyObject *lane = PyObject_GetAttr(req, s_lane);
    if (lane == NULL) goto refuse;
    if (lane == *last_lane) { /* runs are mostly one stream's: read its handle once */
        it->stream = *last_stream;
    } else if (get_u64(lane, s_handle, &it->stream)) {
        Py_DECREF(lane);
        goto refuse;
    }
    *last_lane = lane; /* borrowed from here on: the request holds its lane */
    *last_stream = it->stream;
    Py_DECREF(lane);
    PyObject *host = PyObject_GetAttr(req, s_host);
    if (host == NULL) goto refuse;
    int bad = get_u64(host, s_addr, &it->addr);
    Py_DECREF(host);
    if (bad) goto refuse;
    uint64_t blocks = last_spec->blocks, table_offset = last_spec->table_offset;
    it->func = last_spec->func;
    it->nbytes = last_spec->nbytes;
    it->count = last_spec->count;
    /* the per-launch method's fast check, with abi's bounds; anything else goes there */
    if (!(it->addr > 0 && blocks >= 1 && blocks <= limits[0] && it->nbytes >= 1 &&
          it->nbytes <= limits[1] && it->count <= limits[2]))
        goto refuse;
    it->blocks = (uint32_t)blocks;
    it->table = 0;
    if (it->count) {
        if (table_offset > UINT64_MAX - it->addr) goto refuse;
        it->table = it->addr + table_offset;
        PyObject *r = PyObject_CallFunction(check_table, "KKK", (unsigned long long)it->table,
                                            (unsigned long long)it->count,
                                            (unsigned long long)it->nbytes);
        if (r == NULL) goto refuse;
        Py_DECREF(r);
    }
    return 0;
refuse:
    PyErr_Clear();
    return -1;
}

static PyObject *launch_batch(PyObject *self, PyObject *args) {
    unsigned long long launch_addr, task_addr;
    PyObject *requests, *check_table;
    unsigned long long lim0, lim1, lim2;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKO!O(KKK)", &launch_addr, &task_addr, &PyList_Type, &requests,
                          &check_table, &lim0, &lim1, &lim2))
        return NULL;
    if (!launch_addr) {
        PyErr_SetString(PyExc_ValueError, "launch_batch: the launch function's address is 0");
        return NULL;
    }
    const uint64_t limits[3] = {lim0, lim1, lim2};
    Py_ssize_t n = PyList_GET_SIZE(requests);
    if (n == 0) return Py_BuildValue("(ni)", (Py_ssize_t)0, 0);
    item_t *items = PyMem_Malloc(sizeof(item_t) * (size_t)n);
    int64_t *ids = PyMem_Malloc(sizeof(int64_t) * (size_t)n);
    if (items == NULL || ids == NULL) {
        PyMem_Free(items);
        PyMem_Free(ids);
        return PyErr_NoMemory();
    }
    /* 1. read every launch (GIL held); the run ends before the first one not for this path */
    Py_ssize_t count = 0;
    int status = 0;
    PyObject *last_lane = NULL;
    uint64_t last_stream = 0;
    spec_t last_spec = {NULL, 0, 0, 0, 0, 0};
    for (; count < n; count++) {
        PyObject *req = PyList_GET_ITEM(requests, count);
        if (read_item(req, &items[count], &last_lane, &last_stream, &last_spec, check_table,
                      limits)) {
            status = -1;
            break;
        }
    }
    /* 2. launch them without the GIL, the task id after each; stop at the first refusal */
    launch_fn launch = (launch_fn)(uintptr_t)launch_addr;
    task_id_fn task_id = (task_id_fn)(uintptr_t)task_addr;
    Py_ssize_t done = 0;
    if (count) {
        Py_BEGIN_ALLOW_THREADS
        for (; done < count; done++) {
            item_t *it = &items[done];
            int rc = launch((void *)(uintptr_t)it->func, it->blocks, (void *)(uintptr_t)it->stream,
                            NULL, (void *)(uintptr_t)it->addr, (size_t)it->nbytes,
                            (void *)(uintptr_t)it->table, (size_t)it->count);
            if (rc) {
                status = rc;
                break;
            }
            uint32_t id = 0;
            ids[done] = task_id != NULL && task_id(&id) == 0 ? (int64_t)id : -1;
        }
        Py_END_ALLOW_THREADS
    }
    /* 3. each submitted request's position: the runtime's id of its task. They were submitted:
       a position that cannot be set (no such request from the scheduler) stays as it was, and
       only the fault attribution of that one request is lost, never the submission's result */
    for (Py_ssize_t i = 0; i < done; i++) {
        PyObject *position = PyLong_FromLongLong(ids[i]);
        if (position == NULL || PyObject_SetAttr(PyList_GET_ITEM(requests, i), s_position, position))
            PyErr_Clear();
        Py_XDECREF(position);
    }
    PyMem_Free(items);
    PyMem_Free(ids);
    return Py_BuildValue("(ni)", done, status);
}

static PyMethodDef methods[] = {
    {"launch_batch", launch_batch, METH_VARARGS,
     "launch_batch(launch, task_id, requests, check_table, limits) -> (submitted, status)\n\n"
     "Submit a run of launches through aclrtLaunchKernelWithHostArgs (at address `launch`), "
     "the GIL released, stopping at the first refusal; see the module source for the rest."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "One native call per run of acl kernel launches (built when a C compiler is present).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {
        {&s_func, "func"},       {&s_blocks, "blocks"},
        {&s_cfg, "cfg"},         {&s_host, "host"},
        {&s_addr, "addr"},       {&s_nbytes, "nbytes"},
        {&s_table_offset, "table_offset"}, {&s_placeholder_count, "placeholder_count"},
        {&s_lane, "lane"},       {&s_handle, "handle"},
        {&s_position, "position"}, {&s_spec, "spec"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].name);
        if (*names[i].slot == NULL) return NULL;
    }
    return PyModule_Create(&module);
}
