"""Tracing your own program: every device's tasks as a Perfetto / Chrome trace.

For example::

    from aio_ascend import tracing

    with tracing.record("trace.json"):            # every device's tasks while it runs
        asyncio.run(main())

    async def handle(request):                   # in your server
        with tracing.request(f"GET {request.path}"):   # this request's tasks, linked
            await s.run(fn, 8, args)

Open the file in https://ui.perfetto.dev (or ``chrome://tracing``). Each device is a
process; each stream is one track ("stream 1", ... or the names given with
:meth:`Tracer.name_stream`) on which every task is an *async* slice named after the stream,
from its admission to its end, with up to three phases nested below it:

- ``queued``: admitted -> its batch handed to the runtime (``Task.submitted_at``);
- the operation (the kernel's name, or ``copy_to_device``, ``record_event``, ...): submitted
  -> observed complete on the device (``Task.completed_at``), the wait behind earlier work
  on the stream included;
- ``wake``: observed complete -> the waiting coroutine resumed (``Task.resumed_at``): the
  library's wake-up. It is absent when nobody was waiting (the task was awaited later, or
  never).

Overlapping tasks of one stream share its track: Perfetto stacks them in rows. Flow arrows
link the tasks of one request in the order they were admitted: the tasks created inside one
:func:`request` block (shown as a slice on the "requests" track of the "requests" process),
or else the tasks created by one asyncio/trio task. All times are ``time.perf_counter()``
seconds, shown relative to the first event.

While no tracer is recording the scheduler pays one attribute check per task; while one is,
each task costs a few microseconds (the figures are in ``docs/observability.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple

from ._sched.hooks import HOOKS, ObserverContext, Source
from ._sched.task import Task
from ._sched.work import Outcome

__all__ = ["DEFAULT_MAX_TASKS", "RequestScope", "TaskRecord", "Tracer", "record", "request"]

_log = logging.getLogger("aio_ascend.tracing")

#: tasks one tracer keeps at most (a few hundred bytes each); later ones are only counted
DEFAULT_MAX_TASKS = 250_000
_CATEGORY = "aio_ascend"
_REQUESTS_PID = 1
_now = time.perf_counter


class RequestScope:
    """One :func:`request` block: its name and when it began and ended."""

    __slots__ = ("end", "name", "start")

    def __init__(self, name: str) -> None:
        self.name = name
        self.start = _now()
        self.end: float | None = None

    def __repr__(self) -> str:
        return f"<RequestScope {self.name!r}>"


_CURRENT: ContextVar[RequestScope | None] = ContextVar("aio_ascend_request", default=None)
_recording: list[Tracer] = []  # tracers started and not stopped (they get finished scopes)
_recording_lock = threading.Lock()


@contextlib.contextmanager
def request(name: object) -> Iterator[RequestScope]:
    """Mark the tasks created inside the block (and in tasks it starts) as one request.

    Costs a context variable set and reset when no tracer records; a recording tracer shows
    the block on its "requests" track and links the request's tasks with flow arrows.
    """
    scope = RequestScope(str(name))
    token = _CURRENT.set(scope)
    try:
        yield scope
    finally:
        scope.end = _now()
        _CURRENT.reset(token)
        for tracer in tuple(_recording):
            tracer.add_request(scope)


#: the C version where there is one (asyncio.current_task is written in Python on 3.11)
_asyncio_current_task: Callable[[], object] = getattr(
    sys.modules.get("_asyncio"), "current_task", asyncio.current_task
)


def _current_async_task() -> object | None:
    try:
        return _asyncio_current_task()
    except RuntimeError:  # no asyncio loop running in this thread
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            task: object = trio.lowlevel.current_task()
            return task
        except RuntimeError:
            return None
    return None


class TaskRecord(NamedTuple):
    """One recorded task (see ``Task`` for the timestamps: ``time.perf_counter()`` seconds).

    :ivar device: the device number
    :ivar backend: the device's backend
    :ivar process: the trace process it is shown in: ``"device 0 (sim)"``, with ``" #2"``...
        for a device opened again while recording
    :ivar stream: the runtime stream handle
    :ivar stream_name: the stream's track name
    :ivar kind: the task's kind (``"launch"``, ``"copy_to_host"``, ...)
    :ivar kernel: the kernel's name (launches only)
    :ivar error: the name of the error class it failed with, or None
    :ivar request: the name of the :func:`request` block it was created in, or None
    :ivar flow: tasks with the same flow number belong to one request (or one async task)
    """

    device: int
    backend: str
    process: str
    stream: int
    stream_name: str
    kind: str
    kernel: str | None
    admitted: float
    submitted: float | None
    completed: float | None
    resumed: float | None
    error: str | None
    request: str | None
    flow: int | None

    @property
    def queued(self) -> float | None:
        """Seconds from admission to submission."""
        return None if self.submitted is None else self.submitted - self.admitted

    @property
    def on_device(self) -> float | None:
        """Seconds from submission to the observed completion."""
        if self.submitted is None or self.completed is None:
            return None
        return self.completed - self.submitted

    @property
    def wake(self) -> float | None:
        """Seconds from the observed completion to the waiting coroutine's resumption."""
        if self.completed is None or self.resumed is None:
            return None
        return self.resumed - self.completed

    @property
    def end(self) -> float:
        """The last known timestamp."""
        stamps = (self.admitted, self.submitted, self.completed, self.resumed)
        return max(t for t in stamps if t is not None)


