"""Objects that stand for one runtime resource are never copied or pickled.

A copy of a ``Stream``, a ``DeviceBuffer`` or an ``Event`` would name the same runtime handle
without sharing its bookkeeping: the device tracks the original only, so a copy could free the
memory a second time, or outlive the handle, which the runtime then gives to someone else (a
copy of a collected Event waited for an unrelated event once its handle was reused). A deep
copy or a pickle would try to copy the event loop and the library's threads with it. Share the
object itself instead: every one of them may be used by any coroutine of the device's loop.
"""

from __future__ import annotations

from typing import NoReturn

__all__ = ["Unique"]


class Unique:
    """Refuses :func:`copy.copy`, :func:`copy.deepcopy` and pickling with a ``TypeError``.

    :cvar public_name: what the message calls the object (its class's name by default)
    """

    __slots__ = ()

    def _refuse(self, what: str) -> NoReturn:
        name = getattr(type(self), "public_name", type(self).__name__)
        raise TypeError(
            f"{name} objects cannot be {what}: each stands for one runtime resource (share "
            "the object itself)"
        )

    def __copy__(self) -> NoReturn:
        self._refuse("copied")

    def __deepcopy__(self, memo: object) -> NoReturn:
        self._refuse("copied")

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        self._refuse("pickled")
