"""The ACL emulation's device part is abstract: a backend that lacks a hook cannot be made."""

from __future__ import annotations

import inspect

import pytest

from aio_ascend._runtime.cuda.runtime import CudaRuntime
from aio_ascend._runtime.emulation import AclEmulation
from aio_ascend._runtime.sim.runtime import SimRuntime


def _hooks() -> set[str]:
    return set(AclEmulation.__abstractmethods__)


def test_every_device_hook_and_the_context_rule_are_abstract() -> None:
    device_parts = {
        name
        for name, _ in inspect.getmembers(AclEmulation, inspect.isfunction)
        if name.startswith("_device_")
    }
    assert device_parts  # (the templates call them)
    assert device_parts | {"_bound", "_context_error"} == _hooks()


def test_a_backend_missing_one_hook_fails_when_it_is_made_not_at_its_first_call() -> None:
    namespace = {name: (lambda self, *args: None) for name in _hooks() if name != "_device_query"}
    Partial = type("Partial", (AclEmulation,), namespace)
    with pytest.raises(TypeError, match="_device_query"):
        Partial()


@pytest.mark.parametrize("backend", [SimRuntime, CudaRuntime])
def test_the_sim_and_cuda_runtimes_define_every_hook(backend: type) -> None:
    # (their device parts, DeviceExecutor and CudaCore, leave some to the runtime classes)
    assert backend.__abstractmethods__ == frozenset()
