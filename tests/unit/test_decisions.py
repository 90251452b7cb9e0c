"""The scheduler's decisions as plain code, table-driven, without threads or a loop.

Each decision module of ``aio_ascend._sched`` is driven here with made-up inputs: admission,
flushing, the delivery budget, the watchdog, fault attribution, lifetimes and counters.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from aio_ascend._errors import (
    ContextNullError,
    DeviceFaultError,
    InvalidParamError,
    TaskTimeoutError,
)
from aio_ascend._runtime.abi import (
    ACL_EVENT_RECORDED_STATUS_COMPLETE,
    ACL_EVENT_RECORDED_STATUS_NOT_READY,
)
from aio_ascend._sched.admission import ENTRIES_PER_REQUEST, GRANT_PER_WAKE, Admission
from aio_ascend._sched.batching import Hop, form_batches
from aio_ascend._sched.counters import Counters, total
from aio_ascend._sched.delivery import MAX_WAKES_PER_TURN, DeliveryQueue
from aio_ascend._sched.devpool import DevicePool
from aio_ascend._sched.events import EventRecord
from aio_ascend._sched.faults import FaultState, as_device_fault, classify_refusal, fail_batches
from aio_ascend._sched.forcing import stranded_by, waits_on
from aio_ascend._sched.lane import Lane
from aio_ascend._sched.lifetimes import Allocation, FreedError, Lifetimes
from aio_ascend._sched.scheduler import flush_now
from aio_ascend._sched.stalls import STALL_PROBE_MAX_S, STALL_PROBE_S, StallProbes
from aio_ascend._sched.waiter import FIRST_SLICE_MS, MAX_SLICE_MS, next_slice
from aio_ascend._sched.watchdog import expire
from aio_ascend._sched.work import Batch, Outcome, RecordEvent, Request, WaitEvent

# --- admission ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "budget", "in_flight", "entries", "queued", "admitted"),
    [
        (1, 100, 0, 0, 0, True),
        (1, 100, 1, 2, 0, False),  # request bound reached
        (4, 100, 3, 6, 0, True),
        (4, 100, 2, 4, 1, False),  # room, but someone is queued ahead: FIFO
        (4, 100, 4, 8, 0, False),
        (100, 10, 4, 8, 0, True),  # 8 + 2 entries fit a budget of 10 ...
        (100, 10, 4, 9, 0, False),  # ... 9 + 2 do not: the runtime queue would fill
        (100, 2, 0, 0, 0, True),
    ],
)
def test_try_enter(
    limit: int, budget: int, in_flight: int, entries: int, queued: int, admitted: bool
) -> None:
    admission = Admission(limit, budget)
    admission.in_flight, admission.entries = in_flight, entries
    for i in range(queued):
        admission.enqueue(f"w{i}")
    assert admission.try_enter() is admitted
    assert admission.in_flight == in_flight + int(admitted)
    assert admission.entries == entries + ENTRIES_PER_REQUEST * int(admitted)


def test_an_entry_budget_below_one_request_is_refused() -> None:
    with pytest.raises(ValueError, match="queue capacity of 1 entries is too small"):
        Admission(4, 1)


def test_a_finished_request_admits_the_oldest_waiters_in_order() -> None:
    admission = Admission(1, 100)
    assert admission.try_enter()
    tickets = [admission.enqueue(name) for name in ("a", "b", "c")]
    assert [admission.release(2) for _ in range(3)] == [["a"], ["b"], ["c"]]
    assert all(ticket.granted for ticket in tickets)
    assert (admission.in_flight, admission.entries) == (1, 2)
    assert admission.release(2) == []
    assert (admission.in_flight, admission.entries) == (0, 0)


def test_refunded_entries_admit_waiters_that_now_fit() -> None:
    admission = Admission(100, 6)
    for _ in range(3):
        assert admission.try_enter()
    admission.enqueue("x")
    admission.enqueue("y")
    assert admission.refund(1) == []  # 5 entries held: one more needs 2
    assert admission.refund(2) == ["x"]  # 3 held + 2 = 5 <= 6; y would need 7
    assert (admission.in_flight, admission.entries) == (4, 5)
    assert admission.release(1) == ["y"]


def test_a_cancelled_waiter_leaves_the_queue_or_passes_its_admission_on() -> None:
    admission = Admission(1, 100)
    admission.try_enter()
    first, second = admission.enqueue("a"), admission.enqueue("b")
    assert admission.withdraw(first) == []  # not granted yet: just leaves
    assert list(admission.queue) == [second]
    assert admission.release(2) == ["b"]  # b got in ...
    assert admission.withdraw(second) == []  # ... and gave it up: nothing held any more
    assert (admission.in_flight, admission.entries) == (0, 0)


def test_refuse_all_on_close_turns_every_waiter_away_holding_nothing() -> None:
    admission = Admission(2, 100)
    admission.try_enter()
    admission.try_enter()
    tickets = [admission.enqueue(name) for name in "xyz"]
    assert admission.refuse_all() == ["x", "y", "z"]
    assert (admission.in_flight, admission.entries) == (2, 4) and not admission.queue
    assert all(t.refused and not t.granted for t in tickets)
    assert admission.withdraw(tickets[0]) == []  # cancelled after being refused: no-op
    admission.reset()
    assert (admission.in_flight, admission.entries) == (0, 0)


def test_prepaid_slots_serve_only_their_owner_and_go_back_when_it_suspends() -> None:
    admission = Admission(GRANT_PER_WAKE, 4 * GRANT_PER_WAKE)
    for _ in range(GRANT_PER_WAKE):
        admission.try_enter()
    first = admission.enqueue("owner")
    assert admission.release(2 * GRANT_PER_WAKE, GRANT_PER_WAKE) == ["owner"]
    assert first.extra == GRANT_PER_WAKE - 1 and admission.in_flight == GRANT_PER_WAKE
    assert admission.unsettled() == 1  # the owner's call; the rest, granted ahead: no requests
    running = ["owner"]
    assert admission.adopt(first, "owner", lambda: running[0]) == []
    assert admission.unsettled() == 1 and admission.granted_ahead == 0
    generation = admission.generation
    admission.enqueue("late")
    running[0] = "newcomer"  # another coroutine: it queues behind "late" (FIFO holds)
    assert admission.try_enter() is False
    running[0] = "owner"  # the owner's next calls need no wait
    assert admission.try_enter() and admission.try_enter()
    assert admission.prepaid == GRANT_PER_WAKE - 3 and admission.in_flight == GRANT_PER_WAKE
    assert admission.unsettled() == 3
    assert admission.expire(generation - 1) == []  # an earlier owner's expiry: not this one
    assert admission.expire(generation) == ["late"]  # the owner suspended: the rest goes on
    assert admission.prepaid == 0 and admission.owner is None
    assert admission.in_flight == GRANT_PER_WAKE  # 3 used + the 5 the limit leaves for late


def test_a_cancelled_or_refused_grant_gives_back_every_slot_it_held() -> None:
    full = 4 * GRANT_PER_WAKE
    admission = Admission(full, 10 * full)
    admission.in_flight, admission.entries = full, 2 * full
    ticket = admission.enqueue("a")
    admission.release(2 * GRANT_PER_WAKE, GRANT_PER_WAKE)
    assert ticket.granted and ticket.extra == GRANT_PER_WAKE - 1
    assert admission.unsettled() == full - GRANT_PER_WAKE + 1
    assert admission.withdraw(ticket) == []  # cancelled after the grant: all of it back
    assert admission.granted_ahead == 0
    assert (admission.in_flight, admission.entries) == (
        full - GRANT_PER_WAKE,
        2 * full - 2 * GRANT_PER_WAKE,
    )
    again = admission.enqueue("b")
    admission.release(2 * GRANT_PER_WAKE, GRANT_PER_WAKE)
    admission.adopt(again, "b", lambda: "b")
    assert admission.prepaid == GRANT_PER_WAKE - 1
    assert admission.refuse_all() == []  # closing: prepaid slots are dropped too
    assert admission.prepaid == 0
    assert admission.in_flight == full - 2 * GRANT_PER_WAKE + 1


# --- batches ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lanes", "cap", "closing", "refunds"),
    [
        ("a", 8, [0], {}),
        ("aaa", 8, [2], {"a": 2}),
        ("aaaaa", 2, [0, 2, 4], {"a": 2}),  # counted from the end: the first batch is short
        ("abab", 8, [2, 3], {"a": 1, "b": 1}),
        ("aabbbab", 2, [0, 3, 5, 6], {"a": 1, "b": 2}),
        # an event's record (upper case) closes its batch wherever it is; counts start again
        ("aAaa", 8, [1, 3], {"a": 2}),
        ("aaAaaaaa", 2, [0, 2, 3, 5, 7], {"a": 3}),
        ("aAbBa", 8, [1, 3, 4], {"a": 1, "b": 1}),
        ("AA", 8, [0, 1], {}),
        ("aaA", 8, [2], {"a": 2}),  # where the count ends one anyway: nothing changes
    ],
)
def test_form_batches(lanes: str, cap: int, closing: list[int], refunds: dict[str, int]) -> None:
    names = sorted({name.lower() for name in lanes})
    by_name = {name: Lane(i + 1, 100, 100) for i, name in enumerate(names)}
    requests = [
        RecordEvent(by_name[name.lower()]) if name.isupper() else _Req(by_name[name])
        for name in lanes
    ]
    got = form_batches(requests, cap)
    assert [i for i, r in enumerate(requests) if r.closes_batch] == closing
    assert {name: got[lane] for name, lane in by_name.items() if lane in got} == refunds
    # entries held: one each, plus one per batch event
    assert sum(r.entries for r in requests) == len(requests) + len(closing)


def test_a_hop_is_either_taken_or_expired() -> None:
    taken, expired = Hop([], 1.0), Hop([], 1.0)
    assert taken.take() and not taken.expire()
    assert expired.expire() and not expired.take()


# --- flushing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pending", "flush_at", "now"),
    [(1, 256, False), (255, 256, False), (256, 256, True), (8, 8, True)],
)
def test_flush_now(pending: int, flush_at: int, now: bool) -> None:
    assert flush_now(pending, flush_at) is now


# --- delivery budget ----------------------------------------------------------------------


class _Loop:
    """call_soon into a list of turns; waiters are lists that record their wake-up."""

    def __init__(self) -> None:
        self.scheduled: deque[Callable[[], None]] = deque()
        self.woken: list[object] = []

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.scheduled.append(fn)

    def run_turn(self) -> None:
        for _ in range(len(self.scheduled)):
            self.scheduled.popleft()()

    def wake(self, waiter: object) -> None:
        self.woken.append(waiter)


class _Adapter:
    def __init__(self, loop: _Loop) -> None:
        self.wake = loop.wake


class _Owner:
    """A lane's owner as tasks see it: the loop (its adapter), no failure log."""

    def __init__(self, loop: _Loop) -> None:
        self.adapter = _Adapter(loop)
        self.failures = None