class Tracer(ObserverContext):
    """Records the tasks of every device in this process while started.

    ``with Tracer() as tracer:`` (or ``async with``, or :meth:`start`/:meth:`stop`; it may be
    started again to record more), then :meth:`write` the trace, or read :attr:`records`.
    A task is recorded when its completion (or failure) reaches its event loop; its wake-up
    (``resumed``) is read when the tracer stops.

    :param max_tasks: tasks kept at most; later ones are counted in :attr:`dropped`
    :param flows: draw flow arrows between the tasks of one request
    """

    wants_capture = True

    def __init__(self, *, max_tasks: int = DEFAULT_MAX_TASKS, flows: bool = True) -> None:
        if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 0:
            raise ValueError(f"max_tasks={max_tasks!r} must be an int >= 0")
        self.max_tasks = max_tasks
        self.flows = bool(flows)
        #: tasks that arrived after ``max_tasks`` were recorded
        self.dropped = 0
        self._lock = threading.Lock()
        self._pending: list[tuple[Task, Source, int, str, str | None, str | None]] = []
        self._records: list[TaskRecord] = []
        self._requests: list[RequestScope] = []
        self._names: dict[tuple[int, int], str] = {}
        self._processes: dict[Source, str] = {}
        self._stream_numbers: dict[Source, dict[int, str]] = {}
        self._flow_of: dict[int, int] = {}
        self._flow_counter = itertools.count(1)
        self._keep: list[object] = []  # what flows were keyed by (ids stay unique)
        self.recording = False

    # --- control ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start recording (a no-op if it is recording)."""
        if self.recording:
            return
        self.recording = True
        with _recording_lock:
            _recording.append(self)
        HOOKS.add(self)

    def stop(self) -> None:
        """Stop recording; what was recorded becomes :attr:`records`. Idempotent."""
        if not self.recording:
            return
        HOOKS.remove(self)
        with _recording_lock:
            if self in _recording:
                _recording.remove(self)
        self.recording = False
        with self._lock:
            pending, self._pending = self._pending, []
        self._records.extend(self._finish(pending))

    def name_stream(self, stream: Any, name: str) -> None:
        """Show ``stream`` (an ``aio_ascend.Stream``) as the track ``name``."""
        self._names[(stream.device.device_id, stream.handle)] = str(name)

    # --- what it recorded ------------------------------------------------------------------

    @property
    def records(self) -> list[TaskRecord]:
        """The tasks recorded, in the order their completions were delivered (complete once
        the tracer has stopped)."""
        return list(self._records)

    @property
    def requests(self) -> list[RequestScope]:
        """The :func:`request` blocks that ended while it recorded."""
        return list(self._requests)

    def trace(self, *, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trace as a JSON-ready dict (the Chrome trace event format)."""
        meta = {"dropped_tasks": self.dropped, **(metadata or {})}
        requests = [(scope, self._flow(scope)) for scope in self._requests]
        return _build_trace(self._records, requests, flows=self.flows, metadata=meta)

    def write(self, path: str | os.PathLike[str], *, metadata: dict[str, Any] | None = None) -> int:
        """Write the trace JSON to ``path``; return the number of tasks in it."""
        trace = self.trace(metadata=metadata)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(trace, fh, separators=(",", ":"))
        return len(self._records)

    # --- the observer protocol (aio_ascend._sched.hooks) -----------------------------------

    def capture(self) -> object:
        """The request scope of the code creating a task, else its asyncio/trio task."""
        scope = _CURRENT.get()
        return scope if scope is not None else _current_async_task()

    def delivered(self, source: Source, deliveries: Sequence[Any]) -> None:
        """Keep the tasks of a round of deliveries (their wake-ups are read at stop)."""
        kernels = source.kernels
        with self._lock:
            pending = self._pending
            room = self.max_tasks - len(pending) - len(self._records)
            for request, error, outcome in deliveries:
                if outcome is Outcome.FINISHED_LATE:  # its task failed (timed out) before
                    continue
                if room <= 0:
                    self.dropped += 1
                    continue
                room -= 1
                kind = request.kind
                kernel = kernels.get(request.func) if kind == "launch" else None
                failed = None if error is None else type(error).__name__
                pending.append((request.task, source, request.lane.handle, kind, kernel, failed))

    def resumed(self, task: Any) -> None:
        """(Nothing: the wake-up is read from the task when the tracer stops.)"""

    def add_request(self, scope: RequestScope) -> None:
        """A :func:`request` block ended while recording."""
        self._requests.append(scope)

    # --- internals -------------------------------------------------------------------------

    def _finish(
        self, pending: list[tuple[Task, Source, int, str, str | None, str | None]]
    ) -> list[TaskRecord]:
        records: list[TaskRecord] = []
        append = records.append
        tracks: dict[tuple[Source, int], tuple[str, str]] = {}  # (process, stream name)
        flow_of = self._flow_of
        for task, source, handle, kind, kernel, failed in pending:
            track = tracks.get((source, handle))
            if track is None:
                track = tracks[(source, handle)] = self._track(source, handle)
            captured = task.captured
            key = None if captured is None else captured.get(self)
            if key is None:
                request = flow = None
            else:
                request = key.name if type(key) is RequestScope else None
                flow = flow_of.get(id(key))
                if flow is None:
                    flow = self._flow(key)
            append(
                TaskRecord(
                    source.device_id,
                    source.backend,
                    track[0],
                    handle,
                    track[1],
                    kind,
                    kernel,
                    task.admitted_at,
                    task.submitted_at,
                    task.completed_at,
                    task.resumed_at,
                    failed,
                    request,
                    flow,
                )
            )
        return records

    def _track(self, source: Source, handle: int) -> tuple[str, str]:
        """The process and track name of a stream of ``source``."""
        processes = self._processes
        process = processes.get(source)
        if process is None:
            process = f"device {source.device_id} ({source.backend})"
            same = sum(1 for name in processes.values() if name.startswith(process))
            process = processes[source] = process + (f" #{same + 1}" if same else "")
        name = self._names.get((source.device_id, handle))
        if name is None:
            per_device = self._stream_numbers.setdefault(source, {})
            name = per_device.setdefault(handle, f"stream {len(per_device) + 1}")
        return process, name

    def _flow(self, key: object) -> int:
        number = self._flow_of.get(id(key))
        if number is None:
            number = self._flow_of[id(key)] = next(self._flow_counter)
            self._keep.append(key)  # its id() must not be reused while it is a key
        return number

    def flow_of(self, scope: RequestScope) -> int:
        """The flow number of a request block (its tasks' ``TaskRecord.flow``)."""
        return self._flow(scope)


@contextlib.contextmanager
def record(
    path: str | os.PathLike[str] | None = None,
    *,
    max_tasks: int = DEFAULT_MAX_TASKS,
    flows: bool = True,
    metadata: dict[str, Any] | None = None,
) -> Iterator[Tracer]:
    """Record every device's tasks while the block runs; write the trace to ``path`` (if
    given) when it ends, even when it ends with an exception.

    ``path`` is opened for writing before the block runs (created if missing), so a path that
    cannot be written raises ``OSError`` here, before any work is lost. If writing the trace
    fails at the end anyway while the block is raising, the block's exception propagates
    (the write error is logged, and attached as a note).

    :returns: the :class:`Tracer` (its :attr:`~Tracer.records` are complete after the block)
    :raises OSError: ``path`` cannot be written (a missing directory, a directory, no
        permission), before the block runs
    """
    if path is not None:
        with open(path, "a", encoding="utf-8"):  # the check is the open itself
            pass
    tracer = Tracer(max_tasks=max_tasks, flows=flows)
    tracer.start()
    try:
        yield tracer
    except BaseException as exc:
        tracer.stop()
        if path is not None:
            try:
                tracer.write(path, metadata=metadata)
            except Exception as write_error:  # never replace the block's own exception
                _log.error("tracing.record: could not write the trace to %s: %r", path, write_error)
                exc.add_note(f"(tracing.record could not write the trace: {write_error!r})")
        raise
    tracer.stop()
    if path is not None:
        tracer.write(path, metadata=metadata)


# --- the trace file ----------------------------------------------------------------------------


def _build_trace(
    records: Sequence[TaskRecord],
    requests: Sequence[tuple[RequestScope, int]],
    *,
    flows: bool,
    metadata: dict[str, Any],
) -> dict[str, Any]:
    """The Chrome trace event format (JSON-ready) of ``records`` and request blocks.

    Every task is an async slice (``"ph": "b"``/``"e"``, a unique ``id``) named after its
    stream, so that Perfetto puts the tasks of one stream on one track and stacks those that
    overlap; its phases are slices nested in it; flows are ``bind_id`` with ``flow_out`` /
    ``flow_in`` on the outer slices, in the order of their start.
    """
    ended = [(scope, flow) for scope, flow in requests if scope.end is not None]
    starts = [r.admitted for r in records] + [scope.start for scope, _ in ended]
    origin = min(starts, default=0.0)

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    next_pid = _REQUESTS_PID + 1
    for r in records:
        if r.process not in pids:
            pids[r.process] = next_pid
            events.append(_meta("process_name", next_pid, {"name": r.process}))
            events.append(_meta("process_sort_index", next_pid, {"sort_index": next_pid}))
            next_pid += 1
    if ended:
        events.append(_meta("process_name", _REQUESTS_PID, {"name": "requests"}))
        events.append(_meta("process_sort_index", _REQUESTS_PID, {"sort_index": 0}))

    chains: dict[int, list[tuple[float, dict[str, Any]]]] = {}
    serial = itertools.count(1)

    def begin(
        pid: int, ident: str, name: str, t: float, args: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        event: dict[str, Any] = {
            "ph": "b",
            "cat": _CATEGORY,
            "name": name,
            "id": ident,
            "pid": pid,
            "tid": pid,
            "ts": us(t),
        }
        if args:
            event["args"] = args
        events.append(event)
        return event

    def end(pid: int, ident: str, name: str, t: float) -> None:
        events.append(
            {
                "ph": "e",
                "cat": _CATEGORY,
                "name": name,
                "id": ident,
                "pid": pid,
                "tid": pid,
                "ts": us(t),
            }
        )

    def phase(pid: int, ident: str, name: str, t0: float, t1: float) -> None:
        begin(pid, ident, name, t0)
        end(pid, ident, name, max(t0, t1))

    for scope, flow in ended:
        assert scope.end is not None
        ident = f"0x{next(serial):x}"
        outer = begin(_REQUESTS_PID, ident, "requests", scope.start, {"request": scope.name})
        phase(_REQUESTS_PID, ident, scope.name, scope.start, scope.end)
        end(_REQUESTS_PID, ident, "requests", scope.end)
        chains.setdefault(flow, []).append((scope.start, outer))

    for r in records:
        pid = pids[r.process]
        ident = f"0x{next(serial):x}"
        args: dict[str, Any] = {"kind": r.kind, "stream": f"{r.stream:#x}"}
        if r.kernel is not None:
            args["kernel"] = r.kernel
        if r.request is not None:
            args["request"] = r.request
        for label, value in (
            ("queued_us", r.queued),
            ("on_device_us", r.on_device),
            ("wake_us", r.wake),
        ):
            if value is not None:
                args[label] = round(value * 1e6, 3)
        if r.error is not None:
            args["error"] = r.error
        stop = r.end
        outer = begin(pid, ident, r.stream_name, r.admitted, args)
        if r.submitted is not None:
            phase(pid, ident, "queued", r.admitted, r.submitted)
            if r.completed is not None:
                phase(pid, ident, r.kernel or r.kind, r.submitted, r.completed)
                if r.resumed is not None:
                    phase(pid, ident, "wake", r.completed, r.resumed)
        if r.error is not None:
            events.append(
                {
                    "ph": "n",
                    "cat": _CATEGORY,
                    "name": f"failed: {r.error}",
                    "id": ident,
                    "pid": pid,
                    "tid": pid,
                    "ts": us(stop),
                }
            )
        end(pid, ident, r.stream_name, stop)
        if r.flow is not None:
            chains.setdefault(r.flow, []).append((r.admitted, outer))

    if flows:
        for flow, members in chains.items():
            if len(members) < 2:
                continue
            members.sort(key=lambda item: item[0])
            last = len(members) - 1
            for index, (_, event) in enumerate(members):
                event["bind_id"] = flow
                if index > 0:
                    event["flow_in"] = True
                if index < last:
                    event["flow_out"] = True
    trace: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    trace["otherData"] = {
        "clock": "time.perf_counter",
        "origin_s": origin,
        "tasks": len(records),
        "requests": len(ended),
        **metadata,
    }
    return trace


def _meta(name: str, pid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": pid, "args": args}
