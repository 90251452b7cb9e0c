"""The ctypes declarations of the acl backend against the facts read off the CANN headers.

``shared/docs/acl-abi/`` (next to the repository) holds struct sizes/offsets, constant values and
the C prototypes, produced by compiling against the real headers. Every ctypes struct, constant
and prototype the backend declares must match them exactly: the required prototypes
``acl_prototypes.json``, the optional ones ``acl_prototypes_more.json`` (where one is missing
there, the declaration in ``shared/docs/acl-runtime.md``).
"""

from __future__ import annotations

import ctypes
import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from aio_ascend._errors import AclCode
from aio_ascend._launch_config import LAUNCH_ATTR_SIZE, LAUNCH_CFG_SIZE, LaunchAttrId, LaunchConfig
from aio_ascend._runtime import abi as _base
from aio_ascend._runtime.acl import ffi
from aio_ascend._runtime.acl import runtime as acl_runtime

ABI_DIR = Path(__file__).resolve().parents[3] / "shared/docs/acl-abi"
RUNTIME_DOC = ABI_DIR.parent / "acl-runtime.md"

pytestmark = pytest.mark.skipif(
    not (ABI_DIR / "acl_abi_facts.json").is_file(),
    reason=f"the ACL ABI facts are not available at {ABI_DIR}",
)


def _load(name: str) -> Any:
    return json.loads((ABI_DIR / name).read_text())


@pytest.fixture(scope="module")
def facts() -> dict[str, int]:
    data: dict[str, int] = _load("acl_abi_facts.json")
    data.pop("end", None)
    return data


@pytest.fixture(scope="module")
def prototypes() -> dict[str, Any]:
    data: dict[str, Any] = _load("acl_prototypes.json")
    return data


@pytest.fixture(scope="module")
def more() -> dict[str, Any]:
    """``acl_prototypes_more.json``: ``prototypes`` (same format) and ``types`` (typedef text)."""
    data: dict[str, Any] = _load("acl_prototypes_more.json")
    return data


@pytest.fixture(scope="module")
def runtime_doc() -> str:
    if not RUNTIME_DOC.is_file():
        pytest.skip(f"{RUNTIME_DOC} is not available")
    return RUNTIME_DOC.read_text()


# --- structs ----------------------------------------------------------------------------------


def test_every_struct_in_the_facts_is_declared_with_the_same_size(facts: dict[str, int]) -> None:
    sizes = {key.split()[1]: value for key, value in facts.items() if key.startswith("sizeof ")}
    assert sizes, "no struct sizes in the facts"
    for name, size in sizes.items():
        assert name in ffi.STRUCTS, f"struct {name} is not declared in _acl_ffi"
        assert ctypes.sizeof(ffi.STRUCTS[name]) == size, name


def test_every_offset_in_the_facts_matches(facts: dict[str, int]) -> None:
    offsets = {key.split()[1]: value for key, value in facts.items() if key.startswith("offsetof ")}
    assert offsets
    for dotted, offset in offsets.items():
        struct_name, field = dotted.split(".")
        assert getattr(ffi.STRUCTS[struct_name], field).offset == offset, dotted


def test_the_stream_attribute_value_is_a_16_byte_8_aligned_union() -> None:
    # not in the facts; layout from the brief and the CANN docs: a uint64 failureMode, four
    # uint32 members and uint32 reserve[4], every one at offset 0
    assert ctypes.sizeof(ffi.AclrtStreamAttrValue) == 16
    assert ctypes.alignment(ffi.AclrtStreamAttrValue) == 8
    assert ctypes.sizeof(ffi.AclrtStreamAttrValue * 2) == 32
    for member, *_ in ffi.AclrtStreamAttrValue._fields_:
        assert getattr(ffi.AclrtStreamAttrValue, member).offset == 0, member
    value = ffi.AclrtStreamAttrValue()
    value.streamPriority = 7
    assert bytes(value) == struct.pack("<I", 7) + bytes(12)
    assert ffi.STRUCTS["aclrtStreamAttrValue"] is ffi.AclrtStreamAttrValue


