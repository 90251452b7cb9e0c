"""The device's context and the threads that have it current.

ACL contexts are per thread (``aclrtSetCurrentContext``), and on the real runtime a thread's
binding is a reference: a context made with ``aclrtCreateContext`` is current on every thread
that bound it until that thread binds another, and ``aclrtDestroyContext`` tears it down but
deletes it, with its default stream's queues and device memory, only once no thread has it
current any more (hicann/runtime@681ef76: ``common/inner_thread_local.cpp:56-78``, a thread's
binding counts unless the context is a primary one; ``context/context.cc:1898-1917``
``TryDeleteIfNeeded``; ``api/impl/api_impl.cc:4131-4172`` ``ContextDestroy``, which lets go of
the destroying thread's own binding only). A thread that ends keeps its binding for good. Over
``tests/realrt``'s driver, a context made on one thread and destroyed on another kept about
21 MB of device memory and two hardware queues per process, and 512 bytes more per open.

So every thread that binds this context lets go of it before it ends (:meth:`release`): by
binding the device's primary context, the one ``aclrtSetDevice`` made, which holds no reference
(``aclrtSetCurrentContext`` refuses NULL: ``acl/aclrt_impl/context.cpp:63-72``). The primary
context lives until the close's ``aclrtResetDevice``, so a release made before it always has
somewhere to go.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from ctypes import byref, c_void_p
from typing import Any

from ..._errors import AscendError, ContextNullError, InternalError
from .values import ptr

__all__ = ["ThreadContexts", "open_context"]


def open_context(fn: Any, device_id: int) -> tuple[int, int]:
    """``aclrtSetDevice`` and ``aclrtCreateContext`` on the calling thread, which ends with the
    new context current: ``(context, primary context)``."""
    # Read, though nothing uses it: on a thread whose current context was destroyed by a
    # close on another thread, the real runtime's aclrtSetDevice crashed the process unless
    # this read came first (seen on realrt: tests/runtime's context tests, then an open on
    # the same thread; why is not worked out).
    try:
        fn["aclrtGetCurrentContext"](byref(c_void_p()))
    except ContextNullError:
        pass
    fn["aclrtSetDevice"](device_id)
    primary, context = c_void_p(), c_void_p()
    try:
        fn["aclrtGetCurrentContext"](byref(primary))  # (aclrtSetDevice's: the primary one)
        fn["aclrtCreateContext"](byref(context), device_id)
    except BaseException:
        try:
            fn["aclrtResetDevice"](device_id)
        except AscendError:
            pass
        raise
    if not context.value or not primary.value:
        raise InternalError("aclrtCreateContext returned a NULL context", func="aclrtCreateContext")
    return context.value, primary.value


class ThreadContexts:
    """Binding one runtime's context to the calling thread, and letting go of it.

    ``functions`` is the library's own table (it works after the runtime's close, so that a
    thread can always be given its context back).
    """

    __slots__ = ("_functions", "context", "primary")

    def __init__(self, functions: dict[str, Any], context: int, primary: int) -> None:
        self._functions = functions
        self.context = context
        self.primary = primary

    def bind(self, context: int) -> None:
        """Make ``context`` (any handle ``aclrtGetCurrentContext`` gave) current on the
        calling thread."""
        self._functions["aclrtSetCurrentContext"](ptr("context", context))

    def current(self) -> int | None:
        """``aclrtGetCurrentContext`` (``None`` when the thread has none: 107002)."""
        current = c_void_p()
        try:
            self._functions["aclrtGetCurrentContext"](byref(current))
        except ContextNullError:
            return None
        return current.value or None

    @contextlib.contextmanager
    def lent(self) -> Iterator[None]:
        """This context current on the calling thread for the block, then the thread's own
        back (the primary context for a thread that had none: it must not keep this one)."""
        saved = self.current()
        self._functions["aclrtSetCurrentContext"](self.context)
        try:
            yield
        finally:
            back = saved or self.primary
            if back != self.context:
                with contextlib.suppress(AscendError):
                    self._functions["aclrtSetCurrentContext"](back)

    def release(self) -> None:
        """The calling thread lets go of this context if it is current (binding the primary
        context instead); else nothing."""
        if self.current() == self.context:
            self._functions["aclrtSetCurrentContext"](self.primary)
