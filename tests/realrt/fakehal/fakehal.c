/*
 * A fake Ascend driver (libascend_hal.so) that plays one Ascend 910B1 to the real CANN runtime
 * built from its public source (tests/realrt/build.sh). Written from the public driver headers
 * (pkg_inc/driver/ascend_hal*.h) and from what the runtime calls; every behaviour cites the
 * runtime line (paths relative to the hicann/runtime tree) it answers.
 *
 * The device is host memory and threads:
 * - device and pinned host allocations are distinct blocks of host memory (aligned like a
 *   device's), so a copy or a memset moves real bytes;
 * - each normal submission queue (one per stream) has its own worker thread that runs the
 *   queue's SQEs in order: copies (SDMA, PCIe DMA), event record / wait / reset, notify
 *   record / wait, write value, place holders, kernel launches (a plain kernel's FFTS SQE, a
 *   MIX kernel's FFTS+ SQE and its context): the PC address of a launch points at the kernel's
 *   code the runtime copied to device memory at load, where tests/realrt/make_kernel_elf.py put
 *   a marker with the kernel's name; the host function of that name (kernels.c) runs over the
 *   args the runtime built.
 *   Anything else completes without effect. After each SQE the SQ head moves (what the
 *   runtime polls) and, when the SQE asks for one (wr_cqe) or failed, a completion (CQE) is
 *   queued for the stream's logic CQ, read by halCqReportRecv. A failed SQE stops its queue
 *   until the runtime, having handled the error, moves the head past it and enables the queue
 *   again (halSqCqConfig: sqconfig.c, fh_sq_config). Before a failed SQE's CQE, the firmware's
 *   record of the failure goes into the error ringbuffer the runtime handed over at open,
 *   where the runtime looks for it (fh_ringbuffer_report_locked);
 * - a captured graph (a model): the queue of a stream bound to a model runs nothing until a
 *   model execution on another queue activates it, then runs its SQEs from the first, its last
 *   one recording the notify the executing stream waits for (fh_model_maintaince,
 *   fh_model_execute); a failure in it fails that wait (fh_model_fault_locked);
 * - controls for tests, exported as C functions (ctypes): a delay per SQE, an error completion
 *   injected into the Nth next SQE of a stream, holding one stream's SQEs, counters, and the
 *   last kernel launch as the device saw it (name, blocks, args buffer).
 *
 * Every other symbol of the public headers comes from a stub generated from them
 * (cmake/stub/h2c.py of the runtime: `return 0`), linked in with weak symbols, so what is not
 * modelled answers "success, nothing to report" as the runtime's own unit-test stub does. A
 * function the headers declare ASCEND_HAL_WEAK stays weak when defined here, and the stub's
 * wins: such functions are defined in files without the driver headers (memctl.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ascend_hal.h"
#include "fakehal.h"
#include "runtime/rt_external_ffts_define.h"

/* ---- SQE and CQE layouts, mirrored from the runtime's internal headers ------------------ */

/* src/runtime/core/inc/task/task_info_base.hpp:42 (packed, task_info_base.hpp:40-41) */
#pragma pack(push, 1)
struct fh_sqe_header {
    uint8_t type : 6;
    uint8_t l1_lock : 1;
    uint8_t l1_unlock : 1;
    uint8_t ie : 2;
    uint8_t pre_p : 2;
    uint8_t post_p : 2;
    uint8_t wr_cqe : 1;
    uint8_t reserved : 1;
    uint16_t block_dim;
    uint16_t rt_stream_id;
    uint16_t task_id;
};

/* src/runtime/core/inc/sqe/v100/stars_dma.hpp:125 RtStarsMemcpyAsyncSqe */
struct fh_sdma_sqe {
    struct fh_sqe_header header;
    uint32_t res3;
    uint16_t res4;
    uint8_t kernel_credit;
    uint8_t ptr_mode : 1;
    uint8_t res5 : 7;
    uint32_t opcode : 8;
    uint32_t flags : 24;
    uint16_t src_streamid;
    uint16_t src_sub_streamid;
    uint16_t dst_streamid;
    uint16_t dst_sub_streamid;
    uint32_t length;
    uint32_t src_addr_low;
    uint32_t src_addr_high;
    uint32_t dst_addr_low;
    uint32_t dst_addr_high;
    uint32_t src_offset_low;
    uint32_t dst_offset_low;
    uint16_t src_offset_high;
    uint16_t dst_offset_high;
    uint32_t res_last;
};

/* src/runtime/core/inc/sqe/v100/stars_dma.hpp:47 RtStarsPcieDmaSqe */
struct fh_pcie_dma_sqe {
    struct fh_sqe_header header;
    uint32_t res0;
    uint16_t res1;
    uint16_t kernel_credit : 8;
    uint16_t res2 : 8;
    uint32_t sq_addr_low;
    uint32_t sq_addr_high;
    uint16_t sq_tail_ptr;
    uint16_t res3;
    uint32_t is_converted : 1;
    uint32_t is_dsa_update : 1;
    uint32_t is_sqe_update : 1;
    uint32_t offset : 8;
    uint32_t res4 : 21;
    uint64_t src;
    uint64_t dst;
    uint64_t length;
    uint32_t passid;
    uint32_t res5;
};

/* src/runtime/core/inc/sqe/v100/stars_kernel.hpp:296 RtStarsEventSqe */
struct fh_event_sqe {
    struct fh_sqe_header header;
    uint16_t event_id;
    uint16_t res2;
    uint16_t res3;
    uint8_t kernel_credit;
    uint8_t res4;
    uint32_t exe_result;
    uint32_t timeout;
    uint32_t res5[10];
};

/* src/runtime/core/inc/sqe/v100/stars_sqe.hpp:51 RtStarsWriteValueSqe */
struct fh_write_value_sqe {
    struct fh_sqe_header header;
    uint32_t res3;
    uint32_t res4 : 16;
    uint32_t kernel_credit : 8;
    uint32_t res5 : 8;
    uint32_t write_addr_low;
    uint32_t write_addr_high : 17;
    uint32_t res6 : 3;
    uint32_t awsize : 3;
    uint32_t snoop : 1;
    uint32_t awcache : 4;
    uint32_t awprot : 3;
    uint32_t va : 1;
    uint32_t res7; /* the event id of an event reset */
    uint32_t sub_type;
    uint32_t write_value[8];
};
/* src/runtime/core/inc/sqe/v100/stars_kernel.hpp:164 RtFftsPlusKernelSqe: a plain (not MIX)
 * kernel's launch, built by davinci_kernel_task_v100.cc:816-948 ConstructAICoreSqeForDavinciTask */
struct fh_kernel_sqe {
    struct fh_sqe_header header;
    uint16_t ffts_type : 3;
    uint16_t res1 : 9;
    uint16_t wrr_ratio : 4;
    uint16_t res2;
    uint16_t sqe_index;
    uint16_t kernel_credit : 8;
    uint16_t schem : 2;
    uint16_t res3 : 1;
    uint16_t icache_prefetch_cnt : 5;
    uint32_t stack_phy_base_low;
    uint32_t stack_phy_base_high;
    uint32_t res4;
    uint32_t pmg_ns_part_qos;
    uint32_t pc_addr_low;
    uint32_t pc_addr_high : 16;
    uint32_t res7 : 16;
    uint32_t param_addr_low;
    uint32_t param_addr_high; /* bits 20-31 carry a stack level when minStackSize > 0 (:925-932) */
    uint32_t res8[4];
};

/* pkg_inc/runtime/rt_external_stars_define.h:98-146 rtFftsPlusSqe_t: a MIX kernel's launch, its
 * context (rtFftsPlusMixAicAivCtx_t) in device memory at contextAddressBase
 * (davinci_kernel_task_v100.cc:282-390 FillFftsMixSqeForDavinciTask) */
struct fh_ffts_plus_sqe {
    struct fh_sqe_header header;
    uint16_t ffts_type : 3;
    uint16_t res1 : 13;
    uint16_t res2;
    uint16_t sqe_index;
    uint8_t kernel_credit;
    uint8_t sub_type;
    uint32_t stack_phy_base_low;
    uint32_t stack_phy_base_high;
    uint16_t total_context_num;
    uint16_t ready_context_num;
    uint16_t preload_context_num;
    uint16_t timeout;
    uint32_t res3;
    uint32_t res4;
    uint32_t context_address_base_low;
    uint32_t context_address_base_high : 17;
    uint32_t res5 : 15;
    uint32_t res6[4];
};

/* src/runtime/core/inc/sqe/v100/stars_kernel.hpp:309 RtStarsNotifySqe: a notify record or wait
 * (notify_task_v100.cc:23-41, 150-170) */
struct fh_notify_sqe {
    struct fh_sqe_header header;
    uint32_t notify_id : 13;
    uint32_t res2 : 19;
    uint16_t res3;
    uint8_t kernel_credit;
    uint8_t res4;
    uint32_t timeout;
    uint32_t res5[11];
};

/* src/runtime/core/inc/sqe/v100/stars_sqe.hpp:426 RtStarsFunctionCallSqe: a condition SQE whose
 * STARS condition-ISA program loads a function's address into r1 and its size in 4-byte words
 * into r2 (each with an LHWI and an LLWI: stars_cond_isa_construct_common.cc:84-99), then calls
 * it (stars_cond_isa_helper.hpp:244-264 ConstructFunctionCallInstr) */
struct fh_func_call_sqe {
    struct fh_sqe_header header;
    uint8_t conds_sub_type;
    uint8_t res0[3];
    uint16_t model_id; /* reserved1: the model of a model execute (model_execute_task_v100.cc:60) */
    uint8_t kernel_credit;
    uint8_t res1 : 7;
    uint8_t csc : 1;
    uint32_t lhwi1, llwi1[2]; /* r1: the function's address */
    uint32_t lhwi2, llwi2[2]; /* r2: its size in words */
    uint32_t func_call;
    uint32_t nop[5];
};

/* src/runtime/core/inc/sqe/v100/stars_sqe.hpp:265 RtStarsPhSqe with :174-184 RtStarsModelMaintaince:
 * a model maintenance task for the TS CPU (model_maintaince_task_v100.cc:23-96) */
struct fh_model_maintaince_sqe {
    struct fh_sqe_header header; /* type 3; task type 12 where block_dim sits */
    uint8_t res[8];
    uint16_t model_id;
    uint16_t stream_id;
    uint16_t operation; /* MmtType, task_base.hpp:236-245 */
    uint16_t stream_type;
    uint16_t first_task_id;
    uint16_t endgraph_notify_id;
    uint32_t executor_flag;
    uint64_t stream_exec_times_addr;
    uint32_t reserved[6];
};
#pragma pack(pop)

/* src/runtime/core/inc/task/task_info_base.hpp:354 rtCqReport_t (not packed: 32 bytes) */
struct fh_cqe {
    volatile uint16_t stream_id;
    volatile uint16_t task_id;
    volatile uint32_t error_code;
    volatile uint8_t error_type;
    volatile uint8_t sqe_type;
    volatile uint16_t sq_id;
    volatile uint16_t sq_head;
    volatile uint16_t match_flag : 1;
    volatile uint16_t drop_flag : 1;
    volatile uint16_t error_bit : 1;
    volatile uint16_t acc_error : 1;
    volatile uint16_t next_task_vld : 1;
    volatile uint16_t notify_attached : 1;
    volatile uint16_t reserved0 : 10;
    volatile uint64_t timestamp;
    volatile uint64_t reserved1;
};

_Static_assert(sizeof(struct fh_sqe_header) == 8, "STARS SQE header is 8 bytes");
_Static_assert(sizeof(struct fh_sdma_sqe) == 64, "STARS SQE is 64 bytes");
_Static_assert(sizeof(struct fh_pcie_dma_sqe) == 64, "STARS SQE is 64 bytes");
_Static_assert(sizeof(struct fh_event_sqe) == 64, "STARS SQE is 64 bytes");
_Static_assert(sizeof(struct fh_write_value_sqe) == 64, "STARS SQE is 64 bytes");
_Static_assert(sizeof(struct fh_kernel_sqe) == 64, "STARS SQE is 64 bytes");
_Static_assert(sizeof(struct fh_ffts_plus_sqe) == 64, "STARS SQE is 64 bytes");
_Static_assert(sizeof(struct fh_notify_sqe) == 64, "STARS SQE is 64 bytes");
_Static_assert(sizeof(struct fh_func_call_sqe) == 64, "STARS SQE is 64 bytes");
_Static_assert(sizeof(struct fh_model_maintaince_sqe) == 64, "STARS SQE is 64 bytes");
_Static_assert(sizeof(struct fh_cqe) == 32, "rtCqReport_t is 32 bytes");

