"""A run of launches submitted by one Python loop: ``Runtime.launch_batch`` where a backend
has no native one (the sim, the cuda backend, acl without its extension).

The submitter hands each run of plain launches to one call. Without a native loop that call
is still worth having: the per-launch work around the runtime call (a method call per
request, the task id lookup, the submitter's own dispatch) is paid once per run instead of
once per launch. :class:`PythonBatch` is the one place where a launch request becomes the
runtime's argument list; the native loop (``acl/_native.c``) mirrors it in C.
"""

from __future__ import annotations

from typing import Any

from .._errors import AscendError

__all__ = ["PythonBatch", "launch_one"]


def launch_one(runtime: Any, req: Any) -> None:
    """Submit the launch request ``req`` with ``runtime``'s per-launch method, or raise its
    refusal (a run of one: the same mapping as every run)."""
    _, refusal = PythonBatch(runtime)([req])
    if refusal is not None:
        raise refusal


class PythonBatch:
    """``launch_batch`` of a runtime without a native one (see ``base.LaunchBatch``): the
    launches in order with the runtime's per-launch method, stopping at the first refusal.

    This loop is where a launch request becomes the runtime's arguments: the kernel, blocks
    and config of its ``spec``, its stream (``lane.handle``), its args at ``host.addr``, and
    the placeholder table at ``host.addr + spec.table_offset`` when it has placeholders.
    """

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
                addr = req.host.addr
                spec = req.spec
                count = spec.placeholder_count
                launch(
                    spec.func,
                    spec.blocks,
                    req.lane.handle,
                    spec.cfg,
                    addr,
                    spec.nbytes,
                    addr + spec.table_offset if count else 0,
                    count,
                )
                tid = task_id()
                req.position = -1 if tid is None else tid
                submitted += 1
        except AscendError as exc:
            return submitted, exc
        return submitted, None
