"""The args-handle launch path (CANN 8.1-8.3): a host args image replayed through
``aclrtKernelArgs*`` and launched with ``aclrtLaunchKernelWithConfig``.

The runtime seam hands every path the same thing: one host args image and its placeholder table
(``HostArgs`` packed it). On this path the runtime builds the args buffer itself, so the image is
translated (``docs/cann-support.md`` §3.2, §3.4):

* the argument area (everything before the first placeholder data block, or the whole image
  without placeholders) is appended as *runs*: the bytes between two placeholder slots go in one
  ``aclrtKernelArgsAppend`` each, so the layout inside a run is the builder's (natural, or 8-byte
  slots), never re-padded; ``Append`` starts each run on an 8-byte boundary, where it already is
  (slots are 8-aligned);
* each placeholder slot becomes ``aclrtKernelArgsAppendPlaceHolder``;
* each data block is copied into the buffer ``aclrtKernelArgsGetPlaceHolderBuffer`` returns (the
  runtime places it, 8-aligned, after the overflow slot it appends);
* ``aclrtKernelArgsFinalize`` adds the hidden arguments: the inter-core sync address in slot 0 of
  a MIX kernel on A2/A3 (``aclrtKernelArgsInit`` reserved it, so the image lands 8 bytes later)
  and the overflow address after the arguments (§4.1).

The image's argument area must end where its first data block starts (rounded to 8): the
``HostArgs`` packing the library does for a function on this path guarantees it
(``FunctionInfo.tail_align``). The caller's buffer is not patched with device addresses on this
path (the runtime patches its own buffer). For a kernel that takes no parameters
(``FunctionInfo.params == ()``, which the runtime's probe tells) nothing is appended: the 8 zero
bytes an empty ``HostArgs()`` packs would be taken for a parameter, and the overflow slot
``Finalize`` appends after the parameters would move 8 bytes away from where the kernel reads it.
"""

from __future__ import annotations

import ctypes
from ctypes import byref, c_void_p
from typing import Any

from ..abi import param_error

__all__ = ["launch_with_args_handle"]

_FUNC = "aclrtKernelArgsAppendPlaceHolder"


def launch_with_args_handle(
    fn: dict[str, Any],
    func: int,
    num_blocks: int,
    stream: int,
    cfg_arg: Any,
    args_addr: int,
    args_size: int,
    entries: list[tuple[int, int]],
) -> None:
    """Build the args handle of ``func`` from the image at ``args_addr`` and launch it
    (``args_size`` 0: the kernel takes no parameters, nothing is appended)."""
    params_end = min((data for _, data in entries), default=args_size)
    slots = sorted(entries)
    for addr_offset, _ in slots:
        if addr_offset + 8 > params_end:
            raise param_error(
                _FUNC,
                f"placeholder slot at addrOffset={addr_offset} lies in the data area (which starts "
                f"at {params_end}): on the args-handle path every slot must precede the data",
            )
    handle = c_void_p()
    fn["aclrtKernelArgsInit"](func, byref(handle))
    args = handle.value
    param = c_void_p()
    param_ref = byref(param)
    append = fn["aclrtKernelArgsAppend"]
    cursor = 0
    placeholders: list[tuple[int | None, int]] = []
    for addr_offset, data_offset in slots:
        if addr_offset > cursor:
            append(args, args_addr + cursor, addr_offset - cursor, param_ref)
        fn["aclrtKernelArgsAppendPlaceHolder"](args, param_ref)
        placeholders.append((param.value, data_offset))
        cursor = addr_offset + 8
    if params_end > cursor:
        append(args, args_addr + cursor, params_end - cursor, param_ref)
    if placeholders:
        starts = sorted({data for _, data in placeholders})
        ends = dict(zip(starts, [*starts[1:], args_size], strict=True))
        buffer = c_void_p()
        get_buffer = fn["aclrtKernelArgsGetPlaceHolderBuffer"]
        for param_handle, data_offset in placeholders:
            size = ends[data_offset] - data_offset
            get_buffer(args, param_handle, size, byref(buffer))
            ctypes.memmove(buffer, args_addr + data_offset, size)
    fn["aclrtKernelArgsFinalize"](args)
    fn["aclrtLaunchKernelWithConfig"](func, num_blocks, stream, cfg_arg, args, None)
