"""A context's threads on the acl backend: a destroyed context is deleted only once no thread
has it current, on the real runtime (``realrt``) and in the C double that models it.

On the real runtime a thread's binding of a context made with ``aclrtCreateContext`` is a
reference (hicann/runtime@681ef76 ``inner_thread_local.cpp:56-78``), ``aclrtDestroyContext``
lets go of the destroying thread's binding only, and the context, its default stream's queues
and its device memory stay until every other thread has bound something else
(``context.cc:1898-1917``). ``Runtime.release_thread`` is how a thread lets go: it binds the
device's primary context (``acl/contexts.py``). Over ``tests/realrt``'s driver the leak shows
as device memory and hardware queues the fake driver still holds; in the double as
``held_contexts``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from aio_ascend._runtime.acl.runtime import AclRuntime, open_acl_runtime

BACKENDS = [pytest.param("realrt", marks=pytest.mark.realrt), "acl"]


def _opener(backend: str) -> tuple[Callable[[], AclRuntime], Callable[[], Any]]:
    """How to open the backend's runtime, and what the runtime below still holds (a value
    that goes back to where it was once everything is deleted)."""
    if backend == "realrt":
        from realrt.fixture import fakehal, open_realrt_runtime

        hal = fakehal()
        return open_realrt_runtime, lambda: (hal.device_bytes(), hal.live_queues())
    from doubles.acl_double import build_double, control_for

    library = build_double().library
    held: list[AclRuntime] = []

    def open_double() -> AclRuntime:
        runtime = open_acl_runtime(0, library_path=library)
        held.append(runtime)
        return runtime

    return open_double, lambda: control_for(held[0]).live_counts()["held_contexts"]


def _on_thread(call: Callable[[], Any]) -> Any:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    thread.join()
    return out[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_destroyed_context_stays_until_the_thread_that_has_it_current_binds_another(
    backend: str,
) -> None:
    """Opened on a thread that keeps the context current, closed on another: the context
    outlives its close until that thread binds something else (here ``aclrtSetDevice``'s
    primary context, then gives it back). Both runtimes agree: the model the release is for."""
    open_runtime, holdings = _opener(backend)
    _on_thread(lambda: open_runtime().close())  # (the runtime's first open sets up its own)
    before = holdings()
    opened, closed = threading.Event(), threading.Event()
    box: list[AclRuntime] = []

    def opener() -> None:
        box.append(open_runtime())
        opened.set()
        closed.wait(30)
        functions = box[0]._library.functions  # (the raw calls a user's thread would make)
        box[0].get_current_context()  # (first: see contexts.open_context)
        functions["aclrtSetDevice"](0)
        functions["aclrtResetDevice"](0)

    thread = threading.Thread(target=opener)
    thread.start()
    assert opened.wait(30)
    box[0].close()
    held = holdings()
    closed.set()
    thread.join()
    assert held != before
    assert holdings() == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_that_let_go_leave_nothing_after_the_close(backend: str) -> None:
    """The opener and two more threads bind the context, make calls, and let go before they
    end (``release_thread``); closed on yet another thread, the runtime holds nothing more."""
    open_runtime, holdings = _opener(backend)
    _on_thread(lambda: open_runtime().close())
    before = holdings()
    for _ in range(2):

        def open_and_let_go() -> AclRuntime:
            runtime = open_runtime()
            runtime.release_thread()
            return runtime

        runtime = _on_thread(open_and_let_go)

        def use(runtime: AclRuntime = runtime) -> None:
            runtime.set_current_context()
            runtime.destroy_stream(runtime.create_stream())
            runtime.release_thread()
            assert runtime.get_current_context() != runtime.context
            runtime.release_thread()  # (not current: nothing)

        _on_thread(use)
        _on_thread(use)
        _on_thread(runtime.close)
        assert holdings() == before