def test_struct_alignment_matches_c() -> None:
    # 4-aligned unions: an array of attrs has no padding between the 20-byte entries
    assert ctypes.alignment(ffi.AclrtLaunchKernelAttrValue) == 4
    assert ctypes.sizeof(ffi.AclrtLaunchKernelAttr * 3) == 60
    assert ctypes.sizeof(ffi.AclrtPlaceHolderInfo * 3) == 24
    assert ctypes.sizeof(ffi.AclrtBinaryLoadOption * 2) == 40


def test_union_members_sit_at_the_start_of_the_value() -> None:
    value_offset = ffi.AclrtLaunchKernelAttr.value.offset
    for member, *_ in ffi.AclrtLaunchKernelAttrValue._fields_:
        assert getattr(ffi.AclrtLaunchKernelAttrValue, member).offset == 0, member
    assert value_offset == 4
    assert ffi.AclrtTimeoutUs.timeoutHigh.offset == 4


def test_launch_config_packing_agrees_with_the_ctypes_structs() -> None:
    assert ctypes.sizeof(ffi.AclrtLaunchKernelAttr) == LAUNCH_ATTR_SIZE
    assert ctypes.sizeof(ffi.AclrtLaunchKernelCfg) == LAUNCH_CFG_SIZE
    cfg = LaunchConfig(schedule_mode="batch", timeout_us=(7 << 32) | 9, block_dim_offset=5)
    attrs = (ffi.AclrtLaunchKernelAttr * cfg.num_attrs).from_buffer_copy(cfg.pack_attrs())
    by_id = {attr.id: attr.value for attr in attrs}
    assert by_id[LaunchAttrId.SCHEM_MODE].schemMode == 1
    assert by_id[LaunchAttrId.BLOCKDIM_OFFSET].blockDimOffset == 5
    timeout = by_id[LaunchAttrId.TIMEOUT_US].timeoutUs
    assert (timeout.timeoutLow, timeout.timeoutHigh) == (9, 7)
    seconds = LaunchConfig(timeout_s=300)
    (attr,) = (ffi.AclrtLaunchKernelAttr * 1).from_buffer_copy(seconds.pack_attrs())
    assert (attr.id, attr.value.timeout) == (LaunchAttrId.TIMEOUT, 300)


# --- constants --------------------------------------------------------------------------------


#: constants of the facts the backends do not use, so no layer declares them (rule: each ACL
#: constant is defined once, where it is used)
_UNUSED = {
    "ACL_MEM_MALLOC_NORMAL_ONLY",
    "ACL_CALLBACK_NO_BLOCK",
    "ACL_CALLBACK_BLOCK",
    "ACL_STREAM_FAST_LAUNCH",
    "ACL_STREAM_FAST_SYNC",
}
_ATTR_PREFIX = "ACL_RT_LAUNCH_KERNEL_ATTR_"
_ERROR_PREFIX = "ACL_ERROR_"


def _declared(name: str) -> int | None:
    """Where the one definition of a facts constant lives: LaunchAttrId, AclCode or abi."""
    if name.startswith(_ATTR_PREFIX):
        member = getattr(LaunchAttrId, name[len(_ATTR_PREFIX) :], None)
        return None if member is None else int(member)
    if name.startswith(_ERROR_PREFIX):
        code = getattr(AclCode, name[len(_ERROR_PREFIX) :], None)
        assert getattr(_base, name, code) == code, f"abi.{name} is not AclCode's number"
        return None if code is None else int(code)
    value = getattr(_base, name, None)
    return None if value is None else int(value)


def test_every_constant_in_the_facts_is_declared_once_with_the_same_value(
    facts: dict[str, int],
) -> None:
    constants = {key: value for key, value in facts.items() if key.startswith("ACL_")}
    assert len(constants) > 30
    for name, value in constants.items():
        if name in _UNUSED:
            assert _declared(name) is None, f"{name} is declared but unused: drop it from _UNUSED"
            continue
        assert _declared(name) == value, f"{name}: not declared, or not {value}"
    for name in vars(ffi):
        assert not name.startswith("ACL_"), f"ffi declares {name}: constants belong in abi.py"


