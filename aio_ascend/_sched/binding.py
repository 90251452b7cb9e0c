"""The device context around each short runtime call on a shared thread: bind, call, restore.

ACL contexts are per thread, and the event loop's thread is shared: with other devices, and with
other libraries (torch_npu caches its device per thread and never rebinds, so a context we left
current makes its next launch fail with 107003, and the reverse). Before each short call the
library makes on the loop thread (malloc, free, stream and event creation, module loading, event
queries) it reads the thread's current context, binds the device's, makes the call and binds
the saved one again (``docs/cann-support.md`` §6). When the thread's context already is the
device's, the call is made as it is (one query, no switch).

A thread's binding holds the context: on the real runtime a destroyed context is deleted only
once no thread has it current (``Runtime.release_thread``, ``_runtime/acl/contexts.py``). So a
thread without any context lets go of the device's after the call, and the library's own
threads, which bind once for their whole life (:func:`bound_for_life`), let go before they end.
The event loop's thread keeps the device's context between calls (no switch per call) and lets
go of it when the device closes (:meth:`ContextBinding.let_go`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, cast

from .._errors import AscendError
from .._runtime import Runtime

__all__ = ["ContextBinding", "bound_for_life"]

log = logging.getLogger("aio_ascend")


class ContextBinding:
    """One device's runtime, called with the device's context bound and the caller's restored."""

    __slots__ = ("_proxy", "runtime")

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._proxy = cast(Runtime, _Restoring(self))
        # The device was opened on a thread of its own: the thread making this (the loop's)
        # ends with the device's context current, as after aclrtSetDevice there, unless it
        # has one already (torch_npu's, another device's), which it keeps.
        if runtime.get_current_context() is None:
            runtime.set_current_context()

    def bound(self) -> Runtime:
        """The runtime, each of whose methods binds the device's context for the call and then
        gives the calling thread its own context back."""
        return self._proxy

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with the device's context bound, the caller's restored after."""
        runtime = self.runtime
        saved = runtime.get_current_context()
        if saved == runtime.context:
            return fn(*args, **kwargs)
        runtime.set_current_context()
        try:
            return fn(*args, **kwargs)
        finally:
            try:
                if saved is None:
                    runtime.release_thread()
                else:
                    runtime.set_current_context(saved)
            except AscendError as exc:  # its owner destroyed it meanwhile: nothing to restore
                log.debug("could not give the thread its context %s back: %s", saved, exc)

    def let_go(self) -> None:
        """The device is closing: the calling thread (the loop's) lets go of its context, if
        it has it current (see the module docstring), before the runtime's close."""
        _release_quietly(self.runtime)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` called as :meth:`call` calls it (from any thread)."""

        def call(*args: Any) -> Any:
            return self.call(fn, *args)

        return call

    def freeing(self, fn: Callable[[int], None], what: str) -> Callable[[int], None]:
        """``fn`` (a runtime free of one address) called as :meth:`call` calls it, whose failure
        leaks the memory: logged, never raised. Frees run inside the library's threads (the
        poller gives back a finished request's buffers) and the close: an exception there
        would kill the thread or stop the close half way, and nothing could undo the free."""

        def free(addr: int) -> None:
            try:
                self.call(fn, addr)
            except Exception as exc:
                log.error(
                    "device %d: %s(%#x) failed, leaking that memory: %r",
                    self.runtime.device_id,
                    what,
                    addr,
                    exc,
                )

        return free


@contextlib.contextmanager
def bound_for_life(runtime: Runtime) -> Iterator[None]:
    """A library thread's body: the device's context bound on entry, let go of on the way out
    however the body ends (before the thread ends: a thread that ends keeps its binding)."""
    runtime.set_current_context()
    try:
        yield
    finally:
        _release_quietly(runtime)


def _release_quietly(runtime: Runtime) -> None:
    try:
        runtime.release_thread()
    except AscendError as exc:  # the runtime is gone already: nothing more can be done
        log.debug("device %d: could not let go of its context: %s", runtime.device_id, exc)


class _Restoring:
    """The runtime seen through :meth:`ContextBinding.bound`: methods bind and restore."""

    __slots__ = ("_binding",)

    def __init__(self, binding: ContextBinding) -> None:
        self._binding = binding

    def __getattr__(self, name: str) -> Any:
        binding = self._binding
        attr = getattr(binding.runtime, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return binding.call(attr, *args, **kwargs)

        return call
