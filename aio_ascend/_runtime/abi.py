"""The ACL facts every layer shares, defined once: constants, limits, codes, argument checks.

Values are read off the CANN headers (``shared/docs/acl-abi/acl_abi_facts.json``); the ABI test
compares them with that file.
"""

from __future__ import annotations

__all__ = [
    "ACL_CONTINUE_ON_FAILURE",
    "ACL_EVENT_CAPTURE_STREAM_PROGRESS",
    "ACL_EVENT_RECORDED_STATUS_COMPLETE",
    "ACL_EVENT_RECORDED_STATUS_NOT_READY",
    "ACL_EVENT_SYNC",
    "ACL_EVENT_TIME_LINE",
    "ACL_MEMCPY_DEVICE_TO_DEVICE",
    "ACL_MEMCPY_DEVICE_TO_HOST",
    "ACL_MEMCPY_HOST_TO_DEVICE",
    "ACL_STOP_ON_FAILURE",
    "MAX_NUM_BLOCKS",
    "PLACEHOLDER_INFO_SIZE",
    "UINT32_MAX",
]

# Values read off the CANN headers (shared/docs/acl-abi/acl_abi_facts.json).
ACL_EVENT_RECORDED_STATUS_NOT_READY = 0
ACL_EVENT_RECORDED_STATUS_COMPLETE = 1
ACL_EVENT_SYNC = 0x01
ACL_EVENT_CAPTURE_STREAM_PROGRESS = 0x02
ACL_EVENT_TIME_LINE = 0x08
ACL_STOP_ON_FAILURE = 1
ACL_CONTINUE_ON_FAILURE = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3

#: ``numBlocks`` must lie in 1..MAX_NUM_BLOCKS (the HostArgs path casts it to uint16).
MAX_NUM_BLOCKS = 65535
#: ``sizeof(aclrtPlaceHolderInfo)``: two uint32 (addrOffset, dataOffset).
PLACEHOLDER_INFO_SIZE = 8
UINT32_MAX = 2**32 - 1