def test_the_protocol_and_config_constants_agree_with_the_facts(facts: dict[str, int]) -> None:
    for name in _base.__all__:
        if name in facts:
            assert getattr(_base, name) == facts[name], name
    assert facts["sizeof aclrtPlaceHolderInfo"] == _base.PLACEHOLDER_INFO_SIZE
    for key, value in facts.items():
        if key.startswith(_ATTR_PREFIX):
            assert getattr(LaunchAttrId, key[len(_ATTR_PREFIX) :]) == value, key


# --- prototypes -------------------------------------------------------------------------------

# typedefs of the CANN headers, resolved to the C spelling of the ctypes type that carries them
_TYPEDEFS = {
    "aclError": "int",
    "int": "int",
    "int32_t": "int32_t",
    "uint32_t": "uint32_t",
    "uint64_t": "uint64_t",
    "size_t": "size_t",
    # opaque handles (void *) and function pointers
    "aclrtContext": "void*",
    "aclrtStream": "void*",
    "aclrtEvent": "void*",
    "aclrtBinHandle": "void*",
    "aclrtFuncHandle": "void*",
    "aclrtArgsHandle": "void*",
    "aclrtBinary": "void*",
    "aclrtParamHandle": "void*",
    "aclrtCallback": "void*",
    "aclrtExceptionInfoCallback": "void*",
    # enums passed by value are ints
    "aclrtMemAttr": "int",
    "aclrtStreamAttr": "int",
    "aclrtMemMallocPolicy": "int",
    "aclrtMemcpyKind": "int",
    "aclrtCallbackBlockType": "int",
    "aclrtLastErrLevel": "int",
    "aclCANNPackageName": "int",
    "aclrtDevAttr": "int",
    "aclmdlRICaptureMode": "int",
    # model-RI handle
    "aclmdlRI": "void*",
}


def _c_type(declaration: str, *, has_name: bool) -> str:
    """The C spelling the ctypes declaration must map back to, for one parameter/return type."""
    text = declaration.strip()
    if has_name:
        match = re.fullmatch(r"(.*?)\s*\b([A-Za-z_]\w*)", text)
        assert match, declaration
        text = match.group(1)
    text = re.sub(r"\s+", " ", text.replace("*", " * ")).strip()
    pointer = text.endswith("*")
    base = text.rstrip("* ").strip()
    const = base.startswith("const ")
    base = base.removeprefix("const ").strip()
    if pointer:
        if base == "char" and const:
            return "const char*"
        return "void*"  # every other pointer (out-params, structs, buffers) is a c_void_p
    assert base in _TYPEDEFS, f"unknown C type {base!r} in {declaration!r}"
    return _TYPEDEFS[base]


#: C spelling -> the ctypes type that must carry it
_CTYPES: dict[str, Any] = {
    "int": ctypes.c_int,
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
    "void*": ctypes.c_void_p,
    "const char*": ctypes.c_char_p,
}


def _same_ctype(actual: Any, c_name: str) -> bool:
    expected = _CTYPES[c_name]
    # on LP64, c_int is c_int32 and c_size_t is c_uint64: identity covers the aliases
    return actual is expected


def test_the_c_widths_hold_here() -> None:
    assert ctypes.sizeof(ctypes.c_int) == 4
    assert ctypes.sizeof(ctypes.c_size_t) == 8
    assert ctypes.sizeof(ctypes.c_void_p) == 8


def test_every_bound_function_has_the_header_prototype(prototypes: dict[str, Any]) -> None:
    assert ffi.PROTOTYPES
    for name, declared in ffi.PROTOTYPES.items():
        assert name in prototypes, f"{name} is bound but not in acl_prototypes.json"
        _check_prototype(name, declared, prototypes[name])


def _check_prototype(name: str, declared: tuple[Any, tuple[Any, ...]], c_proto: Any) -> None:
    restype, argtypes = declared
    assert _same_ctype(restype, _c_type(c_proto["returns"], has_name=False)), name
    expected = [_c_type(param, has_name=True) for param in c_proto["params"]]
    assert len(argtypes) == len(expected), f"{name}: {len(argtypes)} != {len(expected)} params"
    for index, (argtype, c_name) in enumerate(zip(argtypes, expected, strict=True)):
        assert _same_ctype(argtype, c_name), (
            f"{name} parameter {index} ({c_proto['params'][index]}): declared as "
            f"{ffi.CTYPE_NAMES.get(argtype, argtype)}, the header says {c_name}"
        )