/* ---- the device error ringbuffer (what TS firmware writes when a task fails) -----------
 * The runtime allocates it in device memory, hands its address to the device with a place
 * holder SQE of task type DEVICE_RINGBUFFER_CONTROL (device_error_proc.cc:385-437, 459-488;
 * ringbuffer_maintain_task_v100.cc:22-62), and, on every error CQE, polls it (copying it to
 * the host) until an element names the failed task, for up to 6 s twice
 * (device_error_proc.cc:638-744; stars_engine.cc:1625-1629). Layouts from
 * src/runtime/core/inc/device/device_error_info.hpp and device_error_inner_data.hpp. */
#pragma pack(push, 1)
/* stars_sqe.hpp:222-229 RtRingBufferControl inside :265-305 RtStarsPhSqe */
struct fh_ringbuffer_sqe {
    struct fh_sqe_header header; /* type 3; task_type where block_dim sits */
    uint8_t res[8];
    uint64_t ringbuffer_offset; /* the buffer's address (drvMemAddressTranslate: identity) */
    uint64_t ringbuffer_phy_addr;
    uint64_t pid;
    uint32_t total_len; /* a count of elements (RINGBUFFER_LEN), not bytes */
    uint8_t del_flag;   /* 1: the runtime stops using it (task_base.hpp:32) */
    uint8_t reserved[19];
};
#pragma pack(pop)
#define FH_TASK_TYPE_RINGBUFFER_CONTROL 83U /* task_base.hpp:165 */
#define FH_RB_MAGIC 0xA55A2020U             /* device_error_info.hpp:43 */
#define FH_RB_ELEMENT_SIZE 12288U           /* :45; fixed on STARS v1, device_error_proc.cc:1806 */
#define FH_RB_MAX_LEN 10U                   /* GetRingbufferElementNum, v100/device_error_proc.cc:52 */
enum { FH_RB_AICORE_ERROR = 0, FH_RB_AIVECTOR_ERROR = 1, FH_RB_SDMA_ERROR = 2 }; /* :53-74 */
/* device_error_info.hpp:212-220 DevRingBufferCtlInfo: the runtime writes magic and head back
 * (device_error_proc.cc:700-708), the device the rest; elements follow it
 * (GetRingBufferElement, :1640-1648) */
struct fh_rb_ctl {
    uint32_t magic, head, tail, ring_len;
    uint64_t pid;
    uint32_t element_size, reserved;
};
/* device_error_info.hpp:202-209 RingBufferElementInfo */
struct fh_rb_element {
    uint64_t pid;
    uint32_t info_len;
    uint32_t error_type;
    uint64_t error_number;
    uint16_t vf_id;
    uint8_t reserved[6];
};
/* device_error_inner_data.hpp:67-77 StarsErrorCommonInfo: the failed task's ids, which the
 * runtime looks up (device_error_core_proc.cc:1501-1504, setting isRingbufferGet) */
struct fh_rb_comm {
    uint16_t type, core_num, exception_slot_id;
    uint8_t flag, slot_num; /* flag 1 would take the MTE/RAS path (:1510-1525) */
    uint32_t chip_id, die_id;
    uint16_t stream_id, task_id;
};
/* device_error_inner_data.hpp:263-285 StarsOneCoreErrorInfoRingBuffer */
struct fh_rb_core {
    uint64_t core_id, aic_error[3], pc_start, current_pc;
    uint64_t vec_err, mte_err, ifu_err, ccu_err, cube_err, biu_err;
    uint32_t fixp_error0, fixp_error1;
    uint64_t aic_error_mask, para_base;
    uint32_t fsm_id, fsm_tslot, fsm_thread, fsm_cxt, fsm_blk, fsm_sublk, sub_err_type;
};
/* device_error_inner_data.hpp:287-290 StarsCoreErrorInfoRingBuffer (one core filled in) */
struct fh_rb_core_error {
    struct fh_rb_comm comm;
    struct fh_rb_core info[1];
};
_Static_assert(sizeof(struct fh_ringbuffer_sqe) == 64, "STARS SQE is 64 bytes");
_Static_assert(sizeof(struct fh_rb_ctl) == 32, "DevRingBufferCtlInfo is 32 bytes");
_Static_assert(sizeof(struct fh_rb_element) == 32, "RingBufferElementInfo is 32 bytes");
_Static_assert(sizeof(struct fh_rb_comm) == 20, "StarsErrorCommonInfo is 20 bytes");
_Static_assert(sizeof(struct fh_rb_core) == 152, "StarsOneCoreErrorInfoRingBuffer is 152 bytes");
_Static_assert(__builtin_offsetof(struct fh_rb_core_error, info) == 24, "core info at 24");

/* src/runtime/core/inc/sqe/v100/stars_sqe.hpp:25-45 */
enum {
    FH_SQE_FFTS = 0,
    FH_SQE_AICPU = 1,
    FH_SQE_PLACE_HOLDER = 3,
    FH_SQE_EVENT_RECORD = 4,
    FH_SQE_EVENT_WAIT = 5,
    FH_SQE_NOTIFY_RECORD = 6,
    FH_SQE_NOTIFY_WAIT = 7,
    FH_SQE_WRITE_VALUE = 8,
    FH_SQE_SDMA = 11,
    FH_SQE_PCIE_DMA = 17,
    FH_SQE_COND = 20,
};
#define FH_SQE_SIZE 64U
#define FH_TASK_TYPE_MODEL_MAINTAINCE 12U /* task_base.hpp:119 */
enum { FH_MMT_STREAM_ADD = 0, FH_MMT_STREAM_DEL = 1, FH_MMT_MODEL_PRE_PROC = 4 }; /* task_base.hpp:236-245 */
#define FH_CONDS_SUB_TYPE_MODEL_EXEC 1U /* stars_base.hpp:95 */

/* The model execute function (stars_model_execute_cond_isa_define.hpp:182-193 RtStarsModelExeFuncCall,
 * built by stars_cond_isa_helper.cc:221-626): its size, and where its LHWI/LLWI pairs load the
 * operands it works on (offsetof over the runtime's own headers, as built for runtime_v100) */
#define FH_MODEL_EXE_FUNC_SIZE 448U
#define FH_MODEL_EXE_HEAD_SQ_ARR 4U   /* scanSq.u.rootModelAdapt.lhwi1: the head SQs' ids (r1) */
#define FH_MODEL_EXE_HEAD_SQ_MAX 16U  /* .lhwi2: how many (r4) */
#define FH_MODEL_EXE_SQ_VIRT_ARR 208U /* checkSqDisable.lhwi1: every SQ's register page, by SQ id */
#define FH_MODEL_EXE_STREAM_SVM 344U  /* activeHeadSq.u.rootModelAdapt.lhwi1: execution counters */

/* ---- the device --------------------------------------------------------------------- */

/* PLAT_COMBINE(ARCH_C220 = 4, CHIP_910_B_93 = 5, RT_VER_BIN1 = 1): pkg_inc/runtime/runtime/config.h:23,
 * src/runtime/core/inc/soc/soc_define.hpp:24, src/runtime/core/inc/spec/base_info.hpp:182 */
#define FH_HW_VERSION 0x40501LL
#define FH_MAX_SQ 1024U
#define FH_MAX_CQ 1024U
#define FH_MAX_EVENT 65536U
#define FH_MAX_NOTIFY 8192U /* a notify SQE's 13-bit id */
#define FH_MAX_ID 65536U
#define FH_SQ_DEPTH 2048U
#define FH_SQ_REG_SIZE 4096U
#define FH_DEVICE_MEMORY (64ULL << 30) /* what halMemGetInfo reports: a 910B1's 64 GiB */
#define FH_ALIGN 512U

struct fh_sq {
    int valid;
    uint32_t stream_id;
    uint32_t cq_id;
    uint32_t head; /* next SQE to run (what SQ_HEAD reports) */
    uint32_t tail; /* next free slot */
    uint32_t depth;
    uint8_t* ring;
    uint8_t* regs; /* the queue's register page (SQ_REG_BASE); only device-side tasks use it */
    int stop;
    int halted;  /* stopped at a failed SQE (STARS disables the queue): the head stays put */
    int resumed; /* the runtime moved a halted queue's head past the failed SQE */
    int busy;    /* an SQE is in flight (a model's SQ: its state machine is not idle) */
    int bound;   /* the queue of a model's stream (fh_model_maintaince): it runs SQEs only while */
    int enabled; /* a model execution has activated it (fh_model_execute) */
    uint16_t model_id;
    pthread_t worker;
    pthread_cond_t more;
};

struct fh_cq {
    int valid;
    uint32_t stream_id;
    struct fh_cqe* ring;
    uint32_t head, count, depth;
};

struct fh_alloc {
    uintptr_t base;
    size_t size;
    uint32_t mem_type; /* DV_MEM_LOCK_DEV or DV_MEM_LOCK_HOST (drvMemGetAttribute) */
    void* raw;
    struct fh_alloc* next;
    uint32_t pins;   /* device accesses in progress (fh_pin) */
    uint32_t writes; /* of which writes */
    int freed;       /* freed while pinned: the last fh_unpin gives the memory back */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cq_cond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_event_cond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_hold_cond = PTHREAD_COND_INITIALIZER;
static struct fh_sq g_sq[FH_MAX_SQ];
static struct fh_cq g_cq[FH_MAX_CQ];
static uint8_t g_event_flag[FH_MAX_EVENT];
static uint8_t g_notify_flag[FH_MAX_NOTIFY];
static uint32_t g_notify_fault[FH_MAX_NOTIFY]; /* a model's failure, for its end-graph wait */
static uint16_t g_end_graph[FH_MAX_ID];        /* a model's end-graph notify + 1 (MMT_MODEL_PRE_PROC) */
static uint8_t g_id_used[DRV_INVALID_ID][FH_MAX_ID];
static struct fh_alloc* g_allocs;
/* The device memory freed last (fh_free), to tell an access to freed memory from an access to
 * memory the driver never knew (pageable host memory a copy names). */
#define FH_FREED_KEPT 256U
static struct {
    uintptr_t base;
    size_t size;
} g_freed[FH_FREED_KEPT];
static uint32_t g_freed_next;
static uint64_t g_freed_accesses; /* device writes refused: the memory was freed */
static uint64_t g_frees_in_use;   /* frees while the device was writing the memory */
static size_t g_dev_bytes;
static uint64_t g_sqe_count;

/* test controls */
static unsigned g_delay_us;
static uint8_t g_stream_held[FH_MAX_ID];
static long g_fail_after = -1;
static int g_fail_stream = -1;
static uint32_t g_fail_error_type = 1;
static uint32_t g_fail_error_code = 0x1;

/* kernel launches (fh_run_launch): how many ran, and the last one as the device saw it */
#define FH_MARKER "AIOKERN1" /* tests/realrt/make_kernel_elf.py MARKER */
#define FH_MARKER_LEN 8U
#define FH_CODE_SIZE 64U
#define FH_ARGS_KEEP 512U
#define FH_FFTS_PLUS_TYPE 4U /* rtFftsPlusType_t RT_FFTS_PLUS_TYPE, rt_external_stars_define.h:80 */
struct fh_launch {
    char name[FH_CODE_SIZE];
    uint32_t block_dim;
    uint32_t stream_id;
    uint32_t task_id;
    int mix;
    uint64_t pc;
    uint64_t args_addr;
    uint32_t args_len; /* what was kept of the args (the whole buffer for a MIX launch) */
    uint8_t args[FH_ARGS_KEEP];
};
static struct fh_launch g_last_launch;
static uint64_t g_launch_count;

/* the error ringbuffer the runtime handed over (0: none), its length in elements, and the
 * serial number of the last element written */
static uintptr_t g_rb_base;
static uint32_t g_rb_len;
static uint64_t g_rb_serial;

static int fh_trace_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char* v = getenv("AIO_FAKEHAL_TRACE");
        on = (v != NULL && v[0] == '1') ? 1 : 0;
    }
    return on;
}

#define FH_TRACE(...)                                    \
    do {                                                 \
        if (fh_trace_on()) {                             \
            fprintf(stderr, "[fakehal] " __VA_ARGS__);   \
            fputc('\n', stderr);                         \
        }                                                \
    } while (0)

/* Called by the generated stub (build.sh rewrites its bodies) for what is not modelled. */
FH_EXPORT int aio_fakehal_unmodelled(const char* name)
{
    FH_TRACE("unmodelled %s", name);
    return 0;
}

