/*
 * halSqCqConfig of the fake driver, in a file of its own: ascend_hal_base.h:4367 declares it
 * ASCEND_HAL_WEAK, and a definition in a file that includes that header is weak too, so the
 * generated stub's `return 0` would win (as for halMemCtl: memctl.c). Hence no driver header
 * here: the struct is mirrored from pkg_inc/driver/hal_pkg/trs_pkg.h:99-106 (its enums are
 * ints). The model itself is fh_sq_config (fakehal.c).
 */
#include <stdint.h>

#include "fakehal.h"

/* trs_pkg.h:36 DRV_NORMAL_TYPE, :95 SQCQ_CONFIG_INFO_LENGTH */
#define FH_DRV_NORMAL_TYPE 0
#define FH_SQCQ_CONFIG_INFO_LENGTH 8

struct fh_sqcq_config_info {
    int type;
    uint32_t tsId;
    uint32_t sqId;
    uint32_t cqId;
    int prop;
    uint32_t value[FH_SQCQ_CONFIG_INFO_LENGTH];
};

FH_EXPORT int halSqCqConfig(uint32_t devId, struct fh_sqcq_config_info* info)
{
    if (devId != 0 || info == 0 || info->type != FH_DRV_NORMAL_TYPE) {
        return aio_fakehal_unmodelled(__func__);
    }
    return fh_sq_config(info->sqId, (uint32_t)info->prop, info->value[0]);
}