#: optional functions whose prototype neither JSON carries: checked against their declaration
#: in acl-runtime.md instead (a list that must not grow silently)
_DOC_ONLY = {
    "aclrtDeviceGetStreamPriorityRange",
    "aclrtStreamGetId",
    "aclrtDestroyBinary",
    "aclrtGetThreadLastTaskId",
    "aclrtSynchronizeDeviceWithTimeout",
}


def _doc_prototype(doc: str, name: str) -> dict[str, Any]:
    """``{"returns", "params"}`` of ``name`` as declared in a C block of acl-runtime.md."""
    # a declaration starts a line or follows another one on it (``aclError f(void); ...``)
    match = re.search(
        rf"(?:^|;[ \t]*)(\w[\w\s\*]*?)\s*\b{name}\s*\(([^)]*)\)\s*;", doc, re.MULTILINE
    )
    assert match, f"{name} is not declared in {RUNTIME_DOC.name}"
    params = [param.strip() for param in match.group(2).split(",") if param.strip()]
    if params == ["void"]:
        params = []
    return {"returns": match.group(1).strip(), "params": params}


def test_every_optional_function_has_the_header_prototype(
    prototypes: dict[str, Any], more: dict[str, Any], runtime_doc: str
) -> None:
    assert ffi.OPTIONAL_PROTOTYPES
    headers = {**prototypes, **more["prototypes"]}
    for name in ffi.OPTIONAL_PROTOTYPES:
        if name in prototypes and name in more["prototypes"]:
            assert prototypes[name] == more["prototypes"][name], name
    assert {name for name in ffi.OPTIONAL_PROTOTYPES if name not in headers} == _DOC_ONLY
    for name, declared in ffi.OPTIONAL_PROTOTYPES.items():
        c_proto = headers[name] if name in headers else _doc_prototype(runtime_doc, name)
        _check_prototype(name, declared, c_proto)


def test_optional_and_required_functions_are_disjoint() -> None:
    assert not set(ffi.PROTOTYPES) & set(ffi.OPTIONAL_PROTOTYPES)


def test_the_optional_functions_are_what_the_releases_differ_in() -> None:
    assert set(ffi.OPTIONAL_PROTOTYPES) == {
        # stream priorities, memset, version, memory and SoC queries
        "aclrtSetStreamAttribute", "aclrtDeviceGetStreamPriorityRange", "aclrtMemsetAsync",
        "aclrtGetVersion", "aclrtGetMemInfo", "aclrtGetSocName",
        # loaders and the three launch paths
        "aclrtBinaryLoadFromFile", "aclrtBinaryLoadFromData", "aclrtLaunchKernelWithHostArgs",
        "aclrtCreateBinary", "aclrtBinaryLoad", "aclrtDestroyBinary", "aclrtLaunchKernel",
        "aclrtKernelArgsInit", "aclrtKernelArgsAppend", "aclrtKernelArgsAppendPlaceHolder",
        "aclrtKernelArgsGetPlaceHolderBuffer", "aclrtKernelArgsFinalize",
        "aclrtLaunchKernelWithConfig", "aclrtKernelArgsGetHandleMemSize",
        "aclrtKernelArgsGetMemSize", "aclrtKernelArgsInitByUserMem",
        # release and device facts, stream ids and priorities
        "aclsysGetCANNVersion", "aclrtGetDeviceInfo", "aclrtStreamGetId",
        "aclrtCreateStreamWithConfig",
        # hidden MIX arguments, parameter info
        "aclrtGetHardwareSyncAddr", "aclrtCtxGetFloatOverflowAddr",
        "aclrtFunctionGetParamCount", "aclrtFunctionGetParamInfo",
        # exception info, last error
        "aclrtSetExceptionInfoCallback", "aclrtGetTaskIdFromExceptionInfo",
        "aclrtGetStreamIdFromExceptionInfo", "aclrtGetDeviceIdFromExceptionInfo",
        "aclrtGetErrorCodeFromExceptionInfo", "aclrtGetLastError", "aclrtPeekAtLastError",
        "aclrtExceptionInfoCallbackRegister", "aclrtExceptionInfoCallbackUnregister",
        # exact fault attribution, the device synchronize after a forced close
        "aclrtGetThreadLastTaskId", "aclrtSynchronizeDeviceWithTimeout",
        # model-RI capture (graphs)
        "aclmdlRICaptureBegin", "aclmdlRICaptureEnd", "aclmdlRIExecuteAsync", "aclmdlRIDestroy",
    }  # fmt: skip
    restype, argtypes = ffi.OPTIONAL_PROTOTYPES["aclrtGetSocName"]
    assert (restype, argtypes) == (ctypes.c_char_p, ())
    # the legacy loader returns its descriptor (NULL on failure), not an aclError
    assert ffi.OPTIONAL_PROTOTYPES["aclrtCreateBinary"] == (
        ctypes.c_void_p,
        (ctypes.c_void_p, ctypes.c_size_t),
    )
    # device args: funcHandle, uint32 numBlocks, device argsData, size_t argsSize, stream
    assert ffi.OPTIONAL_PROTOTYPES["aclrtLaunchKernel"][1] == (
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_void_p,
    )
    assert set(ffi.OPTIONAL_PROTOTYPES) >= ffi.VALUE_RETURNING