/* ---- test controls (ctypes) ---------------------------------------------------------- */

/* Every SQE takes at least this long on its worker (0: none). */
FH_EXPORT void aio_fakehal_set_delay_us(unsigned us) { g_delay_us = us; }

/* hold_stream(id, 1): the SQEs of the runtime stream `id` (the header's rt_stream_id, what
 * aclrtStreamGetId answers) stop at the head of their queue, as under a hung kernel; every
 * other queue runs on. Only a chosen stream is held because the runtime keeps queues of its
 * own (made at aclrtSetDevice) and waits on them without a timeout in its synchronize paths:
 * holding every queue hung the runtime's main thread inside the call, never returning.
 * hold_stream(-1, 0) releases every stream, and every queue stopped at a failed SQE. */
FH_EXPORT void aio_fakehal_hold_stream(int stream_id, int hold)
{
    pthread_mutex_lock(&g_lock);
    if (stream_id < 0) {
        memset(g_stream_held, 0, sizeof(g_stream_held));
        for (unsigned i = 0; i < FH_MAX_SQ; i++) {
            g_sq[i].halted = 0; /* and queues stopped at a failed SQE go on */
        }
    } else if ((unsigned)stream_id < FH_MAX_ID) {
        g_stream_held[stream_id] = (uint8_t)(hold != 0);
    }
    pthread_cond_broadcast(&g_hold_cond);
    pthread_mutex_unlock(&g_lock);
}

/* The SQE `after` SQEs from now (0: the next one) of the runtime stream `stream_id` (-1: of
 * any queue) completes with an error CQE: error_type is the STARS error bits (bit0-5,
 * rtCqReport_t::errorType), error_code the accelerator's status (rtCqReport_t::errorCode).
 * A chosen stream, because the runtime's own queues run SQEs of their own at any time. */
FH_EXPORT void aio_fakehal_fail_next(int stream_id, long after, uint32_t error_type,
                                     uint32_t error_code)
{
    pthread_mutex_lock(&g_lock);
    g_fail_stream = stream_id;
    g_fail_after = after;
    g_fail_error_type = error_type;
    g_fail_error_code = error_code;
    pthread_mutex_unlock(&g_lock);
}

FH_EXPORT uint64_t aio_fakehal_sqe_count(void) { return __atomic_load_n(&g_sqe_count, __ATOMIC_ACQUIRE); }

