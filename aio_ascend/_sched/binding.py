"""Which device context the calling thread has bound: bind before each short runtime call.

ACL contexts are per thread, and the loop thread may serve several devices: before a call on
the loop thread (malloc, free, stream and event creation, module loading) the thread is bound
to the device's context unless it already is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._runtime import Runtime

__all__ = ["ContextBinding"]

_bound = threading.local()  # .token: the ContextBinding this thread bound last


class ContextBinding:
    """One device's runtime, handed out with the calling thread bound to its context."""

    __slots__ = ("_token", "runtime")

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._token = object()

    def bound(self) -> Runtime:
        """The runtime, with the calling thread bound to its context first."""
        if getattr(_bound, "token", None) is not self._token:
            self.runtime.set_current_context()
            _bound.token = self._token
        return self.runtime

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` wrapped so that it binds the calling thread (any thread) first."""

        def call(*args: Any) -> Any:
            self.bound()
            return fn(*args)

        return call