def test_the_launch_path_functions_are_optional() -> None:
    from aio_ascend._runtime.acl.paths import PATH_SYMBOLS

    for symbols in PATH_SYMBOLS.values():
        assert set(symbols) <= set(ffi.OPTIONAL_PROTOTYPES)


def test_the_cann_package_version_struct(more: dict[str, Any]) -> None:
    text = more["types"]["aclCANNPackageVersion"]
    fields = re.findall(r"char (\w+)\[(\d+)\];", text)
    assert [name for name, _ in fields] == [name for name, *_ in ffi.AclCANNPackageVersion._fields_]
    offset = 0
    for name, size in fields:
        assert getattr(ffi.AclCANNPackageVersion, name).offset == offset, name
        offset += int(size)
    assert ctypes.sizeof(ffi.AclCANNPackageVersion) == offset == 512


def _enum_values(typedef: str) -> dict[str, int]:
    """The members of a C ``typedef enum {...}`` with their values (implicit ones counted)."""
    body = typedef[typedef.index("{") + 1 : typedef.rindex("}")]
    values: dict[str, int] = {}
    following = 0
    for item in body.split(","):
        item = re.sub(r"__attribute__\(\(.*?\)\)\)", "", item).strip()
        if not item:
            continue
        name, _, value = (part.strip() for part in item.partition("="))
        following = int(value.rstrip("uU"), 0) if value else following
        values[name] = following
        following += 1
    return values


def test_the_new_abi_constants_match_the_headers(more: dict[str, Any], runtime_doc: str) -> None:
    types = more["types"]
    dev_attr = _enum_values(types["aclrtDevAttr"])
    assert dev_attr["ACL_DEV_ATTR_AICORE_CORE_NUM"] == _base.ACL_DEV_ATTR_AICORE_CORE_NUM
    assert dev_attr["ACL_DEV_ATTR_CUBE_CORE_NUM"] == _base.ACL_DEV_ATTR_CUBE_CORE_NUM
    assert dev_attr["ACL_DEV_ATTR_VECTOR_CORE_NUM"] == _base.ACL_DEV_ATTR_VECTOR_CORE_NUM
    assert _enum_values(types["aclCANNPackageName"])["ACL_PKG_NAME_CANN"] == _base.ACL_PKG_NAME_CANN
    levels = _enum_values(types["aclrtLastErrLevel"])
    assert levels["ACL_RT_THREAD_LEVEL"] == _base.ACL_RT_THREAD_LEVEL
    # the load options and magics are in acl-runtime.md §1.2 (the JSON facts lack them)
    for name in (
        "ACL_RT_BINARY_MAGIC_ELF_AICORE",
        "ACL_RT_BINARY_MAGIC_ELF_VECTOR_CORE",
        "ACL_RT_BINARY_MAGIC_ELF_CUBE_CORE",
    ):
        match = re.search(rf"#define {name}\s+(0x[0-9A-Fa-f]+)U", runtime_doc)
        assert match, name
        assert getattr(_base, name) == int(match.group(1), 16), name
    for name in ("ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD", "ACL_RT_BINARY_LOAD_OPT_MAGIC"):
        match = re.search(rf"{name} = (\d+)", runtime_doc)
        assert match, name
        assert getattr(_base, name) == int(match.group(1)), name
    assert _base.KernelType.MIX.magic == _base.ACL_RT_BINARY_MAGIC_ELF_AICORE