/* CQEs written and not read yet, over every logic CQ. */
FH_EXPORT unsigned aio_fakehal_unread_cqes(void)
{
    unsigned n = 0;
    pthread_mutex_lock(&g_lock);
    for (unsigned i = 0; i < FH_MAX_CQ; i++) {
        n += g_cq[i].valid ? g_cq[i].count : 0U;
    }
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* CQEs written for the runtime stream `stream_id` (what its SQE headers carry) and not read
 * yet: a stream's own count, which CQEs of earlier runtimes' streams do not disturb. */
FH_EXPORT unsigned aio_fakehal_unread_cqes_of(int stream_id)
{
    unsigned n = 0;
    pthread_mutex_lock(&g_lock);
    for (unsigned i = 0; i < FH_MAX_CQ; i++) {
        const struct fh_cq* cq = &g_cq[i];
        for (uint32_t k = 0; cq->valid && k < cq->count; k++) {
            n += (cq->ring[(cq->head + k) % cq->depth].stream_id == (uint16_t)stream_id) ? 1U : 0U;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Bytes of device memory allocated now. */
FH_EXPORT size_t aio_fakehal_device_bytes(void)
{
    pthread_mutex_lock(&g_lock);
    size_t n = g_dev_bytes;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Frees of memory the device was writing (fh_free) and device writes refused because the
 * memory was freed (fh_pin), both a caller's lifetime bug, into counts[0] and counts[1]. (Reads
 * are not counted: the runtime's forced stream destroy frees what its queue may still read;
 * see fh_free.) */
FH_EXPORT void aio_fakehal_memory_misuse(uint64_t counts[2])
{
    pthread_mutex_lock(&g_lock);
    counts[0] = g_frees_in_use;
    counts[1] = g_freed_accesses;
    pthread_mutex_unlock(&g_lock);
}

/* Both counts back to 0 (a test that misuses memory on purpose). */
FH_EXPORT void aio_fakehal_forgive_misuse(void)
{
    pthread_mutex_lock(&g_lock);
    g_frees_in_use = 0;
    g_freed_accesses = 0;
    pthread_mutex_unlock(&g_lock);
}

/* Submission queues allocated now. */
FH_EXPORT unsigned aio_fakehal_live_sqs(void)
{
    unsigned n = 0;
    pthread_mutex_lock(&g_lock);
    for (unsigned i = 0; i < FH_MAX_SQ; i++) {
        n += g_sq[i].valid ? 1U : 0U;
    }
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Kernel launches run so far (SQEs whose PC held one of our kernels' markers). */
/* The error ringbuffer: its length in elements (0: the runtime handed none over), head and tail
 * as the runtime and the driver last wrote them; returns how many elements the driver wrote. */
FH_EXPORT uint64_t aio_fakehal_ringbuffer(uint32_t* len, uint32_t* head, uint32_t* tail)
{
    pthread_mutex_lock(&g_lock);
    const struct fh_rb_ctl* ctl = (const struct fh_rb_ctl*)g_rb_base;
    *len = (ctl != NULL) ? g_rb_len : 0U;
    *head = (ctl != NULL) ? ctl->head : 0U;
    *tail = (ctl != NULL) ? ctl->tail : 0U;
    const uint64_t written = g_rb_serial;
    pthread_mutex_unlock(&g_lock);
    return written;
}

FH_EXPORT uint64_t aio_fakehal_launch_count(void)
{
    pthread_mutex_lock(&g_lock);
    uint64_t n = g_launch_count;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* The last kernel launch as the device saw it: the kernel's name, its block count, stream and
 * task id, whether it came as a MIX launch (FFTS+ SQE and context), its args address and the
 * first bytes of the args buffer the runtime built. Returns the bytes copied into `args`. */
FH_EXPORT uint32_t aio_fakehal_last_launch(char* name, size_t name_cap, uint8_t* args, size_t args_cap,
                                           uint64_t* info /* [block_dim, stream, task, mix, pc, args_addr] */)
{
    pthread_mutex_lock(&g_lock);
    const struct fh_launch* l = &g_last_launch;
    if (name_cap > 0) {
        snprintf(name, name_cap, "%s", l->name);
    }
    uint32_t n = (l->args_len < args_cap) ? l->args_len : (uint32_t)args_cap;
    memcpy(args, l->args, n);
    info[0] = l->block_dim;
    info[1] = l->stream_id;
    info[2] = l->task_id;
    info[3] = (uint64_t)l->mix;
    info[4] = l->pc;
    info[5] = l->args_addr;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* ---- device facts -------------------------------------------------------------------- */

drvError_t halGetAPIVersion(int* halAPIVersion)
{
    /* the version the headers were written for (ascend_hal.h __HAL_API_VERSION) */
    *halAPIVersion = __HAL_API_VERSION;
    return DRV_ERROR_NONE;
}

drvError_t drvGetDevNum(uint32_t* num_dev)
{
    *num_dev = 1;
    return DRV_ERROR_NONE;
}

drvError_t drvGetDevIDs(uint32_t* devices, uint32_t len)
{
    if (len > 0) {
        devices[0] = 0;
    }
    return DRV_ERROR_NONE;
}

drvError_t drvGetPlatformInfo(uint32_t* info)
{
    /* 1: online, the host side of a PCIe card (the runtime's RT_RUN_MODE_ONLINE; the UT stub,
     * tests/ut/runtime/runtime/test/platform/910B/stub/hal_stub.cc:665, answers the same) */
    *info = 1;
    return DRV_ERROR_NONE;
}

drvError_t drvDeviceGetPhyIdByIndex(uint32_t devIndex, uint32_t* phyId)
{
    *phyId = devIndex;
    return DRV_ERROR_NONE;
}

drvError_t drvDeviceGetIndexByPhyId(uint32_t phyId, uint32_t* devIndex)
{
    *devIndex = phyId;
    return DRV_ERROR_NONE;
}

drvError_t halGetDeviceInfo(uint32_t devId, int32_t moduleType, int32_t infoType, int64_t* value)
{
    if (devId != 0) {
        return DRV_ERROR_INVALID_DEVICE;
    }
    *value = 0;
    if (moduleType == MODULE_TYPE_SYSTEM && infoType == INFO_TYPE_VERSION) {
        /* the hardware version the runtime reads the chip from (runtime_keeper.cc:163-168) */
        *value = FH_HW_VERSION;
    } else if (moduleType == MODULE_TYPE_AICORE && infoType == INFO_TYPE_CORE_NUM) {
        *value = 24; /* a 910B1's cube cores (hal_stub.cc:170) */
    } else if (moduleType == MODULE_TYPE_VECTOR_CORE && infoType == INFO_TYPE_CORE_NUM) {
        *value = 48;
    } else if (moduleType == MODULE_TYPE_AICPU && infoType == INFO_TYPE_CORE_NUM) {
        *value = 6;
    } else if (moduleType == MODULE_TYPE_SYSTEM && infoType == INFO_TYPE_CORE_NUM) {
        *value = 1;
    }
    FH_TRACE("halGetDeviceInfo module=%d info=%d -> %lld", moduleType, infoType, (long long)*value);
    return DRV_ERROR_NONE;
}

drvError_t halGetPhyDeviceInfo(uint32_t phyId, int32_t moduleType, int32_t infoType, int64_t* value)
{
    return halGetDeviceInfo(phyId, moduleType, infoType, value);
}

/* ---- memory ---------------------------------------------------------------------------- */

static void* fh_alloc(size_t size, uint32_t mem_type)
{
    if (size == 0) {
        size = 1;
    }
    struct fh_alloc* a = calloc(1, sizeof(*a));
    if (a == NULL) {
        return NULL;
    }
    void* raw = NULL;
    if (posix_memalign(&raw, FH_ALIGN, size) != 0) {
        free(a);
        return NULL;
    }
    /* a device's fresh memory is not zero: a test that reads what it never wrote sees it */
    memset(raw, 0xA5, size);
    a->raw = raw;
    a->base = (uintptr_t)raw;
    a->size = size;
    a->mem_type = mem_type;
    pthread_mutex_lock(&g_lock);
    a->next = g_allocs;
    g_allocs = a;
    if (mem_type == DV_MEM_LOCK_DEV) {
        g_dev_bytes += size;
    }
    pthread_mutex_unlock(&g_lock);
    return raw;
}

static void fh_release(struct fh_alloc* a)
{
    free(a->raw);
    free(a);
}

/* A free while the device is using the memory (a kernel, a copy) is given back only once that
 * access ends: on a device the access would go on in memory the driver may hand out again, here
 * in the test process's heap. A free under a device *write* is the caller's bug, counted
 * (aio_fakehal_memory_misuse) for the tests to see: on a device it corrupts whoever gets the
 * memory next. A free under a read is not counted: a forced stream destroy recycles the
 * stream's tasks before it frees the queue, and a copy task's recycle frees its staging
 * (memory_task_v100.cc:369-373; a memset's source is such a buffer: common_memset_d32.cpp:
 * 51-56) while the queue may still be copying from it, into a task that has failed. The memory
 * is unmapped at once either way (a later access faults: fh_pin). */
static int fh_free(void* p)
{
    pthread_mutex_lock(&g_lock);
    for (struct fh_alloc** pp = &g_allocs; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->base == (uintptr_t)p) {
            struct fh_alloc* a = *pp;
            *pp = a->next;
            if (a->mem_type == DV_MEM_LOCK_DEV) {
                g_dev_bytes -= a->size;
            }
            g_freed[g_freed_next % FH_FREED_KEPT].base = a->base;
            g_freed[g_freed_next % FH_FREED_KEPT].size = a->size;
            g_freed_next++;
            const int in_use = a->pins > 0;
            if (in_use) {
                a->freed = 1;
                g_frees_in_use += (a->writes > 0) ? 1U : 0U;
                FH_TRACE("free of %#lx (%zu bytes) while the device %s it", (unsigned long)a->base, a->size,
                         (a->writes > 0) ? "writes" : "reads");
            }
            pthread_mutex_unlock(&g_lock);
            if (!in_use) {
                fh_release(a);
            }
            return 0;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return -1;
}

static struct fh_alloc* fh_find_locked(uintptr_t p)
{
    for (struct fh_alloc* a = g_allocs; a != NULL; a = a->next) {
        if (p >= a->base && p < a->base + a->size) {
            return a;
        }
    }
    return NULL;
}

int fh_valid_range(uintptr_t p, size_t n)
{
    pthread_mutex_lock(&g_lock);
    const struct fh_alloc* a = fh_find_locked(p);
    int ok = (a != NULL) && (n <= a->size) && (p - a->base <= a->size - n);
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* 1 when [p, p + n) overlaps memory freed lately (the caller found no live allocation at p). */
static int fh_freed_locked(uintptr_t p, size_t n)
{
    const uint32_t kept = (g_freed_next < FH_FREED_KEPT) ? g_freed_next : FH_FREED_KEPT;
    for (uint32_t i = 0; i < kept; i++) {
        if (p < g_freed[i].base + g_freed[i].size && g_freed[i].base < p + (n ? n : 1U)) {
            return 1;
        }
    }
    return 0;
}

int fh_pin(uintptr_t p, size_t n, int write, struct fh_alloc** pinned)
{
    pthread_mutex_lock(&g_lock);
    struct fh_alloc* a = fh_find_locked(p);
    int status = FH_PINNED;
    if (a != NULL && n <= a->size && p - a->base <= a->size - n) {
        a->pins++;
        a->writes += (write != 0) ? 1U : 0U;
    } else {
        status = (a == NULL && fh_freed_locked(p, n)) ? FH_FREED : FH_UNMAPPED;
        a = NULL;
        g_freed_accesses += (status == FH_FREED && write) ? 1U : 0U;
    }
    pthread_mutex_unlock(&g_lock);
    if (status == FH_FREED) {
        FH_TRACE("device access to freed memory at %#lx (%zu bytes): faults", (unsigned long)p, n);
    }
    *pinned = a;
    return status;
}

void fh_unpin(struct fh_alloc* a, int write)
{
    if (a == NULL) {
        return;
    }
    pthread_mutex_lock(&g_lock);
    a->writes -= (write != 0) ? 1U : 0U;
    const int release = (--a->pins == 0) && a->freed;
    pthread_mutex_unlock(&g_lock);
    if (release) {
        fh_release(a);
    }
}

/* Bytes from `p` to the end of its allocation (0: not in one). */
static size_t fh_bytes_left(uintptr_t p)
{
    pthread_mutex_lock(&g_lock);
    const struct fh_alloc* a = fh_find_locked(p);
    size_t n = (a != NULL) ? (size_t)(a->base + a->size - p) : 0U;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Device addresses are host addresses here: what the runtime puts into SQEs as the device's
 * view of a buffer (npu_driver_mem.cc:754-765; the error ringbuffer's, ringbuffer_maintain_task_
 * v100.cc:49-54) is the buffer's own address. */
DVresult drvMemAddressTranslate(DVdeviceptr vptr, UINT64* pptr)
{
    if (pptr == NULL) {
        return DRV_ERROR_INVALID_VALUE;
    }
    *pptr = (UINT64)vptr;
    return DRV_ERROR_NONE;
}

drvError_t halMemAlloc(void** pp, unsigned long long size, unsigned long long flag)
{
    /* the virtual memory type sits in bits 10-13 of the flag (ascend_hal_define.h:704-718) */
    unsigned virt = (unsigned)((flag >> MEM_VIRT_BIT) & ((1U << MEM_VIRT_WIDTH) - 1U));
    uint32_t type = (virt == MEM_HOST_VAL || virt == MEM_HOST_AGENT_VAL) ? DV_MEM_LOCK_HOST : DV_MEM_LOCK_DEV;
    *pp = fh_alloc((size_t)size, type);
    FH_TRACE("halMemAlloc size=%llu flag=%#llx -> %p", size, flag, *pp);
    return (*pp == NULL) ? DRV_ERROR_OUT_OF_MEMORY : DRV_ERROR_NONE;
}

drvError_t halMemFree(void* pp)
{
    FH_TRACE("halMemFree %p", pp);
    return (fh_free(pp) == 0) ? DRV_ERROR_NONE : DRV_ERROR_INVALID_VALUE;
}

DVresult drvMemGetAttribute(DVdeviceptr vptr, struct DVattribute* attr)
{
    memset(attr, 0, sizeof(*attr));
    pthread_mutex_lock(&g_lock);
    struct fh_alloc* a = fh_find_locked((uintptr_t)vptr);
    /* not ours: plain user memory (DV_MEM_USER_MALLOC, ascend_hal_base.h:1946) */
    attr->memType = (a != NULL) ? a->mem_type : DV_MEM_USER_MALLOC;
    pthread_mutex_unlock(&g_lock);
    attr->devId = 0;
    FH_TRACE("drvMemGetAttribute %#llx -> %#x", (unsigned long long)vptr, attr->memType);
    return DRV_ERROR_NONE;
}

DVresult halMemGetInfoEx(DVdevice device, unsigned int type, struct MemInfo* info)
{
    (void)device;
    (void)type;
    memset(info, 0, sizeof(*info));
    pthread_mutex_lock(&g_lock);
    info->phy_info.total = FH_DEVICE_MEMORY;
    info->phy_info.free = FH_DEVICE_MEMORY - g_dev_bytes;
    pthread_mutex_unlock(&g_lock);
    return DRV_ERROR_NONE;
}

DVresult halMemGetInfo(DVdevice device, unsigned int type, struct MemInfo* info)
{
    return halMemGetInfoEx(device, type, info);
}

DVresult drvMemcpy(DVdeviceptr dst, size_t dest_max, DVdeviceptr src, size_t byte_count)
{
    if (byte_count > dest_max) {
        return DRV_ERROR_INVALID_VALUE;
    }
    memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, byte_count);
    return DRV_ERROR_NONE;
}

/* The runtime's synchronous copies (npu_driver_mem.cc:2150-2164 MemCopySyncAdapter prefers it to
 * drvMemcpy): the kernel code at load (runtime.cc:4929-4933 BinaryMemCopySync), a MIX launch's
 * context (davinci_kernel_task_v100.cc:144-160). Every kind is a plain copy here. */
drvError_t halMemcpy(void* dst, size_t dst_size, void* src, size_t count, struct memcpy_info* info)
{
    (void)info;
    if (count > dst_size) {
        return DRV_ERROR_INVALID_VALUE;
    }
    memmove(dst, src, count);
    FH_TRACE("halMemcpy %p -> %p (%zu bytes)", src, dst, count);
    return DRV_ERROR_NONE;
}

DVresult drvMemsetD8(DVdeviceptr dst, size_t destMax, UINT8 value, size_t num)
{
    if (num > destMax) {
        return DRV_ERROR_INVALID_VALUE;
    }
    memset((void*)(uintptr_t)dst, value, num);
    return DRV_ERROR_NONE;
}

/* A converted copy (drvMemConvertAddr): the PCIe DMA SQE carries its address as the "DMA
 * queue" (memory_task_v100.cc:212-215: sq_addr = dmaAddr.phyAddr.src, sq_tail_ptr = len).
 * Descriptors are kept in a list under g_lock and read there (fh_dma_lookup): the runtime
 * destroys one as it handles its task's completion (memory_task_v100.cc:415-423), on a thread of
 * its own, and the SQE of a destroyed descriptor is a bad DMA queue here, never a read of freed
 * memory whose garbage would steer the copy. */
struct fh_dma_desc {
    uintptr_t src;
    uintptr_t dst;
    size_t len;
    struct fh_dma_desc* next;
};
static struct fh_dma_desc* g_dma_descs;

DVresult drvMemConvertAddr(DVdeviceptr p_src, DVdeviceptr p_dst, UINT32 len, struct DMA_ADDR* dma_addr)
{
    /* npu_driver.cc:246-290 MemConvertAddr: fixed_size must come back as len */
    struct fh_dma_desc* d = calloc(1, sizeof(*d));
    if (d == NULL) {
        return DRV_ERROR_OUT_OF_MEMORY;
    }
    d->src = (uintptr_t)p_src;
    d->dst = (uintptr_t)p_dst;
    d->len = len;
    pthread_mutex_lock(&g_lock);
    d->next = g_dma_descs;
    g_dma_descs = d;
    pthread_mutex_unlock(&g_lock);
    memset(dma_addr, 0, sizeof(*dma_addr));
    dma_addr->phyAddr.src = d;
    dma_addr->phyAddr.dst = (void*)(uintptr_t)p_dst;
    dma_addr->phyAddr.len = 1; /* one descriptor */
    dma_addr->phyAddr.flag = 1; /* a chain: src is the descriptor list */
    dma_addr->fixed_size = len;
    FH_TRACE("drvMemConvertAddr %#llx -> %#llx (%u bytes) -> %p", (unsigned long long)p_src,
             (unsigned long long)p_dst, len, (void*)d);
    return DRV_ERROR_NONE;
}

/* A copy of the live descriptor at `p` into *out: 1, or 0 when none lives there. */
static int fh_dma_lookup(const void* p, struct fh_dma_desc* out)
{
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (const struct fh_dma_desc* d = g_dma_descs; d != NULL && !found; d = d->next) {
        if ((const void*)d == p) {
            *out = *d;
            found = 1;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return found;
}

DVresult drvMemDestroyAddr(struct DMA_ADDR* ptr)
{
    struct fh_dma_desc* gone = NULL;
    pthread_mutex_lock(&g_lock);
    for (struct fh_dma_desc** pp = &g_dma_descs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == ptr->phyAddr.src) {
            gone = *pp;
            *pp = gone->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    free(gone);
    ptr->phyAddr.src = NULL;
    return DRV_ERROR_NONE;
}

/* The runtime's asynchronous copy of a launch's args to the device (npu_driver_mem.cc:2267-2278
 * MemCopyAsyncEx over a drvMemConvertAddr descriptor, then halMemcpyWait): done at submit. */
DVresult halMemcpySumbit(struct DMA_ADDR* dma_addr, int flag)
{
    (void)flag;
    struct fh_dma_desc d;
    if (dma_addr == NULL || !fh_dma_lookup(dma_addr->phyAddr.src, &d)) {
        return DRV_ERROR_INVALID_VALUE;
    }
    memmove((void*)d.dst, (const void*)d.src, d.len);
    FH_TRACE("halMemcpySumbit %#lx -> %#lx (%zu bytes)", (unsigned long)d.src, (unsigned long)d.dst, d.len);
    return DRV_ERROR_NONE;
}

DVresult halMemcpyWait(struct DMA_ADDR* dma_addr)
{
    (void)dma_addr;
    return DRV_ERROR_NONE;
}

/* ---- ids ---------------------------------------------------------------------------- */

drvError_t halResourceIdAlloc(uint32_t devId, struct halResourceIdInputInfo* in, struct halResourceIdOutputInfo* out)
{
    (void)devId;
    if ((unsigned)in->type >= DRV_INVALID_ID) {
        return DRV_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&g_lock);
    /* id 0 is left out: a real driver hands out ids from its pool in any order */
    for (uint32_t id = 1; id < FH_MAX_ID; id++) {
        if (!g_id_used[in->type][id]) {
            g_id_used[in->type][id] = 1;
            out->resourceId = id;
            if (in->type == DRV_EVENT_ID && id < FH_MAX_EVENT) {
                g_event_flag[id] = 0;
            } else if (in->type == DRV_NOTIFY_ID && id < FH_MAX_NOTIFY) {
                g_notify_flag[id] = 0;
                g_notify_fault[id] = 0;
            }
            pthread_mutex_unlock(&g_lock);
            FH_TRACE("halResourceIdAlloc type=%d -> %u", in->type, id);
            return DRV_ERROR_NONE;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return DRV_ERROR_NO_RESOURCES;
}

drvError_t halResourceIdFree(uint32_t devId, struct halResourceIdInputInfo* in)
{
    (void)devId;
    if ((unsigned)in->type >= DRV_INVALID_ID || in->resourceId >= FH_MAX_ID) {
        return DRV_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&g_lock);
    g_id_used[in->type][in->resourceId] = 0;
    pthread_mutex_unlock(&g_lock);
    return DRV_ERROR_NONE;
}

/* ---- submission and completion -------------------------------------------------------- */

/* A CQE's timestamp counts the device's timestamp clock, not nanoseconds: the runtime divides
 * two of them by the chip's eventTimestampFreq (ticks per ms) for aclrtEventElapsedTime
 * (event.cc:1272-1276), 50000 on a 910B (config/910_B_93/dev_info_reg.cc:186,
 * task_base.hpp:40): a 50 MHz clock, one tick per 20 ns. */
#define FH_NS_PER_TIMESTAMP_TICK 20ULL

static uint64_t fh_now_ticks(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec) / FH_NS_PER_TIMESTAMP_TICK;
}

static void fh_push_cqe_locked(uint32_t sq_id, const struct fh_sqe_header* h, uint32_t error_type,
                               uint32_t error_code)
{
    struct fh_sq* sq = &g_sq[sq_id];
    uint32_t target = FH_MAX_CQ;
    /* the logic CQ of the SQE's stream (LogicCqAllocateV2 passes the stream id in info[0]:
     * src/runtime/driver/npu_driver_res.cc:1845), else any logic CQ */
    for (uint32_t i = 0; i < FH_MAX_CQ; i++) {
        if (g_cq[i].valid && g_cq[i].stream_id == h->rt_stream_id) {
            target = i;
            break;
        }
    }
    if (target == FH_MAX_CQ && sq->cq_id < FH_MAX_CQ && g_cq[sq->cq_id].valid) {
        target = sq->cq_id;
    }
    if (target == FH_MAX_CQ) {
        FH_TRACE("no logic CQ for stream %u: CQE dropped", h->rt_stream_id);
        return;
    }
    struct fh_cq* cq = &g_cq[target];
    if (cq->count == cq->depth) {
        FH_TRACE("logic CQ %u full: CQE dropped", target);
        return;
    }
    struct fh_cqe* e = &cq->ring[(cq->head + cq->count) % cq->depth];
    memset((void*)e, 0, sizeof(*e));
    e->stream_id = h->rt_stream_id;
    e->task_id = h->task_id;
    e->error_code = error_code;
    e->error_type = (uint8_t)error_type;
    e->sqe_type = h->type;
    e->sq_id = (uint16_t)sq_id;
    e->sq_head = (uint16_t)sq->head;
    e->error_bit = (error_type != 0) ? 1 : 0;
    e->timestamp = fh_now_ticks();
    cq->count++;
    FH_TRACE("CQE for stream %u task %u (sq %u, error %u) -> logic cq %u", h->rt_stream_id,
             h->task_id, sq_id, error_type, target);
    pthread_cond_broadcast(&g_cq_cond);
}

void fh_hang_until_stopped(uint32_t sq_id)
{
    pthread_mutex_lock(&g_lock);
    while (!g_sq[sq_id].stop) {
        pthread_cond_wait(&g_hold_cond, &g_lock);
    }
    pthread_mutex_unlock(&g_lock);
}

/* A kernel launch (SQE type FFTS): find the kernel by the marker at its PC address, run its host
 * function over the args at the SQE's (or MIX context's) args address. g_lock is NOT held. */
/* What a kernel SQE launches: its code (PC), args address and size, blocks, and whether it is
 * a MIX kernel's FFTS+ SQE. 0 when a MIX SQE's context is not in device memory. g_lock is NOT
 * held. */
struct fh_kernel_launch {
    uintptr_t pc;
    uintptr_t args;
    size_t args_len;
    uint32_t block_dim;
    int mix;
};

static int fh_decode_launch(const uint8_t* raw, struct fh_kernel_launch* out)
{
    const struct fh_kernel_sqe* k = (const struct fh_kernel_sqe*)raw;
    out->block_dim = k->header.block_dim;
    out->mix = 0;
    if (k->ffts_type == FH_FFTS_PLUS_TYPE) {
        /* davinci_kernel_task_v100.cc:649-769 FillFftsAicAivCtxForDavinciTask: the PCs, the args
         * address and size (TaskParamPtrOffset), the block count */
        const struct fh_ffts_plus_sqe* f = (const struct fh_ffts_plus_sqe*)raw;
        uintptr_t ctx_addr = ((uintptr_t)f->context_address_base_high << 32) | f->context_address_base_low;
        if (!fh_valid_range(ctx_addr, sizeof(rtFftsPlusMixAicAivCtx_t))) {
            return 0;
        }
        rtFftsPlusMixAicAivCtx_t ctx;
        memcpy(&ctx, (const void*)ctx_addr, sizeof(ctx));
        out->pc = ((uintptr_t)ctx.nonTailAicTaskStartPcH << 32) | ctx.nonTailAicTaskStartPcL;
        if (out->pc == 0) {
            out->pc = ((uintptr_t)ctx.nonTailAivTaskStartPcH << 32) | ctx.nonTailAivTaskStartPcL;
        }
        out->args = ((uintptr_t)ctx.aicTaskParamPtrH << 32) | ctx.aicTaskParamPtrL;
        out->args_len = ctx.aicTaskParamPtrOffset;
        out->block_dim = ctx.nonTailBlockdim;
        out->mix = 1;
    } else {
        out->pc = ((uintptr_t)k->pc_addr_high << 32) | k->pc_addr_low;
        out->args = ((uintptr_t)(k->param_addr_high & 0xFFFFFU) << 32) | k->param_addr_low;
        out->args_len = fh_bytes_left(out->args); /* the SQE does not carry the size */
    }
    return 1;
}

static uint32_t fh_run_launch(uint32_t sq_id, const uint8_t* raw, uint32_t* error_code)
{
    const struct fh_sqe_header* h = (const struct fh_sqe_header*)raw;
    struct fh_kernel_launch kl;
    if (!fh_decode_launch(raw, &kl)) {
        FH_TRACE("sq %u: FFTS+ SQE with no context in device memory", sq_id);
        *error_code = 0x800U;
        return 1U;
    }
    const uintptr_t pc = kl.pc;
    const uintptr_t args = kl.args;
    const size_t args_len = kl.args_len;
    const uint32_t block_dim = kl.block_dim;
    const int mix = kl.mix;
    if (!fh_valid_range(pc, FH_CODE_SIZE) || memcmp((const void*)pc, FH_MARKER, FH_MARKER_LEN) != 0) {
        FH_TRACE("sq %u: kernel SQE with PC %#lx: not one of ours, completes without effect", sq_id,
                 (unsigned long)pc);
        return 0;
    }
    char name[FH_CODE_SIZE];
    memcpy(name, (const char*)pc + FH_MARKER_LEN, FH_CODE_SIZE - FH_MARKER_LEN);
    name[FH_CODE_SIZE - FH_MARKER_LEN - 1] = '\0';
    pthread_mutex_lock(&g_lock);
    struct fh_launch* l = &g_last_launch;
    snprintf(l->name, sizeof(l->name), "%s", name);
    l->block_dim = block_dim;
    l->stream_id = h->rt_stream_id;
    l->task_id = h->task_id;
    l->mix = mix;
    l->pc = pc;
    l->args_addr = args;
    l->args_len = (uint32_t)((args_len < FH_ARGS_KEEP) ? args_len : FH_ARGS_KEEP);
    if (l->args_len > 0 && args != 0) {
        memcpy(l->args, (const void*)args, l->args_len);
    }
    g_launch_count++;
    pthread_mutex_unlock(&g_lock);
    FH_TRACE("sq %u: launch %s%s blocks %u args %#lx (%zu bytes)", sq_id, name, mix ? " (MIX)" : "", block_dim,
             (unsigned long)args, args_len);
    struct fh_alloc* args_pin = NULL; /* (the args the runtime built) */
    if (args != 0 && args_len > 0 && fh_pin(args, args_len, 0, &args_pin) != FH_PINNED) {
        FH_TRACE("sq %u: launch %s with args at %#lx not mapped: faults", sq_id, name, (unsigned long)args);
        *error_code = 0x800U;
        return 1U;
    }
    const struct fh_kernel_result r =
        fh_run_kernel(sq_id, name, (const uint8_t*)args, (args != 0) ? args_len : 0U, block_dim, mix);
    fh_unpin(args_pin, 0);
    *error_code = r.error_code;
    return r.error_type;
}

/* The runtime's ringbuffer control task (place holder SQE, task type 83): take the buffer and
 * write the header the firmware writes (the runtime sends it zeroed: device_error_proc.cc:
 * 404-414, and checks magic, length and indexes before reading elements: :612-634), or forget
 * it (del_flag). g_lock is NOT held. */
static void fh_ringbuffer_control(uint32_t sq_id, const struct fh_ringbuffer_sqe* c)
{
    pthread_mutex_lock(&g_lock);
    if (c->del_flag) {
        g_rb_base = 0;
        FH_TRACE("sq %u: error ringbuffer released", sq_id);
    } else {
        const uintptr_t base = (uintptr_t)c->ringbuffer_offset;
        const size_t need = sizeof(struct fh_rb_ctl) + (size_t)c->total_len * FH_RB_ELEMENT_SIZE;
        const struct fh_alloc* a = fh_find_locked(base);
        if (c->total_len == 0 || c->total_len > FH_RB_MAX_LEN || a == NULL || a->base + a->size - base < need) {
            g_rb_base = 0;
            FH_TRACE("sq %u: error ringbuffer at %#lx (%u elements) not in device memory: ignored", sq_id,
                     (unsigned long)base, c->total_len);
        } else {
            const struct fh_rb_ctl ctl = {FH_RB_MAGIC, 0, 0, c->total_len, (uint64_t)getpid(), FH_RB_ELEMENT_SIZE, 0};
            memcpy((void*)base, &ctl, sizeof(ctl));
            g_rb_base = base;
            g_rb_len = c->total_len;
            FH_TRACE("sq %u: error ringbuffer at %#lx, %u elements", sq_id, (unsigned long)base, c->total_len);
        }
    }
    pthread_mutex_unlock(&g_lock);
}

/* The firmware's report of a failed SQE in the error ringbuffer, written before its error CQE
 * (so the runtime's first look, on reading the CQE, finds it; its once-a-second monitor may
 * find it first and reclaim the stream, as on a device: device_error_proc.cc:905-941): a kernel
 * as an AI Core (or vector) error naming its stream, task and code (ProcessStarsCoreErrorInfo,
 * device_error_core_proc.cc:1492-1552), a copy as an SDMA error
 * (device_error_proc.cc:1347-1370). Other SQEs get no element: the runtime then polls for its
 * 12 s, as it would for a report that never came. Called with g_lock held. */
static void fh_ringbuffer_report_locked(const uint8_t* raw, uint32_t error_code, const struct fh_kernel_launch* kl)
{
    const struct fh_sqe_header* h = (const struct fh_sqe_header*)raw;
    if (g_rb_base == 0 || (h->type != FH_SQE_FFTS && h->type != FH_SQE_SDMA && h->type != FH_SQE_PCIE_DMA)) {
        return;
    }
    const struct fh_alloc* a = fh_find_locked(g_rb_base); /* (the runtime frees it apart from the
                                                             release SQE: :440-456) */
    struct fh_rb_ctl* ctl = (struct fh_rb_ctl*)g_rb_base;
    if (a == NULL || ctl->magic != FH_RB_MAGIC || (ctl->tail + 1U) % g_rb_len == ctl->head % g_rb_len) {
        FH_TRACE("error ringbuffer gone or full: no element for stream %u task %u", h->rt_stream_id, h->task_id);
        return;
    }
    uint8_t* slot = (uint8_t*)g_rb_base + sizeof(struct fh_rb_ctl) + (size_t)ctl->tail * FH_RB_ELEMENT_SIZE;
    memset(slot, 0, FH_RB_ELEMENT_SIZE);
    struct fh_rb_element* e = (struct fh_rb_element*)slot;
    struct fh_rb_core_error* body = (struct fh_rb_core_error*)(slot + sizeof(*e));
    e->pid = (uint64_t)getpid();
    e->error_number = ++g_rb_serial;
    if (h->type == FH_SQE_FFTS) {
        const struct fh_kernel_sqe* k = (const struct fh_kernel_sqe*)raw;
        /* a plain kernel SQE of type AIV (stars.hpp:28) fails on a vector core */
        e->error_type = (k->ffts_type == 1U) ? FH_RB_AIVECTOR_ERROR : FH_RB_AICORE_ERROR;
        e->info_len = 7624U; /* sizeof StarsCoreErrorInfoRingBuffer (never read) */
        body->comm.core_num = 1;
        /* the error bits name the cause (device_error_core_proc.cc:155-200): a bad access is bit
         * 23, "MTE accesses an invalid GM address" (with no MTE bits, off the link-error path:
         * :1230-1253) */
        body->info[0].aic_error[0] = (error_code == 0x800U) ? (1ULL << 23) : error_code;
        if (kl != NULL) {
            body->info[0].pc_start = body->info[0].current_pc = kl->pc;
            body->info[0].para_base = kl->args;
        }
    } else {
        e->error_type = FH_RB_SDMA_ERROR;
        e->info_len = 532U;
    }
    body->comm.type = (uint16_t)e->error_type;
    body->comm.stream_id = h->rt_stream_id;
    body->comm.task_id = h->task_id;
    __atomic_store_n(&ctl->tail, (ctl->tail + 1U) % g_rb_len, __ATOMIC_RELEASE);
    FH_TRACE("error ringbuffer: element %lu for stream %u task %u (type %u)", (unsigned long)g_rb_serial,
             h->rt_stream_id, h->task_id, e->error_type);
}

/* A 64-bit immediate a condition-ISA program loads into a register with an LHWI (bits 63-49 in
 * its bits 31-17) and an LLWI (bits 48-32 in its bits 31-15, 31-0 in its second word) at `p`
 * (stars_cond_isa_construct_common.cc:84-99; v100/stars_cond_isa_struct.hpp:114-131). */
static uint64_t fh_cond_imm(const uint8_t* p)
{
    uint32_t w[3];
    memcpy(w, p, sizeof(w));
    return ((uint64_t)(w[0] >> 17) << 49) | ((uint64_t)(w[1] >> 15) << 32) | w[2];
}

/* The runtime's model maintenance tasks for the TS CPU (place holder SQE, task type 12:
 * model_maintaince_task_v100.cc:23-98). MMT_STREAM_ADD binds a stream to a model: the runtime
 * sends it on its default stream and waits for it (model.cc:454-470 EnterBindStream) before it
 * puts tasks on the bound stream; those are written into the stream's device SQ at once
 * (docs/zh/design/modules/model/model.md:287-304) and run when a model execution activates the
 * SQ (model.md:62-63, 474-478; fh_model_execute), not before (a capture records, it does not
 * run). The firmware that handles the task is not public; what it leaves is what the model
 * execute function expects of a bound SQ not run yet: disabled (stars_cond_isa_helper.cc:
 * 391-415, "if sq enable flag is disable(0), goto setSqHead0"). MMT_MODEL_PRE_PROC names the
 * model's end-graph notify (:59-75). The others (the unbind MMT_STREAM_DEL...) complete without
 * effect: a model's SQ runs nothing on its own until the runtime frees it. */
static void fh_model_maintaince(uint32_t sq_id, const struct fh_model_maintaince_sqe* m)
{
    pthread_mutex_lock(&g_lock);
    if (m->operation == FH_MMT_STREAM_ADD) {
        for (uint32_t i = 0; i < FH_MAX_SQ; i++) {
            if (g_sq[i].valid && g_sq[i].stream_id == m->stream_id) {
                g_sq[i].bound = 1;
                g_sq[i].enabled = 0;
                g_sq[i].model_id = m->model_id;
                FH_TRACE("sq %u: stream %u (sq %u) bound to model %u", sq_id, m->stream_id, i, m->model_id);
            }
        }
    } else if (m->operation == FH_MMT_MODEL_PRE_PROC) { /* where its failure goes (fh_model_fault_locked) */
        g_end_graph[m->model_id] = (uint16_t)(m->endgraph_notify_id + 1U);
        FH_TRACE("sq %u: model %u loaded, end-graph notify %u", sq_id, m->model_id, m->endgraph_notify_id);
    } else {
        FH_TRACE("sq %u: model %u maintenance %u (stream %u) completes without effect", sq_id, m->model_id,
                 m->operation, m->stream_id);
    }
    pthread_mutex_unlock(&g_lock);
}

/* A failed SQE of a model's SQ (fh_worker). The runtime reads no completion of a model's stream
 * (its tasks complete when sent: stars_engine.cc:1368-1373, "simu stars report"); it learns of the
 * failure from the executing stream's end-graph notify wait, whose CQE carries the model's result
 * as its status: the failed task's stream and task and TS_STARS_MODEL_STREAM_EXE_FAILED
 * (stars.hpp:58-75 rtStarsCqeSwStatus_t, runtime_tsch_defines.h:195), decoded for a failed
 * notify wait by stars_engine.cc:1541-1548, notify_task.cc:414-422, 463-493 and
 * model_execute_task.cc:227-250, 316-341. The firmware that reports it is not public: this is
 * what that decoding implies, and the error bit it is given (bit 5, "sq sw status error":
 * stars_engine.cc:1574-1576) is a choice. STARS disables the failed SQ (the runtime waits for
 * that: stars_engine.cc:1437-1449), so the model's next execution starts it again from its first
 * SQE (fh_model_execute). Called with g_lock held. */
static void fh_model_fault_locked(struct fh_sq* sq, const struct fh_sqe_header* h)
{
    const uint32_t notify = g_end_graph[sq->model_id];
    sq->enabled = 0;
    if (notify == 0U || notify > FH_MAX_NOTIFY) {
        FH_TRACE("model %u: stream %u task %u failed, no end-graph notify to report it to", sq->model_id,
                 h->rt_stream_id, h->task_id);
        return;
    }
    g_notify_fault[notify - 1U] = (1U << 28) | ((uint32_t)(h->rt_stream_id & 0xFFFU) << 16) | h->task_id;
    pthread_cond_broadcast(&g_event_cond);
    FH_TRACE("model %u: stream %u task %u failed: reported to end-graph notify %u", sq->model_id, h->rt_stream_id,
             h->task_id, notify - 1U);
}

/* A model execution (model.cc:1214-1264 SubmitExecuteTask): a condition SQE of sub type
 * MODEL_EXEC (model_execute_task_v100.cc:43-72) calling the model execute function the runtime
 * wrote into device memory, its operands (the head SQs' ids, then their streams' execution
 * counters) after it (model_execute_task_func_call.cc:171-238, 336-418). For each of the model's
 * head SQs, that function (stars_cond_isa_helper.cc:221-626):
 * - waits for the SQ's state machine to be idle, a bounded loop, else fails (:268-341). Here it
 *   waits only for a last SQE in flight: the end-graph record, which the executing stream's wait
 *   can see before the SQ is idle (the window that loop covers); any other SQE in flight fails,
 * - fails when the runtime's table of SQ register pages has none for it (:351-388) or when the SQ
 *   is enabled and its head has not reached its tail, i.e. its last execution has not finished
 *   (:391-415, 425-472),
 * - disables it and moves its head to 0 (:483-495), counts the execution in the stream's 16-bit
 *   counter and activates the SQ (:522-556): STARS runs its SQEs again from the first.
 * A failure is the function's error instruction: an error CQE with status 0, "ModelExecuteTask
 * goto error instr" (model_execute_task.cc:88-93; which error bit STARS sets is not in the
 * source: bit 0 here). This SQE does not wait for the model: the runtime's next SQE on the
 * stream waits for the end-graph notify the model's last SQE records (model.cc:1309-1321), and
 * the execution is over once that wait has run (raw_device.cc:2523-2576). A function of another
 * size is not this one: not modelled, it completes without effect. g_lock is NOT held. */
static uint32_t fh_model_execute(uint32_t sq_id, const uint8_t* raw, uint32_t* error_code)
{
    const uintptr_t fc = (uintptr_t)fh_cond_imm(raw + __builtin_offsetof(struct fh_func_call_sqe, lhwi1));
    const uint64_t size = fh_cond_imm(raw + __builtin_offsetof(struct fh_func_call_sqe, lhwi2)) * 4U;
    if (size != FH_MODEL_EXE_FUNC_SIZE || !fh_valid_range(fc, FH_MODEL_EXE_FUNC_SIZE)) {
        FH_TRACE("sq %u: model execute calling %lu bytes at %#lx: not modelled, completes without effect", sq_id,
                 (unsigned long)size, (unsigned long)fc);
        return 0;
    }
    const uint8_t* f = (const uint8_t*)fc;
    const uint16_t model_id = ((const struct fh_func_call_sqe*)raw)->model_id;
    const uint64_t* head_sqs = (const uint64_t*)(uintptr_t)fh_cond_imm(f + FH_MODEL_EXE_HEAD_SQ_ARR);
    const uint64_t n = fh_cond_imm(f + FH_MODEL_EXE_HEAD_SQ_MAX);
    const uint64_t* pages = (const uint64_t*)(uintptr_t)fh_cond_imm(f + FH_MODEL_EXE_SQ_VIRT_ARR);
    const uint64_t* counters = (const uint64_t*)(uintptr_t)fh_cond_imm(f + FH_MODEL_EXE_STREAM_SVM);
    *error_code = 0;
    if (n > FH_MAX_SQ || !fh_valid_range((uintptr_t)head_sqs, n * 8U) ||
        !fh_valid_range((uintptr_t)counters, n * 8U)) {
        return 1U;
    }
    pthread_mutex_lock(&g_lock);
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t id = head_sqs[i];
        struct fh_sq* sq = &g_sq[(id < FH_MAX_SQ) ? id : 0U];
        const uint32_t at = sq->head;
        while (id < FH_MAX_SQ && sq->valid && sq->busy && sq->head == at && (at + 1U) % sq->depth == sq->tail &&
               !sq->stop && !g_sq[sq_id].stop) {
            pthread_cond_wait(&g_hold_cond, &g_lock);
        }
        const struct fh_alloc* a = fh_find_locked((uintptr_t)(pages + id));
        const int page = (a != NULL) && (uintptr_t)(pages + id) + 8U <= a->base + a->size && pages[id] != 0;
        const int running = sq->busy || (sq->enabled && sq->head != sq->tail);
        if (id >= FH_MAX_SQ || !sq->valid || !sq->bound || !page || running) {
            FH_TRACE("sq %u: model %u execute: head sq %lu %s", sq_id, model_id, (unsigned long)id,
                     running ? "still running" : "not a model's SQ with a register page");
            pthread_mutex_unlock(&g_lock);
            return 1U;
        }
        sq->head = 0;
        uint16_t* count = (uint16_t*)(uintptr_t)counters[i];
        if (fh_find_locked((uintptr_t)count) != NULL) {
            (*count)++;
        }
        sq->enabled = 1;
        FH_TRACE("sq %u: model %u execute: sq %lu runs its %u SQEs", sq_id, model_id, (unsigned long)id, sq->tail);
        pthread_cond_broadcast(&sq->more);
        pthread_cond_broadcast(&g_hold_cond);
    }
    pthread_mutex_unlock(&g_lock);
    return 0;
}

/* A copy the device runs (an SDMA or PCIe DMA SQE), its ends pinned while it moves the bytes
 * (fh_pin). An end outside the driver's live allocations faults, an SDMA-class error (1), as on a
 * device, which reaches only memory mapped for it (device memory, pinned or registered host
 * memory) and where freed memory is unmapped. */
static uint32_t fh_device_copy(uintptr_t dst, uintptr_t src, size_t n)
{
    struct fh_alloc *to = NULL, *from = NULL;
    const int ok = fh_pin(dst, n, 1, &to) == FH_PINNED && fh_pin(src, n, 0, &from) == FH_PINNED;
    if (ok) {
        memmove((void*)dst, (const void*)src, n);
    } else {
        FH_TRACE("device copy %#lx -> %#lx (%zu bytes): an end is not mapped, faults", (unsigned long)src,
                 (unsigned long)dst, n);
    }
    fh_unpin(from, 0);
    fh_unpin(to, 1);
    return ok ? 0U : 1U;
}

/* Runs one SQE; g_lock is NOT held. Returns the STARS error bits (0: success) and sets
 * *error_code (the accelerator's status) with them. */
static uint32_t fh_run_sqe(uint32_t sq_id, const uint8_t* raw, uint32_t* error_code)
{
    const struct fh_sqe_header* h = (const struct fh_sqe_header*)raw;
    switch (h->type) {
        case FH_SQE_FFTS:
            return fh_run_launch(sq_id, raw, error_code);
        case FH_SQE_SDMA: {
            /* memory_task_v100.cc:233-266 ConstructMemcpySqe: src/dst/length, opcode 0 a copy */
            const struct fh_sdma_sqe* s = (const struct fh_sdma_sqe*)raw;
            if (s->ptr_mode) {
                /* memory_task_v100.cc:131-154: the SDMA SQE sits in memory (not modelled) */
                FH_TRACE("sq %u: SDMA ptr-mode SQE not modelled", sq_id);
                return 0;
            }
            uintptr_t src = ((uintptr_t)s->src_addr_high << 32) | s->src_addr_low;
            uintptr_t dst = ((uintptr_t)s->dst_addr_high << 32) | s->dst_addr_low;
            FH_TRACE("sq %u: SDMA %#lx -> %#lx (%u bytes, opcode %u)", sq_id, (unsigned long)src,
                     (unsigned long)dst, s->length, s->opcode);
            if (s->opcode == 0 && s->length > 0) {
                return fh_device_copy(dst, src, s->length);
            }
            return 0;
        }
        case FH_SQE_PCIE_DMA: {
            /* memory_task_v100.cc:158-185 ConstructPcieDmaSqe: src/dst/length when not converted */
            const struct fh_pcie_dma_sqe* s = (const struct fh_pcie_dma_sqe*)raw;
            FH_TRACE("sq %u: PCIe DMA %#lx -> %#lx (%lu bytes, converted %u)", sq_id, (unsigned long)s->src,
                     (unsigned long)s->dst, (unsigned long)s->length, s->is_converted);
            if (!s->is_converted && s->length > 0) {
                return fh_device_copy((uintptr_t)s->dst, (uintptr_t)s->src, (size_t)s->length);
            } else if (s->is_converted) {
                struct fh_dma_desc d;
                if (!fh_dma_lookup((const void*)(((uintptr_t)s->sq_addr_high << 32) | s->sq_addr_low), &d)) {
                    return 1; /* a bad DMA queue: an SDMA-class error */
                }
                return fh_device_copy(d.dst, d.src, d.len);
            }
            return 0;
        }
        case FH_SQE_EVENT_RECORD: {
            /* event_task_v100.cc:42: the event id */
            const struct fh_event_sqe* s = (const struct fh_event_sqe*)raw;
            pthread_mutex_lock(&g_lock);
            g_event_flag[s->event_id] = 1;
            pthread_cond_broadcast(&g_event_cond);
            pthread_mutex_unlock(&g_lock);
            FH_TRACE("sq %u: event record %u", sq_id, s->event_id);
            return 0;
        }
        case FH_SQE_EVENT_WAIT: {
            /* event_task_v100.cc:179: wait for the event's flag, then clear it (STARS consumes
             * the record; the runtime resets with a WRITE_VALUE SQE too, event_task_v100.cc:95) */
            const struct fh_event_sqe* s = (const struct fh_event_sqe*)raw;
            FH_TRACE("sq %u: event wait %u", sq_id, s->event_id);
            pthread_mutex_lock(&g_lock);
            while (!g_event_flag[s->event_id] && !g_sq[sq_id].stop) {
                pthread_cond_wait(&g_event_cond, &g_lock);
            }
            g_event_flag[s->event_id] = 0;
            pthread_mutex_unlock(&g_lock);
            return 0;
        }
        case FH_SQE_WRITE_VALUE: {
            const struct fh_write_value_sqe* s = (const struct fh_write_value_sqe*)raw;
            if (s->sub_type == 1 /* RT_STARS_WRITE_VALUE_SUB_TYPE_EVENT_RESET */) {
                pthread_mutex_lock(&g_lock);
                g_event_flag[s->res7 % FH_MAX_EVENT] = 0;
                pthread_mutex_unlock(&g_lock);
            }
            FH_TRACE("sq %u: write value sub_type %u", sq_id, s->sub_type);
            return 0;
        }
        case FH_SQE_NOTIFY_RECORD: {
            /* notify_task_v100.cc:23-41: STARS sets the notify */
            const struct fh_notify_sqe* s = (const struct fh_notify_sqe*)raw;
            pthread_mutex_lock(&g_lock);
            g_notify_flag[s->notify_id] = 1;
            pthread_cond_broadcast(&g_event_cond);
            pthread_mutex_unlock(&g_lock);
            FH_TRACE("sq %u: notify record %u", sq_id, s->notify_id);
            return 0;
        }
        case FH_SQE_NOTIFY_WAIT: {
            /* notify_task_v100.cc:150-170: wait for the notify, then reset it (a notify wait is a
             * wait-and-reset: acl_rt.h:3903-3912 aclrtWaitAndResetNotify), or fail with the
             * failure of the model whose end graph it waits for (fh_model_fault_locked). Its
             * timeout is not modelled (a model's end-graph wait has none: model.cc:1309-1321) */
            const struct fh_notify_sqe* s = (const struct fh_notify_sqe*)raw;
            FH_TRACE("sq %u: notify wait %u", sq_id, s->notify_id);
            pthread_mutex_lock(&g_lock);
            while (!g_notify_flag[s->notify_id] && !g_notify_fault[s->notify_id] && !g_sq[sq_id].stop) {
                pthread_cond_wait(&g_event_cond, &g_lock);
            }
            *error_code = g_notify_fault[s->notify_id];
            g_notify_flag[s->notify_id] = 0;
            g_notify_fault[s->notify_id] = 0;
            pthread_mutex_unlock(&g_lock);
            return (*error_code != 0U) ? (1U << 5) : 0U;
        }
        case FH_SQE_COND:
            if (((const struct fh_func_call_sqe*)raw)->conds_sub_type == FH_CONDS_SUB_TYPE_MODEL_EXEC) {
                return fh_model_execute(sq_id, raw, error_code);
            }
            FH_TRACE("sq %u: condition SQE of sub type %u completes without effect", sq_id,
                     ((const struct fh_func_call_sqe*)raw)->conds_sub_type);
            return 0;
        case FH_SQE_PLACE_HOLDER:
            if (h->block_dim == FH_TASK_TYPE_RINGBUFFER_CONTROL) { /* (the task type sits there) */
                fh_ringbuffer_control(sq_id, (const struct fh_ringbuffer_sqe*)raw);
                return 0;
            }
            if (h->block_dim == FH_TASK_TYPE_MODEL_MAINTAINCE) {
                fh_model_maintaince(sq_id, (const struct fh_model_maintaince_sqe*)raw);
                return 0;
            }
            FH_TRACE("sq %u: place holder SQE of task type %u completes without effect", sq_id, h->block_dim);
            return 0;
        default:
            FH_TRACE("sq %u: SQE type %u completes without effect", sq_id, h->type);
            return 0;
    }
}

/* Whether the SQE at the head of `sq` belongs to a held stream (aio_fakehal_hold_stream). */
static int fh_head_held_locked(const struct fh_sq* sq)
{
    const struct fh_sqe_header* h =
        (const struct fh_sqe_header*)(sq->ring + (size_t)(sq->head % sq->depth) * FH_SQE_SIZE);
    return g_stream_held[h->rt_stream_id];
}

static void* fh_worker(void* arg)
{
    uint32_t sq_id = (uint32_t)(uintptr_t)arg;
    struct fh_sq* sq = &g_sq[sq_id];
    uint8_t sqe[FH_SQE_SIZE];
    pthread_mutex_lock(&g_lock);
    for (;;) {
        /* a model's SQ runs only while a model execution has it enabled (fh_model_execute) */
        while (!sq->stop && (sq->head == sq->tail || (sq->bound && !sq->enabled) || fh_head_held_locked(sq))) {
            pthread_cond_wait((sq->head != sq->tail && !(sq->bound && !sq->enabled)) ? &g_hold_cond : &sq->more,
                              &g_lock);
        }
        if (sq->stop) {
            break;
        }
        sq->busy = 1;
        memcpy(sqe, sq->ring + (size_t)(sq->head % sq->depth) * FH_SQE_SIZE, FH_SQE_SIZE);
        uint32_t error_type = 0;
        uint32_t error_code = 0;
        const struct fh_sqe_header* head = (const struct fh_sqe_header*)sqe;
        if (g_fail_after >= 0 && (g_fail_stream < 0 || head->rt_stream_id == g_fail_stream)) {
            if (g_fail_after == 0) {
                error_type = g_fail_error_type;
                error_code = g_fail_error_code;
            }
            g_fail_after--;
        }
        pthread_mutex_unlock(&g_lock);
        if (g_delay_us > 0) {
            usleep(g_delay_us);
        }
        if (error_type == 0) {
            error_type = fh_run_sqe(sq_id, sqe, &error_code);
        }
        struct fh_kernel_launch kl;
        const int decoded = (error_type != 0 && head->type == FH_SQE_FFTS) ? fh_decode_launch(sqe, &kl) : 0;
        pthread_mutex_lock(&g_lock);
        const struct fh_sqe_header* h = (const struct fh_sqe_header*)sqe;
        if (error_type != 0 && sq->bound) {
            fh_ringbuffer_report_locked(sqe, error_code, decoded ? &kl : NULL);
            fh_model_fault_locked(sq, h); /* the queue stops there, disabled */
            sq->busy = 0;
            pthread_cond_broadcast(&g_hold_cond);
            __atomic_add_fetch(&g_sqe_count, 1, __ATOMIC_RELEASE);
            continue;
        }
        if (error_type != 0) {
            fh_ringbuffer_report_locked(sqe, error_code, decoded ? &kl : NULL);
            /* STARS stops a queue at a failed SQE: its head stays there until the runtime has
             * read the error CQE and resumed the queue past it (stars_engine.cc:1398-1470
             * StarsResumeRtsq, "skip the error sqe"). Moving the head first let the runtime
             * reclaim the failed task by the head alone, as a success, whenever it read the
             * head before the CQE (seen: the error unreported in 1 of ~5 runs). */
            fh_push_cqe_locked(sq_id, h, error_type, error_code);
            sq->halted = 1;
            while (sq->halted && !sq->stop) {
                pthread_cond_wait(&g_hold_cond, &g_lock);
            }
            if (sq->resumed) { /* the runtime set the head itself (fh_sq_config) */
                sq->resumed = 0;
                __atomic_add_fetch(&g_sqe_count, 1, __ATOMIC_RELEASE);
                continue;
            }
            /* released by a test control (aio_fakehal_hold_stream) or stopped: skip it */
        } else if (h->wr_cqe) {
            fh_push_cqe_locked(sq_id, h, error_type, error_code);
        }
        sq->head = (sq->head + 1) % sq->depth;
        sq->busy = 0;
        if (sq->bound) { /* a model execution may wait for the queue to be idle (fh_model_execute) */
            pthread_cond_broadcast(&g_hold_cond);
        }
        __atomic_add_fetch(&g_sqe_count, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

static uint32_t fh_free_slot_locked(void* table, size_t stride, size_t n, uint32_t wanted, int specified)
{
    if (specified) {
        return (wanted < n) ? wanted : UINT32_MAX;
    }
    for (uint32_t i = 1; i < n; i++) {
        if (!*(int*)((uint8_t*)table + stride * i)) {
            return i;
        }
    }
    return UINT32_MAX;
}

drvError_t halSqCqAllocate(uint32_t devId, struct halSqCqInputInfo* in, struct halSqCqOutputInfo* out)
{
    if (devId != 0) {
        return DRV_ERROR_INVALID_DEVICE;
    }
    memset(out, 0, sizeof(*out));
    out->sqId = SQCQ_UMAX;
    out->cqId = SQCQ_UMAX;
    pthread_mutex_lock(&g_lock);
    if (in->type == DRV_LOGIC_TYPE) {
        /* npu_driver_res.cc:1820-1850 LogicCqAllocateV2: info[0] the stream, cqeSize 32 */
        uint32_t id = fh_free_slot_locked(g_cq, sizeof(g_cq[0]), FH_MAX_CQ, in->cqId,
                                          (in->flag & TSDRV_FLAG_SPECIFIED_CQ_ID) != 0);
        if (id == UINT32_MAX) {
            pthread_mutex_unlock(&g_lock);
            return DRV_ERROR_NO_RESOURCES;
        }
        struct fh_cq* cq = &g_cq[id];
        if (!cq->valid) {
            cq->depth = (in->cqeDepth > 0) ? in->cqeDepth : 1024U;
            cq->ring = calloc(cq->depth, sizeof(struct fh_cqe));
            cq->head = cq->count = 0;
        }
        cq->valid = 1;
        cq->stream_id = in->info[0];
        out->cqId = id;
        pthread_mutex_unlock(&g_lock);
        FH_TRACE("halSqCqAllocate logic cq %u stream %u flag %#x", id, in->info[0], in->flag);
        return DRV_ERROR_NONE;
    }
    if (in->type == DRV_NORMAL_TYPE) {
        /* npu_driver_res.cc:1640-1740 NormalSqCqAllocate: info[0] the stream id
         * (stream_sqcq_manage.cc:176, rtStreamAllocInfo_t) */
        uint32_t id = fh_free_slot_locked(g_sq, sizeof(g_sq[0]), FH_MAX_SQ, in->sqId,
                                          (in->flag & TSDRV_FLAG_SPECIFIED_SQ_ID) != 0);
        if (id == UINT32_MAX || g_sq[id].valid) {
            pthread_mutex_unlock(&g_lock);
            return (id == UINT32_MAX) ? DRV_ERROR_SQID_FULL : DRV_ERROR_INVALID_VALUE;
        }
        struct fh_sq* sq = &g_sq[id];
        memset(sq, 0, sizeof(*sq));
        sq->depth = FH_SQ_DEPTH;
        sq->ring = calloc(sq->depth, FH_SQE_SIZE);
        sq->regs = calloc(1, FH_SQ_REG_SIZE);
        sq->stream_id = in->info[0];
        if (sq->stream_id < FH_MAX_ID) {
            /* a hold is on a stream (aio_fakehal_hold_stream), not on its id: the runtime
             * reuses a destroyed stream's id for its next stream (its timeout snapshot's
             * temporary stream, api_impl.cc:6360-6381, took a held one's and waited for good) */
            g_stream_held[sq->stream_id] = 0;
        }
        sq->cq_id = ((in->flag & TSDRV_FLAG_SPECIFIED_CQ_ID) != 0) ? in->cqId : id;
        sq->valid = 1;
        pthread_cond_init(&sq->more, NULL);
        pthread_create(&sq->worker, NULL, fh_worker, (void*)(uintptr_t)id);
        out->sqId = id;
        out->cqId = sq->cq_id;
        pthread_mutex_unlock(&g_lock);
        FH_TRACE("halSqCqAllocate normal sq %u cq %u stream %u flag %#x", id, out->cqId, in->info[0], in->flag);
        return DRV_ERROR_NONE;
    }
    pthread_mutex_unlock(&g_lock);
    FH_TRACE("halSqCqAllocate type %d: answered without a queue", in->type);
    /* callback / ctrl / shm queues are not modelled: ids that do not clash with ours */
    out->sqId = FH_MAX_SQ + (uint32_t)in->type;
    out->cqId = FH_MAX_CQ + (uint32_t)in->type;
    return DRV_ERROR_NONE;
}

drvError_t halSqCqFree(uint32_t devId, struct halSqCqFreeInfo* info)
{
    (void)devId;
    FH_TRACE("halSqCqFree type %d sq %u cq %u flag %#x", info->type, info->sqId, info->cqId, info->flag);
    if (info->type == DRV_NORMAL_TYPE && info->sqId < FH_MAX_SQ) {
        pthread_mutex_lock(&g_lock);
        struct fh_sq* sq = &g_sq[info->sqId];
        if (!sq->valid) {
            pthread_mutex_unlock(&g_lock);
            return DRV_ERROR_INVALID_VALUE;
        }
        sq->stop = 1;
        if (sq->stream_id < FH_MAX_ID) {
            g_stream_held[sq->stream_id] = 0; /* (see halSqCqAllocate) */
        }
        pthread_cond_broadcast(&sq->more);
        pthread_cond_broadcast(&g_event_cond);
        pthread_cond_broadcast(&g_hold_cond);
        pthread_t worker = sq->worker;
        pthread_mutex_unlock(&g_lock);
        pthread_join(worker, NULL);
        pthread_mutex_lock(&g_lock);
        free(sq->ring);
        free(sq->regs);
        pthread_cond_destroy(&sq->more);
        memset(sq, 0, sizeof(*sq));
        pthread_mutex_unlock(&g_lock);
        return DRV_ERROR_NONE;
    }
    if (info->type == DRV_LOGIC_TYPE && info->cqId < FH_MAX_CQ) {
        pthread_mutex_lock(&g_lock);
        struct fh_cq* cq = &g_cq[info->cqId];
        free(cq->ring);
        memset(cq, 0, sizeof(*cq));
        pthread_cond_broadcast(&g_cq_cond);
        pthread_mutex_unlock(&g_lock);
    }
    return DRV_ERROR_NONE;
}

/* 1 when a CQE that queue `sq_id` wrote has not been read yet. */
static uint32_t fh_sq_has_cqe_locked(uint32_t sq_id)
{
    for (uint32_t i = 0; i < FH_MAX_CQ; i++) {
        const struct fh_cq* cq = &g_cq[i];
        for (uint32_t k = 0; cq->valid && k < cq->count; k++) {
            if (cq->ring[(cq->head + k) % cq->depth].sq_id == sq_id) {
                return 1;
            }
        }
    }
    return 0;
}

drvError_t halSqCqQuery(uint32_t devId, struct halSqCqQueryInfo* info)
{
    (void)devId;
    if (info->type != DRV_NORMAL_TYPE || info->sqId >= FH_MAX_SQ) {
        memset(info->value, 0, sizeof(info->value));
        return DRV_ERROR_NONE;
    }
    pthread_mutex_lock(&g_lock);
    struct fh_sq* sq = &g_sq[info->sqId];
    if (!sq->valid) {
        pthread_mutex_unlock(&g_lock);
        return DRV_ERROR_INVALID_VALUE;
    }
    memset(info->value, 0, sizeof(info->value));
    switch (info->prop) {
        case DRV_SQCQ_PROP_SQ_STATUS:
            /* 0, "disabled", always, a simplification: a stream's destroy then reclaims its
             * tasks at once instead of waiting up to 30 s for a busy queue to drain
             * (stream.cc:1509-1520), and the resume of a stopped queue finds it disabled at
             * the first look (stars_engine.cc:1437-1449) */
            info->value[0] = 0;
            break;
        case DRV_SQCQ_PROP_SQ_HEAD: /* npu_driver_standard_soc.cc:413-425 */
            info->value[0] = sq->head;
            break;
        case DRV_SQCQ_PROP_SQ_TAIL:
            info->value[0] = sq->tail;
            break;
        case DRV_SQCQ_PROP_SQ_REG_BASE:
            /* npu_driver_res.cc:1185-1203: value[0] the high, value[1] the low 32 bits of the
             * queue's register page, value[2] its size; 0 is refused (stream.cc:761-765) */
            info->value[0] = (uint32_t)((uintptr_t)sq->regs >> 32);
            info->value[1] = (uint32_t)((uintptr_t)sq->regs & 0xFFFFFFFFU);
            info->value[2] = FH_SQ_REG_SIZE;
            break;
        case DRV_SQCQ_PROP_SQ_DEPTH:
            info->value[0] = sq->depth;
            break;
        case DRV_SQCQ_PROP_SQE_SIZE:
            info->value[0] = FH_SQE_SIZE;
            break;
        case DRV_SQCQ_PROP_SQ_CQE_STATUS:
            /* whether a CQE of this queue waits in a logic CQ: the runtime reads the logic CQ
             * (and so sees an error CQE) only when this says so or the stream expects one
             * (npu_driver_res.cc:861-878 GetCqeStatus, stream.cc:4438 IsExistCqe,
             * stars_engine.cc:731-745 SendingProcReport); 0 made it reclaim the failed task by
             * the SQ head alone, as a success */
            info->value[0] = fh_sq_has_cqe_locked(info->sqId);
            break;
        default:
            break;
    }
    pthread_mutex_unlock(&g_lock);
    return DRV_ERROR_NONE;
}

drvError_t halSqTaskSend(uint32_t devId, struct halTaskSendInfo* info)
{
    /* task_submit.cc:557-583 (v100): DRV_NORMAL_TYPE, sqe_addr, sqe_num, sqId */
    if (devId != 0 || info->type != DRV_NORMAL_TYPE || info->sqId >= FH_MAX_SQ) {
        return DRV_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&g_lock);
    struct fh_sq* sq = &g_sq[info->sqId];
    if (!sq->valid) {
        pthread_mutex_unlock(&g_lock);
        return DRV_ERROR_INVALID_VALUE;
    }
    uint32_t used = (sq->tail + sq->depth - sq->head) % sq->depth;
    if (used + info->sqe_num >= sq->depth) {
        pthread_mutex_unlock(&g_lock);
        return DRV_ERROR_QUEUE_FULL;
    }
    info->pos = sq->tail;
    for (uint32_t i = 0; i < info->sqe_num; i++) {
        memcpy(sq->ring + (size_t)sq->tail * FH_SQE_SIZE, info->sqe_addr + (size_t)i * FH_SQE_SIZE, FH_SQE_SIZE);
        sq->tail = (sq->tail + 1) % sq->depth;
    }
    const struct fh_sqe_header* h = (const struct fh_sqe_header*)info->sqe_addr;
    FH_TRACE("halSqTaskSend sq %u: %u SQE(s), first type %u stream %u task %u wr_cqe %u", info->sqId,
             info->sqe_num, h->type, h->rt_stream_id, h->task_id, h->wr_cqe);
    pthread_cond_broadcast(&sq->more);
    pthread_mutex_unlock(&g_lock);
    return DRV_ERROR_NONE;
}

/* halSqCqConfig's model (sqconfig.c holds the entry point: the header declares it weak).
 * A queue stopped at a failed SQE is resumed by the runtime after it handled the error CQE
 * (stars_engine.cc:1667-1693 ProcLogicCqReport: StarsCqeReceive, then StarsResumeRtsq):
 * the head moved past the failed SQE (:1497-1506 SetSqHead, npu_driver_res.cc:903-924
 * DRV_SQCQ_PROP_SQ_HEAD), then the queue enabled again (stars_engine.cc:1508-1519, not in
 * ABORT_ON_FAILURE mode; npu_driver_res.cc:2047-2066 EnableSq: DRV_SQCQ_PROP_SQ_STATUS 1).
 * Only a stopped queue's head and status are modelled: the runtime moves no running queue's
 * head in the paths these tests take. The rest answers "success, nothing to report". */
int fh_sq_config(uint32_t sq_id, uint32_t prop, uint32_t value)
{
    if (sq_id >= FH_MAX_SQ) {
        return DRV_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&g_lock);
    struct fh_sq* sq = &g_sq[sq_id];
    if (!sq->valid) {
        pthread_mutex_unlock(&g_lock);
        return DRV_ERROR_INVALID_VALUE;
    }
    if (prop == DRV_SQCQ_PROP_SQ_HEAD && sq->halted) {
        sq->head = value % sq->depth;
        sq->resumed = 1;
        FH_TRACE("sq %u: head set to %u while stopped", sq_id, sq->head);
    } else if (prop == DRV_SQCQ_PROP_SQ_STATUS && value == 1U && sq->halted) {
        sq->halted = 0;
        pthread_cond_broadcast(&g_hold_cond);
        FH_TRACE("sq %u: enabled again", sq_id);
    } else {
        FH_TRACE("sq %u: config prop %u value %u (not modelled)", sq_id, prop, value);
    }
    pthread_mutex_unlock(&g_lock);
    return DRV_ERROR_NONE;
}

drvError_t halCqReportRecv(uint32_t devId, struct halReportRecvInfo* info)
{
    /* npu_driver_res.cc:2287-2308 LogicCqReportV2: a logic CQ, a timeout in ms, room for
     * cqe_num 32-byte CQEs; report_cqe_num is the answer */
    (void)devId;
    if (info->type != DRV_LOGIC_TYPE || info->cqId >= FH_MAX_CQ) {
        info->report_cqe_num = 0;
        return DRV_ERROR_NONE;
    }
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    if (info->timeout > 0) {
        deadline.tv_sec += info->timeout / 1000;
        deadline.tv_nsec += (long)(info->timeout % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&g_lock);
    struct fh_cq* cq = &g_cq[info->cqId];
    while (cq->valid && cq->count == 0 && info->timeout != 0) {
        int rc = (info->timeout < 0) ? pthread_cond_wait(&g_cq_cond, &g_lock)
                                     : pthread_cond_timedwait(&g_cq_cond, &g_lock, &deadline);
        if (rc == ETIMEDOUT) {
            break;
        }
    }
    uint32_t n = 0;
    struct fh_cqe* outp = (struct fh_cqe*)info->cqe_addr;
    while (cq->valid && cq->count > 0 && n < info->cqe_num) {
        memcpy((void*)&outp[n], (const void*)&cq->ring[cq->head], sizeof(struct fh_cqe));
        /* An error CQE read leaves its queue stopped: the runtime resumes it once it has
         * handled the error (fh_sq_config) */
        cq->head = (cq->head + 1) % cq->depth;
        cq->count--;
        n++;
    }
    pthread_mutex_unlock(&g_lock);
    if (n > 0) {
        FH_TRACE("halCqReportRecv logic cq %u: %u CQE(s)", info->cqId, n);
    }
    info->report_cqe_num = n;
    if (n == 0 && info->timeout != 0) {
        return DRV_ERROR_WAIT_TIMEOUT;
    }
    return DRV_ERROR_NONE;
}
