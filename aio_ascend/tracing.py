"""Tracing your own program: every device's tasks as a Perfetto / Chrome trace.

For example::

    from aio_ascend import tracing

    with tracing.record("trace.json"):            # every device's tasks while it runs
        asyncio.run(main())

    async def handle(request):                   # in your server
        with tracing.request(f"GET {request.path}"):   # this request's tasks, linked
            await s.run(fn, 8, args)

Open the file in https://ui.perfetto.dev (or ``chrome://tracing``). Each device is a
process named with its backend (``device 0 (sim)``); each stream is one track ("stream 1",
... or the names given with :meth:`Tracer.name_stream`) on which every task is a slice named
after its operation (the kernel's name, or ``copy_to_device``, ``record_event``, ...), from
when it could start (submitted, and the stream's previous task observed complete: a stream
runs in order) to its observed completion (``Task.completed_at``), so the slices of a stream
never overlap. A host function (``Stream.launch_host_func``) is a ``host_func`` slice of its
stream, from when it was handed to the host-function thread to when it returned. The
slice's arguments carry the task's phases in microseconds:

- ``queued_us``: admitted -> its batch handed to the runtime (``Task.submitted_at``);
- ``on_device_us``: submitted -> observed complete on the device, the wait behind earlier
  work on the stream included;
- ``wake_us``: observed complete -> the waiting coroutine resumed (``Task.resumed_at``): the
  library's wake-up. It is absent when nobody was waiting (the task was awaited later, or
  never).

Counter tracks beside them give, per stream and for the whole device ("all streams"), how
many tasks are ``queued`` (admitted, not submitted) and ``in flight`` (submitted, not
observed complete). Flow arrows link the tasks of one request in the order they start: the
tasks created inside one :func:`request` block (shown as a slice on the "requests" track of
the "requests" process), or else the tasks created by one asyncio/trio task. All times are
``time.perf_counter()`` seconds, shown relative to the first event.

While no tracer is recording the scheduler pays one attribute check per task; while one is,
each task costs a few microseconds (the figures, and the command that measures them, are in
``docs/guide/observability.md``, "What tracing costs").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple

from ._sched.hooks import HOOKS, ObserverContext, Source, task_of, times
from ._sched.task import Task
from ._sched.work import Outcome

__all__ = ["DEFAULT_MAX_TASKS", "RequestScope", "TaskRecord", "Tracer", "record", "request"]

_log = logging.getLogger("aio_ascend.tracing")

#: tasks one tracer keeps at most (a few hundred bytes each); later ones are only counted
DEFAULT_MAX_TASKS = 250_000
_CATEGORY = "aio_ascend"
_REQUESTS_PID = 1
#: a device process's streams get the thread ids ``pid * _TIDS_PER_PROCESS + 1, + 2, ...``
_TIDS_PER_PROCESS = 1_000_000
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


#: a delivered task kept until the tracer stops: (task, device, stream handle, kind, kernel,
#: error class name, (submitted, completed) of a host function or None: the task's)
_Pending = tuple[
    Task, Source, int, str, str | None, str | None, tuple[float | None, float | None] | None
]


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
        self._pending: list[_Pending] = []
        self._records: list[TaskRecord] = []
        self._requests: list[RequestScope] = []
        self._names: dict[tuple[int, int], str] = {}
        self._processes: dict[Source, str] = {}
        self._stream_numbers: dict[Source, dict[int, str]] = {}
        # (device, track name) -> the stream handle whose track it is: one track per stream
        self._track_owners: dict[tuple[Source, str], int] = {}
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
        """Show ``stream`` (an ``aio_ascend.Stream``) as the track ``name`` (with the stream's
        handle added, ``"name (0x...)"``, if another stream of its device shows as ``name``:
        each stream has a track of its own)."""
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
                kernel = request.spec.kernel if kind == "launch" else None
                failed = None if error is None else type(error).__name__
                # a host function's times are its own (its task keeps none): read them now
                stamps = times(request) if kind == "host_func" else None
                task = task_of(request)
                pending.append((task, source, request.lane.handle, kind, kernel, failed, stamps))

    def resumed(self, task: Any) -> None:
        """(Nothing: the wake-up is read from the task when the tracer stops.)"""

    def add_request(self, scope: RequestScope) -> None:
        """A :func:`request` block ended while recording."""
        self._requests.append(scope)

    # --- internals -------------------------------------------------------------------------

    def _finish(self, pending: list[_Pending]) -> list[TaskRecord]:
        records: list[TaskRecord] = []
        append = records.append
        tracks: dict[tuple[Source, int], tuple[str, str]] = {}  # (process, stream name)
        flow_of = self._flow_of
        for task, source, handle, kind, kernel, failed, stamps in pending:
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
            submitted, completed = (
                (task.submitted_at, task.completed_at) if stamps is None else stamps
            )
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
                    submitted,
                    completed,
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
        # a name another stream of the device has already: this stream's handle tells it apart
        track, again = name, 1
        while self._track_owners.setdefault((source, track), handle) != handle:
            again += 1
            track = f"{name} ({handle:#x})" + (f" #{again - 1}" if again > 2 else "")
        return process, track

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


def _stream_slices(
    records: Sequence[TaskRecord],
) -> list[tuple[TaskRecord, float | None, float]]:
    """Each record with the stretch its stream's track shows it on: ``(record, start, end)``.

    A stream runs its work in order, so a task can start only once it was submitted and the
    stream's previous task was observed complete: ``start = max(submitted, previous end)``,
    ``end = completed``. The slices of one stream never overlap, and one track holds them. A
    task that never completed (refused, timed out, failed before or at submission) has no
    stretch: ``start`` is ``None`` and ``end`` its last timestamp (an instant).
    """
    by_stream: dict[tuple[str, str], list[TaskRecord]] = {}
    for r in records:
        by_stream.setdefault((r.process, r.stream_name), []).append(r)
    out: list[tuple[TaskRecord, float | None, float]] = []
    for tasks in by_stream.values():
        tasks.sort(key=lambda r: r.admitted)  # admission order is the stream's order
        previous = -math.inf
        for r in tasks:
            if r.submitted is None or r.completed is None:
                out.append((r, None, r.end))
                continue
            start = max(r.submitted, previous)
            previous = max(r.completed, start)
            out.append((r, start, previous))
    return out


def _counter_steps(records: Sequence[TaskRecord]) -> list[tuple[float, int, int]]:
    """``(time, change of queued, change of in flight)`` of ``records``, in time order.

    Queued: admitted, not yet submitted. In flight: submitted, not yet observed complete. A
    task that stopped before either ends (refused, timed out) leaves at its last timestamp.
    """
    steps: list[tuple[float, int, int]] = []
    for r in records:
        steps.append((r.admitted, 1, 0))
        if r.submitted is None:
            steps.append((r.end, -1, 0))
            continue
        steps.append((r.submitted, -1, 1))
        steps.append((r.end if r.completed is None else r.completed, 0, -1))
    steps.sort(key=lambda step: step[0])
    return steps


def _build_trace(
    records: Sequence[TaskRecord],
    requests: Sequence[tuple[RequestScope, int]],
    *,
    flows: bool,
    metadata: dict[str, Any],
) -> dict[str, Any]:
    """The Chrome trace event format (JSON-ready) of ``records`` and request blocks.

    Each device is a process named with its backend; each of its streams is one thread track
    (``thread_name``) whose tasks are complete slices (``"X"``) that never overlap (see
    :func:`_stream_slices`), plus two counter series per stream and for the whole device
    (``"C"``: ``queued``, ``in flight``). Request blocks overlap, so they are async slices
    (``"b"``/``"e"``) of the "requests" process. Flows are ``bind_id`` with ``flow_out`` /
    ``flow_in`` on the slices of one request, in the order of their start.
    """
    ended = [(scope, flow) for scope, flow in requests if scope.end is not None]
    starts = [r.admitted for r in records] + [scope.start for scope, _ in ended]
    origin = min(starts, default=0.0)

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    next_pid = _REQUESTS_PID + 1
    for r in records:
        if r.process not in pids:
            pids[r.process] = next_pid
            events.append(_meta("process_name", next_pid, {"name": r.process}))
            events.append(_meta("process_sort_index", next_pid, {"sort_index": next_pid}))
            next_pid += 1
        if (r.process, r.stream_name) not in tids:
            pid = pids[r.process]
            # Perfetto keys threads by tid alone (a system's thread ids are unique), so a
            # stream's tid is unique in the trace and apart from the pids, which the counters
            # and the requests' async slices use as their tid
            index = sum(1 for p, _ in tids if p == r.process) + 1
            tid = tids[(r.process, r.stream_name)] = pid * _TIDS_PER_PROCESS + index
            events.append(_meta("thread_name", pid, {"name": r.stream_name}, tid=tid))
            events.append(_meta("thread_sort_index", pid, {"sort_index": index}, tid=tid))
    if ended:
        events.append(_meta("process_name", _REQUESTS_PID, {"name": "requests"}))
        events.append(_meta("process_sort_index", _REQUESTS_PID, {"sort_index": 0}))

    chains: dict[int, list[tuple[float, dict[str, Any]]]] = {}
    serial = itertools.count(1)

    for scope, flow in ended:
        assert scope.end is not None
        ident = f"0x{next(serial):x}"
        common = {"cat": _CATEGORY, "id": ident, "pid": _REQUESTS_PID, "tid": _REQUESTS_PID}
        outer = {"ph": "b", "name": "requests", "ts": us(scope.start), **common}
        outer["args"] = {"request": scope.name}
        events.append(outer)
        events.append({"ph": "b", "name": scope.name, "ts": us(scope.start), **common})
        events.append({"ph": "e", "name": scope.name, "ts": us(scope.end), **common})
        events.append({"ph": "e", "name": "requests", "ts": us(scope.end), **common})
        chains.setdefault(flow, []).append((scope.start, outer))

    for r, start, stop in _stream_slices(records):
        pid = pids[r.process]
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
        name = r.kernel or r.kind
        event: dict[str, Any] = {
            "cat": _CATEGORY,
            "pid": pid,
            "tid": tids[(r.process, r.stream_name)],
        }
        if r.error is not None:
            args["error"] = r.error
        if start is None:  # never ran: a mark where it ended
            name = f"failed: {r.error}" if r.error is not None else name
            event.update(ph="i", s="t", name=name, ts=us(stop), args=args)
            events.append(event)
            continue
        begin = us(start)
        event.update(ph="X", name=name, ts=begin, dur=round(us(stop) - begin, 3), args=args)
        events.append(event)
        if r.flow is not None:
            chains.setdefault(r.flow, []).append((start, event))

    for process, pid in pids.items():
        mine = [r for r in records if r.process == process]
        series: dict[str, list[TaskRecord]] = {"all streams": mine}
        for r in mine:
            series.setdefault(r.stream_name, []).append(r)
        for counter, counted in series.items():
            queued = in_flight = 0
            steps = _counter_steps(counted)
            for index, (t, dq, df) in enumerate(steps):
                queued += dq
                in_flight += df
                if index + 1 < len(steps) and steps[index + 1][0] == t:
                    continue  # one sample per instant, after all its changes
                events.append(
                    {
                        "ph": "C",
                        "cat": _CATEGORY,
                        "name": counter,
                        "pid": pid,
                        "tid": pid,
                        "ts": us(t),
                        "args": {"queued": queued, "in flight": in_flight},
                    }
                )

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


def _meta(name: str, pid: int, args: dict[str, Any], *, tid: int | None = None) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": pid if tid is None else tid, "args": args}