#: the model-RI capture functions the graph calls bind, as the headers declare them
_MODEL_RI = {
    "aclmdlRICaptureBegin": ("aclError", ["aclrtStream stream", "aclmdlRICaptureMode mode"]),
    "aclmdlRICaptureEnd": ("aclError", ["aclrtStream stream", "aclmdlRI* modelRI"]),
    "aclmdlRIExecuteAsync": ("aclError", ["aclmdlRI modelRI", "aclrtStream stream"]),
    "aclmdlRIDestroy": ("aclError", ["aclmdlRI modelRI"]),
}


@pytest.mark.parametrize("name", sorted(_MODEL_RI))
def test_the_model_ri_functions_have_the_header_prototype(more: dict[str, Any], name: str) -> None:
    returns, params = _MODEL_RI[name]
    assert more["prototypes"][name] == {"returns": returns, "params": params}
    _check_prototype(name, ffi.OPTIONAL_PROTOTYPES[name], more["prototypes"][name])
    assert name not in ffi.PROTOTYPES, "optional: CANN 8.0 lacks it (cann-support.md row 45)"


def test_the_model_ri_types_match_the_headers(more: dict[str, Any]) -> None:
    types = more["types"]
    assert re.fullmatch(r"typedef void\s*\*\s*aclmdlRI;", types["aclmdlRI"].strip())
    modes = _enum_values(types["aclmdlRICaptureMode"])
    assert modes == {
        "ACL_MODEL_RI_CAPTURE_MODE_GLOBAL": _base.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL,
        "ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL": _base.ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL,
        "ACL_MODEL_RI_CAPTURE_MODE_RELAXED": _base.ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
    }
    assert _base.ACL_MODEL_RI_CAPTURE_MODE_RELAXED == 2


def test_the_backends_own_constants_match_the_docs(more: dict[str, Any], runtime_doc: str) -> None:
    mem_attr = _enum_values(more["types"]["aclrtMemAttr"])
    assert mem_attr["ACL_DDR_MEM"] == 0
    assert acl_runtime.ACL_HBM_MEM == mem_attr["ACL_HBM_MEM"] == 1
    match = re.search(r"typedef enum \{([^}]*)\}\s*aclrtStreamAttr;", runtime_doc)
    assert match, "aclrtStreamAttr is not in acl-runtime.md"
    stream_attr = _enum_values("{" + match.group(1) + "}")
    assert acl_runtime.ACL_STREAM_ATTR_PRIORITY == stream_attr["ACL_STREAM_ATTR_PRIORITY"] == 5


def test_the_recent_error_message_returns_a_c_string(prototypes: dict[str, Any]) -> None:
    restype, argtypes = ffi.PROTOTYPES["aclGetRecentErrMsg"]
    assert restype is ctypes.c_char_p
    assert argtypes == ()
    assert prototypes["aclGetRecentErrMsg"]["returns"] == "const char*"


def test_the_backend_binds_what_the_runtime_seam_needs() -> None:
    needed = {
        "aclInit", "aclFinalize", "aclrtSetDevice", "aclrtResetDevice", "aclrtCreateContext",
        "aclrtDestroyContext", "aclrtSetCurrentContext", "aclrtCreateStream",
        "aclrtDestroyStream", "aclrtDestroyStreamForce", "aclrtSynchronizeStreamWithTimeout",
        "aclrtSetStreamFailureMode", "aclrtCreateEventExWithFlag", "aclrtDestroyEvent",
        "aclrtRecordEvent", "aclrtQueryEventStatus", "aclrtSynchronizeEventWithTimeout",
        "aclrtStreamWaitEvent", "aclrtEventElapsedTime", "aclrtMalloc", "aclrtFree",
        "aclrtMallocHost", "aclrtFreeHost", "aclrtMemcpyAsync",
        "aclrtBinaryGetFunction", "aclrtBinaryUnLoad", "aclGetRecentErrMsg",
    }  # fmt: skip
    assert needed <= set(ffi.PROTOTYPES)
    # the loaders and launches depend on the release: bound per symbol, chosen by presence
    per_release = {
        "aclrtBinaryLoadFromFile", "aclrtBinaryLoadFromData", "aclrtLaunchKernelWithHostArgs",
    }  # fmt: skip
    assert per_release <= set(ffi.OPTIONAL_PROTOTYPES)