def _deliveries(
    loop: _Loop, count: int, awaiters: int, outcome: Outcome = Outcome.FINISHED
) -> tuple[Lane, list[Any]]:
    lane = Lane(1, 10**6, 10**7)
    lane.owner = _Owner(loop)
    lane.admission.in_flight = count
    lane.admission.entries = 2 * count
    out = []
    for i in range(count):
        request = _Req(lane)
        request._waiters = [f"t{i}w{k}" for k in range(awaiters)]
        out.append((request, None, outcome))
    return lane, out


@pytest.mark.parametrize(
    ("count", "awaiters", "turns"),
    [
        (10, 1, 1),
        (MAX_WAKES_PER_TURN, 1, 1),
        (MAX_WAKES_PER_TURN + 1, 1, 2),
        (1000, 1, -(-1000 // MAX_WAKES_PER_TURN)),
        (1000, 2, -(-2000 // MAX_WAKES_PER_TURN)),
        (3000, 0, 3),  # nobody woken: only the loose cap on resolutions applies (1024 a turn)
    ],
)
def test_deliveries_are_resolved_in_bounded_chunks(count: int, awaiters: int, turns: int) -> None:
    loop = _Loop()
    settled: list[int] = []
    queue = DeliveryQueue(loop.wake, loop.call_soon, settled.append)
    lane, deliveries = _deliveries(loop, count, awaiters)
    queue.deliver(deliveries)
    seen = 1
    while loop.scheduled:
        loop.run_turn()
        seen += 1
    assert seen == turns
    assert sum(settled) == count and lane.admission.in_flight == lane.admission.entries == 0
    assert all(request.done() for request, _, _ in deliveries)
    assert len(loop.woken) == count * awaiters
    assert loop.woken[:2] == (["t0w0", "t0w1"] if awaiters == 2 else loop.woken[:2])


def test_a_delivery_while_a_drain_is_due_waits_for_that_drain() -> None:
    loop = _Loop()
    queue = DeliveryQueue(loop.wake, loop.call_soon, lambda count: None)
    _, first = _deliveries(loop, MAX_WAKES_PER_TURN + 5, 1)
    queue.deliver(first)
    assert len(loop.woken) == MAX_WAKES_PER_TURN
    _, late = _deliveries(loop, 1, 1)
    queue.deliver(late)
    assert len(loop.woken) == MAX_WAKES_PER_TURN  # not resolved out of turn
    loop.run_turn()
    assert len(loop.woken) == MAX_WAKES_PER_TURN + 6 and len(queue) == 0


@pytest.mark.parametrize(
    ("outcome", "resolved", "slot_freed", "settled"),
    [
        (Outcome.FINISHED, True, True, 1),
        (Outcome.TIMED_OUT, True, False, 1),  # the device may still run it: keep the slot
        (Outcome.FINISHED_LATE, False, True, 0),  # the watchdog resolved it already
    ],
)
def test_outcomes(outcome: Outcome, resolved: bool, slot_freed: bool, settled: int) -> None:
    loop = _Loop()
    counts: list[int] = []
    lane, deliveries = _deliveries(loop, 1, 0, outcome)
    DeliveryQueue(loop.wake, loop.call_soon, counts.append).deliver(deliveries)
    assert deliveries[0][0].done() is resolved
    assert lane.admission.in_flight == (0 if slot_freed else 1)
    assert counts == [settled]


def test_a_freed_slot_goes_to_the_oldest_admission_waiter() -> None:
    loop = _Loop()
    lane, deliveries = _deliveries(loop, 1, 0)
    ticket = lane.admission.enqueue("admit-me")
    DeliveryQueue(loop.wake, loop.call_soon, lambda count: None).deliver(deliveries)
    # the stream is free: the waiter gets a whole grant (its call's slot and prepaid ones)
    assert loop.woken == ["admit-me"] and lane.admission.in_flight == GRANT_PER_WAKE
    assert ticket.granted and ticket.extra == GRANT_PER_WAKE - 1
    assert lane.admission.entries == ENTRIES_PER_REQUEST * GRANT_PER_WAKE


def test_a_run_of_completions_wakes_each_waiter_once_with_several_slots() -> None:
    loop = _Loop()
    count = 2 * GRANT_PER_WAKE + GRANT_PER_WAKE // 2
    lane, deliveries = _deliveries(loop, count, 0)
    lane.admission.limit = count  # every slot taken by the requests delivered
    lane.admission.entry_budget = 2 * count
    tickets = [lane.admission.enqueue(f"w{i}") for i in range(4)]
    DeliveryQueue(loop.wake, loop.call_soon, lambda count: None).deliver(deliveries)
    # the freed slots, oldest first, GRANT_PER_WAKE each: w0 and w1 a full grant, w2 the rest
    assert loop.woken == ["w0", "w1", "w2"]
    full = GRANT_PER_WAKE - 1
    assert [t.extra for t in tickets[:3]] == [full, full, GRANT_PER_WAKE // 2 - 1]
    assert not tickets[3].granted
    assert lane.admission.in_flight == count


@pytest.mark.parametrize(
    ("limit", "budget", "in_flight", "entries", "granted"),
    [
        (1024, 10_000, 0, 0, GRANT_PER_WAKE),  # a whole grant
        (1024, 10_000, 1000, 2000, 24),  # the request bound leaves 24
        (1024, 2001, 990, 1980, 10),  # the entry budget leaves 21 entries: 10 requests
        (1024, 2000, 999, 1999, 0),  # one entry short: nobody is granted
        (5, 10_000, 5, 10, 0),
    ],
)
def test_a_grant_takes_what_both_budgets_have_room_for_at_most_a_whole_grant(
    limit: int, budget: int, in_flight: int, entries: int, granted: int
) -> None:
    admission = Admission(limit, budget)
    admission.in_flight, admission.entries = in_flight, entries
    ticket = admission.enqueue("w0")
    assert admission.grant() == (["w0"] if granted else [])
    assert ticket.granted is bool(granted)
    assert ticket.extra == max(granted - 1, 0)
    assert admission.in_flight == in_flight + granted <= limit
    assert admission.entries == entries + ENTRIES_PER_REQUEST * granted <= budget


# --- watchdog -----------------------------------------------------------------------------


def _Req(lane: Lane) -> Request:
    # A request that is never submitted: a wait on an event (a concrete request of the
    # library, and the Task its caller would await)
    return WaitEvent(lane, EventRecord(0, 0))


def _batch(lane: Lane, deadline: float, size: int = 2) -> Batch:
    requests: list[Request] = [_Req(lane) for _ in range(size)]
    return Batch(lane, requests, event=0, deadline=deadline, submitted=deadline - 3.0)


@pytest.mark.parametrize(
    ("deadlines", "now", "expired"),
    [
        ([5.0, 6.0], 4.0, 0),
        ([5.0, 6.0], 5.0, 1),
        ([5.0, 6.0], 7.0, 2),
        ([5.0, 1.0], 4.0, 0),  # the scan of a stream stops at the first batch still in time
    ],
)
def test_watchdog_expires_batches_past_their_deadline(
    deadlines: list[float], now: float, expired: int
) -> None:
    lane = Lane(1, 8, 100)
    batches = [_batch(lane, d) for d in deadlines]
    deliveries = expire([batches], now, task_timeout=3.0)
    assert sum(batch.timed_out for batch in batches) == expired
    assert len(deliveries) == 2 * expired
    assert all(isinstance(err, TaskTimeoutError) for _, err, _ in deliveries)
    assert all(outcome is Outcome.TIMED_OUT for _, _, outcome in deliveries)
    # a timed-out task was submitted: it keeps its batch's submission time
    for batch in batches:
        stamps = {req.submitted_at for req in batch.requests}
        assert stamps == ({batch.submitted} if batch.timed_out else {None})
    more = expire([batches], now, task_timeout=3.0)
    assert more == []  # a batch times out once
    assert sum(batch.timed_out for batch in batches) == expired


# --- faults -------------------------------------------------------------------------------


def _healthy() -> bool:
    return True


def _broken() -> bool:
    return False


@pytest.mark.parametrize(
    ("error", "healthy", "is_fault"),
    [
        (InvalidParamError("bad", code=100000), _healthy, False),  # a plain refusal
        (InvalidParamError("bad", code=100000), _broken, True),  # refused by a dead context
        (DeviceFaultError("boom", code=507015), _healthy, True),
        (ValueError("not a runtime error"), _broken, False),
    ],
)
def test_classify_refusal(
    error: BaseException, healthy: Callable[[], bool], is_fault: bool
) -> None:
    faults = FaultState()
    result = classify_refusal(error, faults, healthy)
    assert isinstance(result, DeviceFaultError) is is_fault
    assert (faults.first is not None) is is_fault


def test_only_the_first_fault_is_the_device_fault() -> None:
    faults = FaultState()
    first = classify_refusal(DeviceFaultError("a", code=507015), faults, _healthy)
    later = classify_refusal(DeviceFaultError("b", code=507015), faults, _healthy)
    assert faults.first is first
    assert later is not first and later.__cause__ is first


def test_fail_batches_gives_the_first_fault_to_one_request_only() -> None:
    lane = Lane(1, 8, 100)
    batches = [_batch(lane, 9.0, size=3), _batch(lane, 9.0, size=2)]
    fault = as_device_fault(ContextNullError("context gone", code=107002))
    deliveries = fail_batches(batches, fault, fault)
    errors = [err for _, err, _ in deliveries]
    assert len(errors) == 5 and errors[0] is fault
    assert all(isinstance(e, DeviceFaultError) and e.__cause__ is fault for e in errors[1:])
    earlier = DeviceFaultError("earlier", code=507015)
    errors = [err for _, err, _ in fail_batches(batches, fault, earlier)]
    assert all(e is not earlier and e.__cause__ is earlier for e in errors)  # nobody is first


def test_fail_batches_gives_back_the_slots_of_work_the_watchdog_failed_as_finished_late() -> None:
    # Delivered as FINISHED, the slot came back but the stream's count of timed-out work did
    # not: a timed stream close then waited out its whole timeout for work already gone.
    lane = Lane(1, 8, 100)
    timed_out, running = _batch(lane, 9.0, size=2), _batch(lane, 9.0, size=1)
    timed_out.timed_out = True
    fault = as_device_fault(ContextNullError("context gone", code=107002))
    outcomes = [outcome for _, _, outcome in fail_batches([timed_out, running], fault, fault)]
    assert outcomes == [Outcome.FINISHED_LATE, Outcome.FINISHED_LATE, Outcome.FINISHED]


# --- lifetimes ----------------------------------------------------------------------------


def _no_malloc(nbytes: int) -> int:
    raise AssertionError("these tests allocate nothing")


class _Pool:
    def __init__(self) -> None:
        self.released: list[object] = []

    def release(self, buf: object) -> None:
        self.released.append(buf)


class _Holder:
    holds_user = False

    def __init__(self, host: Any, buffers: tuple[Allocation, ...]) -> None:
        self.host = host
        self.buffers = buffers

    def let_go(self) -> None:
        raise AssertionError("holds nothing of a user's")


class _Host(str):
    """A host buffer as Lifetimes sees it: a name, and whether a plan shares it."""

    shared = False


class _SharedHost(_Host):
    shared = True


def test_free_is_deferred_until_the_last_user_is_released() -> None:
    freed: list[int] = []
    pool = _Pool()
    lifetimes = Lifetimes(DevicePool(_no_malloc, freed.append), pool)  # type: ignore[arg-type]
    a = Allocation(lifetimes, 0x100, 64, block=64)
    b = Allocation(lifetimes, 0x200, 64, block=64)
    lifetimes.track(a)
    lifetimes.track(b)
    lifetimes.retain((a, b))
    lifetimes.retain((a,))
    lifetimes.free(a)
    lifetimes.free(a)  # twice is once
    assert freed == [] and a.free_requested
    lifetimes.release([_Holder(_Host("h1"), (a, b))])
    assert freed == [] and pool.released == ["h1"]
    lifetimes.release([_Holder(None, (a,))])
    assert freed == [0x100] and lifetimes.live_count == 1
    lifetimes.free(b)  # unused: freed at once
    assert freed == [0x100, 0x200] and lifetimes.live_count == 0


def test_a_shared_args_image_is_not_given_back_by_the_requests_that_read_it() -> None:
    pool = _Pool()
    lifetimes = Lifetimes(lambda ptr: None, pool)  # type: ignore[arg-type]
    holders = [_Holder(_SharedHost("image"), ()), _Holder(_Host("own"), ())]
    lifetimes.release(holders)
    assert pool.released == ["own"]  # the image goes back with its owner (the plan)
    assert all(holder.host is None for holder in holders)


def test_take_all_on_close_and_nothing_freed_twice_after() -> None:
    freed: list[int] = []
    lifetimes = Lifetimes(DevicePool(_no_malloc, freed.append), _Pool())  # type: ignore[arg-type]
    a = Allocation(lifetimes, 0x100, 64, block=64)
    lifetimes.track(a)
    lifetimes.retain((a,))
    lifetimes.close()
    assert freed == [0x100] and a.released
    lifetimes.free(a)
    lifetimes.release([_Holder(None, (a,))])
    assert freed == [0x100]  # the closer freed it; nobody does again


def test_a_freed_allocation_is_never_retained_and_none_of_its_request_is() -> None:
    lifetimes = Lifetimes(DevicePool(_no_malloc, lambda ptr: None), _Pool())  # type: ignore[arg-type]
    a, b, c = (Allocation(lifetimes, 0x100 * i, 64, block=64) for i in (1, 2, 3))
    for allocation in (a, b, c):
        lifetimes.track(allocation)
    lifetimes.free(b)  # unused: freed at once
    with pytest.raises(FreedError) as caught:
        lifetimes.retain((a, b, c))
    assert caught.value.allocation is b
    assert (a.retained, b.retained, c.retained) == (0, 0, 0)


def test_a_run_of_requests_holding_one_tuple_is_released_as_one_count() -> None:
    # A plan's launches hold the same tuple: released in one call, whatever the runs, the
    # record goes once its last user is released, never before.
    freed: list[int] = []
    lifetimes = Lifetimes(DevicePool(_no_malloc, freed.append), _Pool())  # type: ignore[arg-type]
    a = Allocation(lifetimes, 0x100, 64, block=64)
    b = Allocation(lifetimes, 0x200, 64, block=64)
    lifetimes.track(a)
    lifetimes.track(b)
    plan, other = (a,), (a, b)
    holders = [_Holder(None, t) for t in (plan, plan, other, plan, plan, plan)]
    for holder in holders:
        lifetimes.retain(holder.buffers)
    lifetimes.free(a)
    lifetimes.free(b)
    lifetimes.release(holders[:5])
    assert freed == [0x200] and a.unused == 5 and b.unused == 1
    lifetimes.release(holders[5:])
    assert freed == [0x200, 0x100]
    assert all(holder.buffers == () for holder in holders)


# --- counters -----------------------------------------------------------------------------


def test_counters_sum_over_their_writers() -> None:
    submit, poll = Counters(), Counters()
    submit.launches, submit.batches, poll.wakeups, poll.timeouts = 5, 2, 3, 1
    assert total(submit, poll) == {
        "launches": 5,
        "copies": 0,
        "batches": 2,
        "wakeups": 3,
        "timeouts": 1,
        "sync_timeouts": 0,
    }


@pytest.mark.parametrize(
    ("slice_ms", "timed_out", "after"),
    [(50, True, 100), (800, True, 1000), (1000, True, 1000), (1000, False, 50), (50, False, 50)],
)
def test_block_mode_slices_grow_while_the_work_runs(
    slice_ms: int, timed_out: bool, after: int
) -> None:
    assert next_slice(slice_ms, timed_out) == after


def test_a_long_kernel_costs_block_mode_at_most_a_few_sync_timeouts_a_second() -> None:
    # 10 s of one unfinished kernel: the slices add up to 10 s in few steps.
    slices, elapsed, timeouts = [], 0, 0
    current = FIRST_SLICE_MS
    while elapsed < 10_000:
        slices.append(current)
        elapsed += current
        timeouts += 1
        current = next_slice(current, True)
    assert timeouts <= 5 + 10  # the ramp to MAX_SLICE_MS, then one a second
    assert max(slices) == MAX_SLICE_MS


# --- streams dropped without aclose() ----------------------------------------------------------


def test_a_dropped_lane_is_retired_once_nothing_of_it_is_in_flight() -> None:
    from aio_ascend._sched.dropped import DroppedLanes

    dropped = DroppedLanes(0)
    busy, idle = Lane(1, 8, 64), Lane(2, 8, 64)
    busy.admission.in_flight = 2
    closed, external = Lane(3, 8, 64), Lane(4, 8, 64, external=True)
    closed.closed = True  # closed by aclose() or by the device: not leaked
    for lane in (busy, idle, closed, external):
        dropped.drop(lane)
    with pytest.warns(ResourceWarning) as warned:
        due = dropped.due()
    assert len(warned) == 2  # busy and idle; someone else's stream holds nothing of ours
    assert due == [idle, external]
    assert busy.closed and idle.closed and external.closed  # no new work from here on
    assert dropped.retiring == [busy]
    assert dropped.due() == []  # still in flight: waits, warned once
    busy.admission.in_flight = 0
    assert dropped.due() == [busy]
    assert dropped.retiring == []


def test_retiring_dropped_lanes_destroys_theirs_and_keeps_a_failed_one() -> None:
    from aio_ascend._sched.dropped import DroppedLanes

    dropped = DroppedLanes(0)
    mine, refused, external = Lane(1, 8, 64), Lane(2, 8, 64), Lane(3, 8, 64, external=True)
    lanes = [mine, refused, external]
    destroyed: list[int] = []

    def destroy(lane: Lane) -> None:
        if lane.handle == 2:
            raise InvalidParamError("refused", code=107000)
        destroyed.append(lane.handle)

    for lane in lanes:
        dropped.drop(lane)
    with pytest.warns(ResourceWarning):
        dropped.retire(lanes, destroy)
    assert destroyed == [1]  # an external stream is never destroyed here
    assert lanes == [refused]  # left for the device's close to destroy


def test_a_retiring_lane_destroyed_meanwhile_is_not_retired_again() -> None:
    # A closed stream left retiring, then destroyed by a later forced close: retiring it
    # destroyed it a second time and raised in a loop callback (trio: TrioInternalError).
    from aio_ascend._sched.dropped import DroppedLanes

    dropped = DroppedLanes(0)
    gone, kept = Lane(1, 8, 64), Lane(2, 8, 64)
    gone.closed = kept.closed = True
    dropped.retire_when_done(gone)
    dropped.retire_when_done(kept)
    lanes = [kept]  # `gone` was taken out (and destroyed) by the forced close
    destroyed: list[int] = []
    dropped.retire(lanes, lambda lane: destroyed.append(lane.handle))
    assert destroyed == [2] and lanes == [] and dropped.retiring == []


# --- stall probes -------------------------------------------------------------------------


def test_a_stream_is_probed_once_its_oldest_batch_waited_then_less_and_less_often() -> None:
    lane = Lane(7, 10, 100)
    first, second = _batch(lane, 1e9), _batch(lane, 1e9)
    outstanding = {7: deque([first, second])}
    probes = StallProbes()
    assert probes.due(outstanding, 0.0) == []  # first seen: its clock starts
    assert probes.due(outstanding, STALL_PROBE_S / 2) == []
    assert probes.due(outstanding, STALL_PROBE_S) == [7]
    assert probes.due(outstanding, STALL_PROBE_S * 2) == []  # the next wait doubled
    assert probes.due(outstanding, STALL_PROBE_S * 3) == [7]
    at, probed = STALL_PROBE_S * 3, 0
    for _ in range(200):  # the wait grows to STALL_PROBE_MAX_S and stays there
        at += 0.01
        probed += len(probes.due(outstanding, at))
    assert probed <= 2 + 2.0 / STALL_PROBE_MAX_S
    outstanding[7].popleft()  # the head finished: the next batch's clock starts afresh
    assert probes.due(outstanding, at) == []
    assert probes.due(outstanding, at + STALL_PROBE_S) == [7]
    probes.forget([7])
    assert probes.due(outstanding, at + STALL_PROBE_S) == []  # forgotten: seen anew


# --- streams stranded by a forced close ---------------------------------------------------------


class _Events:
    """A runtime's ``query_event_status``: the handles in ``complete`` read complete."""

    def __init__(self, complete: set[int]) -> None:
        self.complete = complete

    def query_event_status(self, handle: int) -> int:
        complete = handle in self.complete
        return (
            ACL_EVENT_RECORDED_STATUS_COMPLETE if complete else ACL_EVENT_RECORDED_STATUS_NOT_READY
        )


def _recorded(handle: int) -> EventRecord:
    event = EventRecord(handle, 0)
    event.recorded = True
    return event


@pytest.mark.parametrize(
    ("complete", "stranded"),
    [
        (set(), [False, True, True, False]),  # (s0 was destroyed) s3 waits on nothing lost
        ({2}, [False, True, False, False]),  # s1's record ran after all: s2 goes on
    ],
)
def test_a_lost_record_strands_every_stream_down_its_chain_of_waits(
    complete: set[int], stranded: list[bool]
) -> None:
    """s0's record 1 was dropped: s1 waits on it and records 2, s2 waits on 2 and records 3
    and 4, s3 waits on 3 in a batch after one of its own that finished nothing yet. Every
    stream behind a lost record is stranded from its wait on, and its records are lost too;
    a record that reads complete is not, and nothing waits for it."""
    lanes = [Lane(h, 8, 100) for h in range(1, 5)]
    events = {h: _recorded(h) for h in (1, 2, 3, 4)}

    def batch(lane: Lane, *requests: Request) -> Batch:
        return Batch(lane, list(requests), event=0, deadline=10.0)

    s1 = [batch(lanes[1], WaitEvent(lanes[1], events[1]), RecordEvent(lanes[1], events[2]))]
    s2 = [
        batch(lanes[2], WaitEvent(lanes[2], events[2]), RecordEvent(lanes[2], events[3])),
        batch(lanes[2], RecordEvent(lanes[2], events[4])),
    ]
    s3 = [batch(lanes[3], RecordEvent(lanes[3], _recorded(9))), batch(lanes[3], _Req(lanes[3]))]
    deliveries = stranded_by({1}, [s1, s2, s3], _Events(complete))  # type: ignore[arg-type]
    assert [lane.stranded is not None for lane in lanes] == stranded
    failed = {id(req) for req, _, _ in deliveries}
    for queue, is_stranded in ((s1, stranded[1]), (s2, stranded[2]), (s3, stranded[3])):
        for b in queue:
            assert all((id(req) in failed) is is_stranded for req in b.requests)
            assert b.timed_out is is_stranded
    lost = {h for h, event in events.items() if event.error is not None}
    assert lost == ({2, 3, 4} if stranded[2] else set())  # (1 was marked by the caller)
    assert waits_on(s2[0]) is stranded[2]  # a wait filed later on a lost event: stranded then


def test_stranding_ends_on_a_cycle_of_waits() -> None:
    """Two streams waiting on each other's records behind a lost one: each record is marked
    lost once, so the propagation ends."""
    a, b = Lane(1, 8, 100), Lane(2, 8, 100)
    ea, eb = _recorded(10), _recorded(20)
    qa = [Batch(a, [WaitEvent(a, _recorded(1)), RecordEvent(a, ea)], 0, 10.0)]
    qb = [Batch(b, [WaitEvent(b, ea), WaitEvent(b, eb), RecordEvent(b, eb)], 0, 10.0)]
    deliveries = stranded_by({1}, [qa, qb], _Events(set()))  # type: ignore[arg-type]
    assert a.stranded is not None and b.stranded is not None
    assert len(deliveries) == 5
    assert ea.error is not None and eb.error is not None
