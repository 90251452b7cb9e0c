"""A device kernel object the real CANN runtime's loader accepts, written with ``struct``.

``aclrtBinaryLoadFromData``/``FromFile`` hand the bytes to the runtime's own ELF reader
(``src/runtime/core/src/kernel/elf.cc``, ``program.cc``, ``binary_loader.cc`` of hicann/runtime,
paths below relative to ``src/runtime/core``). What it requires, and what this writer gives it:

- a 64-bit ELF (``elf.cc:1533``: ``e_ident[EI_CLASS]`` must be ELFCLASS64), little endian
  (``elf.cc:1502-1515``: ``e_ident[EI_DATA]`` picks the byte order; the ``\\x7fELF`` magic itself
  is never checked), 64-byte section headers (``elf.cc:225``: ``e_shentsize`` must be
  ``sizeof(Elf64_External_Shdr)``), every section and symbol inside the object's size
  (``elf.cc:249``, ``elf.cc:333``);
- ``e_machine`` other than 183 (``program.cc:950``: 183 is the AI CPU's machine; anything else
  is an AI Core binary);
- the device code is the span from the first section with ``SHF_ALLOC`` to the end of the last
  (``elf.cc:1450-1464``: ``text_offset``/``text_size``); it is copied as one block to device
  memory at load (``runtime.cc:4880-4937``, ``module.cc:120-190``), and a kernel's device address
  is that block's base plus its symbol's ``st_value`` (``kernel.cc:102-116``), so ``st_value`` is
  the offset inside ``.text``, which comes first;
- a ``SHT_SYMTAB`` with ``sh_entsize`` 24 linked to its ``.strtab`` (``elf.cc:1242-1275``) and
  at least one ``STT_FUNC`` (``elf.cc:1273``); a kernel is a ``STT_FUNC``, ``STB_GLOBAL``, not
  hidden, named symbol (``elf.cc:356-361``), its name the function's name
  (``aclrtBinaryGetFunction``) once a ``_mix_aic``/``_mix_aiv`` suffix is stripped
  (``program.cc:1543-1563``): two symbols of one stripped name are merged into one MIX kernel
  (``program.cc:1736-1813``);
- per kernel, a ``SHT_PROGBITS`` section ``.ascend.meta.<symbol>`` (``elf.cc:919``) of TLVs
  (little-endian ``uint16`` type and length, the length not counting the 4-byte head:
  ``elf.cc:737-760``):

  - ``RT_FUNCTION_TYPE_KERNEL_TYPE`` (1): the function type, ``uint32`` (``elf.cc:655``):
    3 = AIV (``KERNEL_FUNCTION_TYPE_AIV``, ``inc/kernel/elf.hpp``), 4 = MIX with the cube core
    main (``KERNEL_FUNCTION_TYPE_MIX_AIC_MAIN``: ``program.cc:1580-1640`` then decides the
    kernel type and MIX type from it and the name's suffix);
  - ``RT_FUNCTION_TYPE_DFX_TYPE`` (4): its nested TLVs are **big endian** with lengths in
    8-byte units (``elf.cc:529-566``); the kernel's user parameter count, the most
    ``aclrtKernelArgsAppend`` accepts (``api_impl.cc:8515-8526``), is 1 (reserved for the
    overflow slot, ``elf.cc:542``) plus one per ``RT_FUNCTION_TYPE_DFX_ARG_INFO`` (5) entry
    that fits in the TLV's length less 4 bytes (``elf.cc:539``: there the length is taken to
    include the head, unlike ``elf.cc:748``, so the last entry never counts). With one entry
    per parameter, as here, the count is the parameter count; an empty DFX TLV leaves it 0
    (``elf.cc:534-536``), and so does no DFX TLV for a kernel that has a meta section (its
    ``ElfKernelInfo`` is value-initialised and ``elf.cc:1158`` copies it): every ``Append``
    is then refused, which the library's probe reads as "no parameters";
  - ``RT_FUNCTION_TYPE_FUNCTION_ENTRY_INFO`` (14): flag 0 and a distinct ``uint64`` entry
    (``elf.cc:703-714``, ``elf.cc:1056-1075``), the key the kernel is filed under in the
    program's kernel table (``program.cc:1130-1160``, ``program.cc:1693-1712``); without it the
    key comes from a numeric name suffix, 0 for all of ours (``program.cc:1043-1062``);
  - ``RT_FUNCTION_TYPE_PARAM_SUMMARY`` (16) and one ``RT_FUNCTION_TYPE_PARAM_INFO`` (17) per
    parameter (``elf.cc:594-640``): what ``aclrtFunctionGetParamCount``/``GetParamInfo``
    answer; the count of infos must equal the summary's (``elf.cc:1096``), each ``ordinal``
    below it (``elf.cc:1114``).

Each kernel's code is a 64-byte marker, ``AIOKERN1`` and the kernel's name: our fake driver
(``tests/realrt/fakehal``) reads it at the PC address of a launch's SQE to know which host
function to run (there is no device code here).

Run as a script to write the object: ``python tests/realrt/make_kernel_elf.py OUT.o``.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KERNELS", "MARKER", "SAMPLE_KERNELS", "Kernel", "kernel_elf", "write_kernel_elf"]

#: the first 8 bytes of every kernel's code: the fake driver's way back to the name
MARKER = b"AIOKERN1"
CODE_SIZE = 64

# function types (src/runtime/core/inc/kernel/elf.hpp, KERNEL_FUNCTION_TYPE_*)
FUNC_AIV = 3
FUNC_MIX_AIC_MAIN = 4
# TLV types (pkg_inc/runtime/rt_external_base.h:604-622, rtFunctionMetaType)
TLV_KERNEL_TYPE = 1
TLV_DFX_TYPE = 4
TLV_DFX_ARG_INFO = 5
TLV_FUNCTION_ENTRY = 14
TLV_PARAM_SUMMARY = 16
TLV_PARAM_INFO = 17

SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB = 1, 2, 3
SHF_ALLOC, SHF_EXECINSTR = 0x2, 0x4
STB_GLOBAL, STT_FUNC = 1, 2
EM_NONE = 0  # anything but 183 (program.cc:950)


@dataclass(frozen=True)
class Kernel:
    """One kernel: its name, its parameters' sizes in order, whether it is a MIX kernel (a
    cube and a vector half, ``<name>_mix_aic`` + ``<name>_mix_aiv``), and the host function
    the fake driver runs for it (its marker; the kernel's name by default)."""

    name: str
    params: tuple[int, ...]
    mix: bool = False
    host: str = ""

    @property
    def marker_name(self) -> str:
        return self.host or self.name


#: the sim's built-in kernels (``aio_ascend/_runtime/sim/kernels.py``) with their parameters,
#: and one MIX kernel (``vector_add``'s arguments, run on a cube and a vector core)
KERNELS: tuple[Kernel, ...] = (
    Kernel("vector_add", (8, 8, 8, 4)),
    Kernel("axpy", (8, 8, 4, 4)),
    Kernel("scale", (8, 8, 8)),
    Kernel("matmul", (8, 8, 8, 8)),
    Kernel("sleep", (4,)),
    Kernel("fault", (4,)),
    Kernel("hang", ()),
    Kernel("noop", ()),
    Kernel("mix_vector_add", (8, 8, 8, 4), mix=True),
)

#: the kernels of the two hicann/runtime samples rewritten in ``examples/``: ``add_custom``
#: (``acl_launch_kernel.py``: float16 z = x + y; placeholder mode takes the tiling values
#: behind two more pointers, simple mode only the three pointers) and ``LongOPf``/``ShortOPf``
#: (``acl_multi_stream.py``)
SAMPLE_KERNELS: dict[str, tuple[Kernel, ...]] = {
    "add_custom_placeholder": (Kernel("add_custom", (8, 8, 8, 8, 8)),),
    "add_custom_simple": (Kernel("add_custom", (8, 8, 8), host="add_custom_simple"),),
    "multi_stream": (Kernel("LongOPf", (8,)), Kernel("ShortOPf", (8,))),
}


def _tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("<HH", kind, len(value)) + value


def _meta(kernel: Kernel, func_type: int, entry: int) -> bytes:
    """The ``.ascend.meta.<symbol>`` section of one symbol of ``kernel``."""
    # DFX: big-endian nested TLVs, lengths in 8-byte units (elf.cc:544-557)
    dfx = b"".join(struct.pack(">HH", TLV_DFX_ARG_INFO, 1) + bytes(8) for _ in kernel.params)
    body = _tlv(TLV_KERNEL_TYPE, struct.pack("<I", func_type))
    body += _tlv(TLV_DFX_TYPE, dfx)
    # flag 0: a function entry (elf.hpp ElfKernelFunctionEntryInfo: flag, resv0, resv1, entry)
    body += _tlv(TLV_FUNCTION_ENTRY, struct.pack("<BBHQ", 0, 0, 0, entry))
    offsets, offset = [], 0
    for size in kernel.params:
        offset = -(-offset // size) * size  # natural alignment, as a compiler lays them out
        offsets.append(offset)
        offset += size
    body += _tlv(TLV_PARAM_SUMMARY, struct.pack("<IQ", len(kernel.params), offset))
    for ordinal, (where, size) in enumerate(zip(offsets, kernel.params, strict=True)):
        # ElfParamBody: index, ordinal, offset, size, align, paramType, spaceIndex,
        # spaceType, space, resv (elf.hpp)
        info = struct.pack("<IIIIHHIIII", ordinal, ordinal, where, size, size, 0, 0, 0, 0, 0)
        body += _tlv(TLV_PARAM_INFO, info)
    return body


def _symbols(kernels: tuple[Kernel, ...]) -> list[tuple[str, Kernel, int]]:
    """(symbol name, kernel, function type) per symbol, in ``.text`` order."""
    out = []
    for kernel in kernels:
        if kernel.mix:
            out.append((f"{kernel.name}_mix_aic", kernel, FUNC_MIX_AIC_MAIN))
            out.append((f"{kernel.name}_mix_aiv", kernel, FUNC_MIX_AIC_MAIN))
        else:
            out.append((kernel.name, kernel, FUNC_AIV))
    return out


def kernel_elf(kernels: tuple[Kernel, ...] = KERNELS) -> bytes:
    """The object's bytes."""
    symbols = _symbols(kernels)
    text = b"".join(
        (MARKER + kernel.marker_name.encode()).ljust(CODE_SIZE, b"\0") for _, kernel, _ in symbols
    )
    entries = {kernel.name: index + 1 for index, kernel in enumerate(kernels)}
    # sections: (name, type, flags, data, link, info, align, entsize)
    sections: list[tuple[str, int, int, bytes, int, int, int, int]] = [
        (".text", SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, text, 0, 0, 64, 0)
    ]
    for symbol, kernel, func_type in symbols:
        meta = _meta(kernel, func_type, entries[kernel.name])
        sections.append((f".ascend.meta.{symbol}", SHT_PROGBITS, 0, meta, 0, 0, 4, 0))
    strtab = b"\0"
    symtab = bytes(24)  # the null symbol
    for index, (symbol, _, _) in enumerate(symbols):
        name_offset = len(strtab)
        strtab += symbol.encode() + b"\0"
        # Elf64_Sym: name, info, other, shndx, value, size; .text is section 1
        info = (STB_GLOBAL << 4) | STT_FUNC
        symtab += struct.pack("<IBBHQQ", name_offset, info, 0, 1, index * CODE_SIZE, CODE_SIZE)
    strtab_index = len(sections) + 2  # after .symtab (the null section is index 0)
    sections.append((".symtab", SHT_SYMTAB, 0, symtab, strtab_index, 1, 8, 24))
    sections.append((".strtab", SHT_STRTAB, 0, strtab, 0, 0, 1, 0))
    shstrtab = b"\0"
    names = []
    for name, *_ in sections:
        names.append(len(shstrtab))
        shstrtab += name.encode() + b"\0"
    names.append(len(shstrtab))
    shstrtab += b".shstrtab\0"
    sections.append((".shstrtab", SHT_STRTAB, 0, shstrtab, 0, 0, 1, 0))

    blob = bytearray(64)  # the ELF header, written last
    headers = [bytes(64)]  # the null section
    for (_, kind, flags, data, link, info, align, entsize), name in zip(
        sections, names, strict=True
    ):
        while len(blob) % align:
            blob += b"\0"
        offset = len(blob)
        blob += data
        headers.append(
            struct.pack(
                "<IIQQQQIIQQ", name, kind, flags, 0, offset, len(data), link, info, align, entsize
            )
        )
    while len(blob) % 8:
        blob += b"\0"
    shoff = len(blob)
    blob += b"".join(headers)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # ELFCLASS64, little endian, version 1
    # e_type ET_REL, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize,
    # e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
    blob[0:64] = ident + struct.pack(
        "<HHIQQQIHHHHHH",
        1,
        EM_NONE,
        1,
        0,
        0,
        shoff,
        0,
        64,
        0,
        0,
        64,
        len(headers),
        len(headers) - 1,
    )
    return bytes(blob)


def write_kernel_elf(path: str | Path, kernels: tuple[Kernel, ...] = KERNELS) -> Path:
    """Write the object to ``path`` (returned)."""
    out = Path(path)
    out.write_bytes(kernel_elf(kernels))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_kernel_elf.py OUT.o")
    write_kernel_elf(sys.argv[1])
