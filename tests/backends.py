"""Runtime factories for the contract suite: one entry per backend that can run here.

Each factory returns a fresh, opened ``Runtime`` for device 0, or calls ``pytest.skip`` with a
clear reason when the backend cannot run on this machine.
"""

from __future__ import annotations

from collections.abc import Callable

from aio_ascend._runtime import Runtime, open_runtime


def _open_sim() -> Runtime:
    return open_runtime("sim", 0)


def _open_acl_double() -> Runtime:
    # The C test double for the acl backend (tests/acl_double.py builds it with the system cc).
    from acl_double import open_double_runtime

    return open_double_runtime()


RUNTIME_FACTORIES: dict[str, Callable[[], Runtime]] = {
    "sim": _open_sim,
    "acl": _open_acl_double,
}
