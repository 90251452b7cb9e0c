"""A run of launches submitted by one Python loop: ``Runtime.launch_batch`` where a backend
has no native one (the sim, the cuda backend, acl without its extension).

The submitter hands each run of plain launches to one call. Without a native loop that call
is still worth having: the per-launch work around the runtime call (a method call per
request, the task id lookup, the submitter's own dispatch) is paid once per run instead of
once per launch. :func:`launch_one` is the one place where a launch request becomes the
runtime's argument list; the native loop (``acl/_native.c``) mirrors it in C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import AscendError

__all__ = ["PythonBatch", "launch_one"]

Launch = Callable[[int, int, int, Any, int, int, int, int], None]


def launch_one(launch: Launch, req: Any, stream: int) -> None:
    """Submit the launch request ``req`` on ``stream`` with ``launch`` (a runtime's
    ``launch_kernel_with_host_args``): the kernel, blocks and config of its ``spec``, its args
    at ``host.addr``, the placeholder table at ``host.addr + spec.table_offset`` when it has
    placeholders."""
    addr = req.host.addr
    spec = req.spec
    count = spec.placeholder_count
    launch(
        spec.func,
        spec.blocks,
        stream,
        spec.cfg,
        addr,
        spec.nbytes,
        addr + spec.table_offset if count else 0,
        count,
    )


class PythonBatch:
    """``launch_batch`` of a runtime without a native one (see ``base.LaunchBatch``): the
    launches in order with the runtime's per-launch method, stopping at the first refusal."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def __call__(self, launches: list[Any]) -> tuple[int, AscendError | None]:
        # looked up per run, not kept: a wrapper installed on the runtime later applies too
        runtime = self._runtime
        launch = runtime.launch_kernel_with_host_args
        task_id = runtime.last_task_id
        submitted = 0
        try:
            for req in launches:
                launch_one(launch, req, req.lane.handle)
                tid = task_id()
                req.position = -1 if tid is None else tid
                submitted += 1
        except AscendError as exc:
            return submitted, exc
        return submitted, None
