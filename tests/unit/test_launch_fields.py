"""``abi.launch_fields_fit`` (the hot paths' one question) agrees with the checks that word
each refusal: at every field's boundaries, and for the types a caller might pass."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from aio_ascend._errors import InvalidParamError
from aio_ascend._runtime.abi import (
    MAX_NUM_BLOCKS,
    MAX_PLACEHOLDERS,
    PTR_MAX,
    SIZE_MAX,
    UINT32_MAX,
    check_args,
    check_memcpy,
    check_num_blocks,
    check_placeholder_count,
    copy_fields_fit,
    launch_fields_fit,
)

GOOD = {"num_blocks": 1, "args_addr": 0x1000, "args_size": 64, "placeholder_count": 0}
EDGES = {
    "num_blocks": [0, 1, MAX_NUM_BLOCKS, MAX_NUM_BLOCKS + 1, -1, True, 2.0, np.int64(3)],
    "args_addr": [0, 1, PTR_MAX, PTR_MAX + 1, -1, None],
    "args_size": [0, 1, UINT32_MAX, UINT32_MAX + 1, False, "64"],
    "placeholder_count": [-1, 0, MAX_PLACEHOLDERS, MAX_PLACEHOLDERS + 1, np.int32(1)],
}


def _worded_checks_pass(fields: dict[str, object]) -> bool:
    try:
        check_num_blocks("f", fields["num_blocks"])
        check_args("f", fields["args_addr"], fields["args_size"])
        check_placeholder_count("f", fields["placeholder_count"])
    except InvalidParamError:
        return False
    return True


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, values in EDGES.items() for v in values])
def test_the_fast_question_and_the_worded_checks_agree(name: str, value: object) -> None:
    fields = {**GOOD, name: value}
    fits = launch_fields_fit(
        0x10,
        fields["num_blocks"],
        0x20,
        fields["args_addr"],
        fields["args_size"],
        0,
        fields["placeholder_count"],
    )
    # numpy ints: no to the fast question; the slow path decides (acl converts them)
    assert fits == (_worded_checks_pass(fields) and not isinstance(value, np.integer))


@pytest.mark.parametrize(
    ("func", "stream", "placeholders_addr"),
    list(itertools.product([0, PTR_MAX, PTR_MAX + 1, -1], [0, PTR_MAX + 1], [0, -1])),
)
def test_handles_are_only_range_checked(func: int, stream: int, placeholders_addr: int) -> None:
    fits = launch_fields_fit(func, 1, stream, 0x1000, 64, placeholders_addr, 0)
    in_range = 0 <= func <= PTR_MAX and 0 <= stream <= PTR_MAX and placeholders_addr >= 0
    assert fits == in_range


COPY_GOOD = {"dst": 0x1000, "dst_max": 64, "src": 0x2000, "count": 64, "kind": 1}
COPY_EDGES = {
    "dst": [0, 1, PTR_MAX, PTR_MAX + 1, None],
    "dst_max": [63, 64, SIZE_MAX, SIZE_MAX + 1, -1],
    "src": [0, PTR_MAX + 1, 2.0],
    "count": [0, 64, 65, -1, True],
    "kind": [0, 1, 2, 3, 4, np.int8(1)],
}


@pytest.mark.parametrize(
    ("name", "value"), [(n, v) for n, values in COPY_EDGES.items() for v in values]
)
def test_the_copy_question_and_its_worded_check_agree(name: str, value: object) -> None:
    f = {**COPY_GOOD, name: value}
    fits = copy_fields_fit(f["dst"], f["dst_max"], f["src"], f["count"], f["kind"], 0x30)
    try:
        check_memcpy("f", f["dst"], f["dst_max"], f["src"], f["count"], f["kind"])
        worded = True
    except InvalidParamError:
        worded = False
    except TypeError:  # a comparison the worded check cannot make (None > int)
        worded = False
    assert fits == (worded and not isinstance(value, np.integer))