def test_the_prototype_parser_understands_every_header_entry(prototypes: dict[str, Any]) -> None:
    # guards the test itself: every prototype in the JSON maps to known C types
    for name, proto in prototypes.items():
        _c_type(proto["returns"], has_name=False)
        for param in proto["params"]:
            _c_type(param, has_name=True)
        assert name.startswith("acl")


def test_bind_sets_the_prototypes_on_the_loaded_functions() -> None:
    from doubles.acl_double import build_double

    functions = ffi.bind(ctypes.CDLL(str(build_double().library)))
    assert set(functions) == set(ffi.PROTOTYPES) | set(ffi.OPTIONAL_PROTOTYPES)
    for name, function in functions.items():
        restype, argtypes = ffi.prototype(name)
        assert function.restype is restype, name
        assert tuple(function.argtypes) == argtypes, name


@pytest.mark.parametrize("persona", ["8.0", "8.3", "8.5", "9.1"])
def test_bind_skips_what_a_persona_lacks(persona: str) -> None:
    from doubles.acl_double import PERSONA_SYMBOLS, build_double

    exported = PERSONA_SYMBOLS[persona]
    functions = ffi.bind(ctypes.CDLL(str(build_double(persona).library)))
    bound = set(ffi.PROTOTYPES) | set(ffi.OPTIONAL_PROTOTYPES)
    assert set(functions) == bound & exported
    assert set(ffi.PROTOTYPES) <= exported, "every persona has the required functions"


def test_bind_skips_missing_optional_functions() -> None:
    from doubles.acl_double import build_legacy_double

    functions = ffi.bind(ctypes.CDLL(str(build_legacy_double().library)))
    legacy_lacks = {
        "aclrtSetStreamAttribute", "aclrtDeviceGetStreamPriorityRange", "aclrtMemsetAsync",
        "aclrtGetVersion", "aclrtGetMemInfo", "aclrtGetSocName",
        "aclmdlRICaptureBegin", "aclmdlRICaptureEnd", "aclmdlRIExecuteAsync", "aclmdlRIDestroy",
        "aclrtGetThreadLastTaskId", "aclrtSynchronizeDeviceWithTimeout",
        "aclrtExceptionInfoCallbackRegister", "aclrtExceptionInfoCallbackUnregister",
    }  # fmt: skip
    assert set(functions) == (set(ffi.PROTOTYPES) | set(ffi.OPTIONAL_PROTOTYPES)) - legacy_lacks


RUNTIME_TARBALL = ABI_DIR.parents[1] / "third_party/cann-runtime/hicann-runtime-681ef76.tar.xz"


@pytest.mark.skipif(not RUNTIME_TARBALL.is_file(), reason=f"no {RUNTIME_TARBALL}")
def test_every_runtime_error_code_is_known_by_its_headers_name() -> None:
    """``rt_error_codes.h`` of the pinned runtime source, read out of its tarball: every code
    is an ``AclCode`` of the same number and name, so an error without the runtime's text
    still says what it means (``507000`` said "a code aio_ascend does not know by name")."""
    import tarfile

    with tarfile.open(RUNTIME_TARBALL, "r|xz") as tar:
        for member in tar:
            if member.name.endswith("include/external/acl/error_codes/rt_error_codes.h"):
                extracted = tar.extractfile(member)
                assert extracted is not None
                header = extracted.read().decode()
                break
        else:
            pytest.fail("rt_error_codes.h is not in the tarball")
    codes = re.findall(r"^#define ACL_ERROR_(\w+)\s+(\d+)", header, re.M)
    assert len(codes) > 100
    for name, number in codes:
        assert AclCode(int(number)).name in (name, name.removeprefix("RT_")), (name, number)
