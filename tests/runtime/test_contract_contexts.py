"""The ``Runtime`` contract for the calling thread's current context and for closing, on every
backend of ``backends.RUNTIME_FACTORIES``: a new thread binds before it calls, the current
context is read and given back (after a close too), and close is idempotent from any thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from backends import ALL_BACKENDS, RUNTIME_FACTORIES
from helpers import SYNC_MS, in_thread

from aio_ascend._errors import ContextNullError
from aio_ascend._runtime import Runtime

if TYPE_CHECKING:
    from conftest import RuntimeKit

BACKENDS = ALL_BACKENDS


def test_a_thread_needs_set_current_context(rt: Runtime) -> None:
    def body() -> int:
        assert rt.get_recent_error_message() == ""  # callable unbound
        with pytest.raises(ContextNullError) as info:
            rt.create_stream()
        assert info.value.code == 107002
        with pytest.raises(ContextNullError):
            rt.malloc(64)
        assert rt.get_recent_error_message()
        rt.set_current_context()
        rt.set_current_context()  # idempotent
        stream = rt.create_stream()
        rt.destroy_stream(stream)
        return stream

    thread, errors, results = in_thread(body)
    thread.join(SYNC_MS / 1000)
    assert not errors, errors
    assert results
    assert results[0] != 0


def test_the_current_context_is_read_and_given_back(backend: str) -> None:
    first = RUNTIME_FACTORIES[backend]()
    try:
        assert first.get_current_context() == first.context
        second = RUNTIME_FACTORIES[backend]()  # binds its own context to this thread
        try:
            assert first.get_current_context() == second.context
            first.set_current_context()
            assert second.get_current_context() == first.context
            first.malloc(64)
            first.set_current_context(second.context)  # give the thread back the other one
            assert first.get_current_context() == second.context
            second.free(second.malloc(64))
        finally:
            second.close()
        first.set_current_context()
        seen: list[object] = []
        thread = threading.Thread(target=lambda: seen.append(first.get_current_context()))
        thread.start()
        thread.join()
        assert seen == [None]  # a new thread has no context
    finally:
        first.close()


def test_a_context_can_be_given_back_after_close(backend: str) -> None:
    first = RUNTIME_FACTORIES[backend]()
    second = RUNTIME_FACTORIES[backend]()
    try:
        first.set_current_context()
        first.close()
        first.set_current_context(second.context)
        assert second.get_current_context() == second.context
    finally:
        first.close()
        second.close()


def test_close_is_idempotent_and_works_from_another_thread(
    backend: str, make_kit: Callable[..., RuntimeKit]
) -> None:
    runtime = RUNTIME_FACTORIES[backend]()
    d = make_kit(runtime)
    d.sleep_us(10)
    runtime.release_thread()  # (this thread lets go: the other one closes)
    thread, errors, _ = in_thread(runtime.close)
    thread.join(SYNC_MS / 1000)
    assert not errors, errors
    runtime.close()
