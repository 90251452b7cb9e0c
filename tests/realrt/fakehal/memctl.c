/*
 * halMemCtl of the fake driver, in a file of its own: ascend_hal_base.h declares it
 * ASCEND_HAL_WEAK, and a definition in a file that includes that header is weak too, so the
 * generated stub's `return 0` would win. Hence no driver header here: the few definitions it
 * needs are mirrored from pkg_inc/driver/ascend_hal_define.h (cited).
 *
 * Modelled: the mapping of the inter-core sync (FFTS C2C control) register that a MIX kernel's
 * first argument points at. npu_driver_mem.cc:2498-2518 GetC2cCtrlAddr asks
 * halMemCtl(CTRL_TYPE_ADDR_MAP, {ADDR_MAP_TYPE_REG_C2C_CTRL, devid}); aclrtGetHardwareSyncAddr
 * and aclrtKernelArgsFinalize (api_impl.cc:8478-8511) answer it. A page of host memory here.
 * Every other control answers "success, nothing to report", as the generated stub did.
 */
#include <stddef.h>
#include <stdint.h>

#include "fakehal.h"

/* ascend_hal_define.h:891 CTRL_TYPE_ADDR_MAP, :937 ADDR_MAP_TYPE_REG_C2C_CTRL, :943-951 */
#define FH_CTRL_TYPE_ADDR_MAP 0
#define FH_ADDR_MAP_TYPE_REG_C2C_CTRL 1U
struct fh_addr_map_in {
    unsigned int addr_type;
    unsigned int devid;
};
struct fh_addr_map_out {
    unsigned long long ptr;
    unsigned long long len;
};

#define FH_C2C_CTRL_SIZE 4096U
static uint8_t g_c2c_ctrl[FH_C2C_CTRL_SIZE] __attribute__((aligned(4096)));

FH_EXPORT int halMemCtl(int type, void* param_value, size_t param_value_size, void* out_value, size_t* out_size_ret)
{
    if (type == FH_CTRL_TYPE_ADDR_MAP && param_value != NULL && param_value_size >= sizeof(struct fh_addr_map_in) &&
        out_value != NULL) {
        const struct fh_addr_map_in* in = (const struct fh_addr_map_in*)param_value;
        if (in->addr_type == FH_ADDR_MAP_TYPE_REG_C2C_CTRL) {
            struct fh_addr_map_out* out = (struct fh_addr_map_out*)out_value;
            out->ptr = (unsigned long long)(uintptr_t)g_c2c_ctrl;
            out->len = FH_C2C_CTRL_SIZE;
            if (out_size_ret != NULL) {
                *out_size_ret = sizeof(*out);
            }
            return 0;
        }
    }
    return aio_fakehal_unmodelled(__func__);
}
