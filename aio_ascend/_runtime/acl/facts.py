"""What the ``acl`` backend can tell about its device and release (``Runtime.info``).

Each fact comes from one ACL call; a release that lacks the call gives ``None`` for it
(``docs/cann-support.md`` §1: the version and device queries differ per release):

* ``runtime_version``: ``aclrtGetVersion``'s ``major.minor.patch`` (the ACL API version, 1.16.0
  in 8.5.0, 1.17.0 in 9.x; 8.5 on), else the CANN version; ``cann_version``
  (``aclsysGetCANNVersion``, 8.2 on);
* ``soc_name`` (``aclrtGetSocName``); ``ai_core_count``, ``cube_core_count``,
  ``vector_core_count`` (``aclrtGetDeviceInfo`` with ``ACL_DEV_ATTR_*``, 8.2 on; ``None`` for a
  kind of core the chip lacks);
* ``memory_free``/``memory_total``: HBM (``aclrtGetMemInfo(ACL_HBM_MEM)``, 8.5 on);
* ``stream_priority_least``/``_greatest`` (``aclrtDeviceGetStreamPriorityRange``, 8.5 on).
"""

from __future__ import annotations

from ctypes import byref, c_int32, c_int64, c_size_t
from typing import Any, Final

from ..._errors import RuntimeAPIError
from ..abi import (
    ACL_DEV_ATTR_AICORE_CORE_NUM,
    ACL_DEV_ATTR_CUBE_CORE_NUM,
    ACL_DEV_ATTR_VECTOR_CORE_NUM,
)
from .library import AclLibrary

__all__ = ["ACL_HBM_MEM", "device_facts"]

#: ``aclrtMemAttr``: HBM, what ``info()`` reports (``acl_prototypes_more.json`` "types")
ACL_HBM_MEM: Final = 1


def device_facts(fn: dict[str, Any], library: AclLibrary, device_id: int) -> dict[str, object]:
    """The facts above, read afresh (the calling thread bound to the device's context)."""
    has = library.has
    facts: dict[str, object] = {
        "runtime_version": library.cann_version or "unknown",
        "cann_version": library.cann_version,
        "memory_free": None,
        "memory_total": None,
        "stream_priority_least": None,
        "stream_priority_greatest": None,
    }
    if has("aclrtGetVersion"):
        major, minor, patch = c_int32(), c_int32(), c_int32()
        fn["aclrtGetVersion"](byref(major), byref(minor), byref(patch))
        facts["runtime_version"] = f"{major.value}.{minor.value}.{patch.value}"
    if has("aclrtGetMemInfo"):
        free, total = c_size_t(), c_size_t()
        fn["aclrtGetMemInfo"](ACL_HBM_MEM, byref(free), byref(total))
        facts["memory_free"], facts["memory_total"] = int(free.value), int(total.value)
    if has("aclrtDeviceGetStreamPriorityRange"):
        least, greatest = c_int32(), c_int32()
        fn["aclrtDeviceGetStreamPriorityRange"](byref(least), byref(greatest))
        facts["stream_priority_least"] = least.value
        facts["stream_priority_greatest"] = greatest.value
    raw = fn["aclrtGetSocName"]() if has("aclrtGetSocName") else None
    facts["soc_name"] = raw.decode("utf-8", "replace") if raw else None
    for key, attr in (
        ("ai_core_count", ACL_DEV_ATTR_AICORE_CORE_NUM),
        ("cube_core_count", ACL_DEV_ATTR_CUBE_CORE_NUM),
        ("vector_core_count", ACL_DEV_ATTR_VECTOR_CORE_NUM),
    ):
        facts[key] = _device_attribute(fn, library, device_id, attr)
    return facts


def _device_attribute(
    fn: dict[str, Any], library: AclLibrary, device: int, attr: int
) -> int | None:
    """``aclrtGetDeviceInfo(device, attr)``; ``None`` where the release lacks the function or
    refuses the attribute (a chip without that kind of core)."""
    if not library.has("aclrtGetDeviceInfo"):
        return None
    value = c_int64()
    try:
        fn["aclrtGetDeviceInfo"](device, attr, byref(value))
    except RuntimeAPIError:
        return None
    return int(value.value)
