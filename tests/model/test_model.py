"""Model-based test (issue 14): one device driven through random interleavings of user actions.

A hypothesis ``RuleBasedStateMachine`` drives ONE device, on the sim and on the acl C double,
on asyncio and trio (through a blocking portal, since hypothesis rules are synchronous), and
keeps a small reference model beside it:

- the expected bytes of every device buffer (``known`` mask; a buffer that failed work may
  still write later is ``tainted`` and never compared again);
- which tasks must succeed and which must fail, and with what (``TaskTimeoutError`` behind a
  hang or a sleep longer than ``task_timeout``; ``DeviceFaultError`` for everything after a
  fault, sticky until the device is closed and opened again);
- canaries: every ``copy_to_host`` destination is filled with a canary first; one whose task
  failed must keep it, now and later.

After every step: results equal the model's, failed tasks never wrote user memory, every task
resolved within its bound (liveness, >= 10x the expected time), and other streams kept flowing
while one was hung or busy. After a device close: no ``aio_ascend-*`` thread, nothing left in
the runtime (streams, events, host and device buffers).

Short in CI; ``AIO_ASCEND_STRESS=1`` runs the long version (also marked ``stress``).
Figures: ``[figures] model-<backend>-<loop>: examples=..., steps=...`` (run with ``-s``).
"""

from __future__ import annotations

import functools
import gc
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.from_thread
import numpy as np
import pytest
from helpers import assert_runtime_clean, open_backend
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import aio_ascend as aa

STRESS = bool(os.environ.get("AIO_ASCEND_STRESS"))

TASK_TIMEOUT = 0.3  # the watchdog of the device under test
LONG_SLEEP_US = 1_000_000  # over 3x TASK_TIMEOUT: its task must time out, even under load
BOUND = 10.0  # liveness: any single wait; >= 10x what it is expected to take
CANCELLED_SLEEP_US = 30_000  # the sleep whose waiter is cancelled after 5 ms
FLOW_BOUND = 2.0  # a noop round trip on a fresh stream while another is hung or busy
SMALL = 4096
BIG = 3 << 20  # "a few MiB": big copies are staged by the submitter thread
CANARY = 0xA5
MAX_STREAMS = 5
MAX_BUFFERS = 6

Outcome = type[BaseException] | None  # None: success
IDX = st.integers(0, 63)  # picks a stream or buffer of the model (modulo their count)


def _has_s(self: Any) -> bool:
    return self.dev is not None and bool(self.smodels)


def _has_b(self: Any) -> bool:
    return self.dev is not None and bool(self.bmodels)


def _has_sb(self: Any) -> bool:
    return _has_s(self) and bool(self.bmodels)


@dataclass
class SModel:
    stream: aa.Stream
    max_in_flight: int
    hung: bool = False
    busy_until: float = 0.0  # monotonic: until then, work on it may time out
    #: monotonic: when the work queued on it and left running (cancelled waits) may end
    queued_until: float = 0.0

    def usable(self) -> bool:
        # a hung stream keeps its slots taken forever: never wait for admission on it
        return not (self.hung and self.stream.in_flight >= self.max_in_flight - 1)


@dataclass
class BModel:
    buf: aa.DeviceBuffer
    nbytes: int
    data: np.ndarray[Any, Any] = field(init=False)
    known: np.ndarray[Any, Any] = field(init=False)
    tainted: bool = False  # failed work may still write it later: never compared again

    def __post_init__(self) -> None:
        self.data = np.zeros(self.nbytes, np.uint8)
        self.known = np.zeros(self.nbytes, bool)


@dataclass
class Pending:
    task: aa.Task
    allowed: set[Outcome]
    submitted: float
    bound: float
    what: str


@dataclass
class Figures:
    examples: int = 0
    steps: int = 0
    faults: int = 0
    hangs: int = 0
    timeouts: int = 0
    bad_inputs: int = 0
    reopens: int = 0
    checked_bytes: int = 0  # device bytes compared with the model
    max_wait_s: float = 0.0
    max_flow_s: float = 0.0


def _library_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aio_ascend-")]


def _floats(draw_seed: int, nbytes: int) -> np.ndarray[Any, Any]:
    """``nbytes`` of small integral float32 values (sums and axpy stay exact)."""
    rng = np.random.default_rng(draw_seed)
    return rng.integers(-1000, 1000, nbytes // 4).astype(np.float32).view(np.uint8)


class DeviceMachine(RuleBasedStateMachine):
    backend = "sim"
    loop = "asyncio"
    figures = Figures()

    def __init__(self) -> None:
        super().__init__()
        type(self).figures.examples += 1
        options: dict[str, Any] = {}
        self._portal_cm = anyio.from_thread.start_blocking_portal(
            backend=self.loop, backend_options=options
        )
        self.portal = self._portal_cm.__enter__()
        self.dev: aa.Device | None = None
        self.smodels: list[SModel] = []
        self.bmodels: list[BModel] = []
        self.pending: list[Pending] = []
        self.canaries: list[np.ndarray[Any, Any]] = []  # destinations of failed copies
        self.freed: list[aa.DeviceBuffer] = []
        self.faulted = False
        self.fault_pending = False  # a fault kernel timed out behind a sleep: it lands later
        self._open()

    # --- plumbing --------------------------------------------------------------------------

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return self.portal.call(fn, *args)

    def _open(self) -> None:
        async def open_() -> aa.Device:
            dev: aa.Device = await open_backend(self.backend, task_timeout=TASK_TIMEOUT)
            return dev

        self.dev = self.call(open_)
        self.faulted = False
        self.fault_pending = False
        # a starting set, so that the first steps already copy and launch
        for max_in_flight in (1024, 4):
            self.open_stream(max_in_flight)
        for big in (False, True):
            self.malloc(big)

    def allowed(self, sm: Any) -> set[Outcome]:
        if self.faulted:
            return {aa.DeviceFaultError}
        if sm.hung:
            return {aa.TaskTimeoutError}
        if time.monotonic() < sm.busy_until:
            return {None, aa.TaskTimeoutError}
        return {None}

    def check_outcome(self, what: str, exc: BaseException | None, allowed: set[Outcome]) -> None:
        """``exc`` is one of ``allowed`` (DeviceFaultError too once a fault is known)."""
        if self.faulted or self.fault_pending:
            allowed = allowed | {aa.DeviceFaultError}
        kind = None if exc is None else type(exc)
        ok = any(
            (kind is None and a is None)
            or (kind is not None and a is not None and issubclass(kind, a))
            for a in allowed
        )
        assert ok, f"{what}: got {exc!r}, the model allows {allowed}"
        if isinstance(exc, aa.TaskTimeoutError):
            type(self).figures.timeouts += 1
        if isinstance(exc, aa.DeviceFaultError):
            self.faulted = True

    def refused_in_call(self, what: str, exc: BaseException, allowed: set[Outcome]) -> None:
        """A call refused before it queued anything: ``DeviceFaultError`` once a fault is (or
        may be) known; ``TaskTimeoutError`` where its stream may have stalled (every slot held
        by work the watchdog failed: only where the model allows a timeout)."""
        if isinstance(exc, aa.TaskTimeoutError):
            assert aa.TaskTimeoutError in allowed and "every slot of its stream" in str(exc), (
                f"{what}: refused with {exc!r}, the model allows {allowed}"
            )
            return
        assert self.faulted or self.fault_pending, f"{what}: refused with {exc!r}"
        self.faulted = True

    async def _submit_and_wait(
        self, sm: Any, what: str, make: Callable[[], Awaitable[aa.Task]]
    ) -> BaseException | None:
        """Submit one request and await its task; the error (or None); checks the model."""
        allowed = self.allowed(sm)
        t0 = time.monotonic()
        with anyio.fail_after(BOUND):
            refused: BaseException | None = None
            try:
                task = await make()
            except (aa.DeviceFaultError, aa.TaskTimeoutError) as exc:  # refused in the call
                refused = exc
            if refused is not None:
                self.refused_in_call(what, refused, allowed)
                return refused
            try:
                await task
                exc = None
            except (aa.TaskTimeoutError, aa.DeviceFaultError, aa.RuntimeAPIError) as err:
                exc = err
        figs = type(self).figures
        figs.max_wait_s = max(figs.max_wait_s, time.monotonic() - t0)
        self.check_outcome(what, exc, allowed)
        return exc

    def _s(self, i: int) -> SModel:
        return self.smodels[i % len(self.smodels)]

    def _b(self, i: int) -> BModel:
        return self.bmodels[i % len(self.bmodels)]

    # --- streams ---------------------------------------------------------------------------

    @precondition(lambda self: self.dev is not None and len(self.smodels) < MAX_STREAMS)
    @rule(max_in_flight=st.sampled_from([1, 4, 1024]))
    def open_stream(self, max_in_flight: int) -> None:
        assert self.dev is not None
        if self.faulted:  # sticky: no new streams on a faulted device
            with pytest.raises(aa.DeviceFaultError):
                self.portal.call(self.dev.stream)
            return
        sm = SModel(
            self.portal.call(functools.partial(self.dev.stream, max_in_flight=max_in_flight)),
            max_in_flight,
        )
        self.smodels.append(sm)

    @precondition(_has_s)
    @rule(sm=IDX)
    def close_stream(self, sm: Any) -> None:
        sm = self._s(sm)
        self.smodels.remove(sm)
        faulted = self.faulted or self.fault_pending

        async def close() -> None:
            with anyio.fail_after(BOUND):
                await sm.stream.aclose()
            assert sm.stream.closed
            # a faulted device reports its fault first (either is a clear refusal)
            refusal = (aa.ClosedError, aa.DeviceFaultError) if faulted else aa.ClosedError
            with pytest.raises(refusal):
                await sm.stream.launch(self.dev.function("noop"), 1)  # type: ignore[union-attr]

        self.call(close)

    # --- buffers ---------------------------------------------------------------------------

    @precondition(lambda self: self.dev is not None and len(self.bmodels) < MAX_BUFFERS)
    @rule(big=st.booleans())
    def malloc(self, big: bool) -> None:
        assert self.dev is not None
        nbytes = BIG if big else SMALL

        async def malloc() -> aa.DeviceBuffer:
            return self.dev.malloc(nbytes)  # type: ignore[union-attr]

        bm = BModel(self.call(malloc), nbytes)
        self.bmodels.append(bm)
        healthy = [sm for sm in self.smodels if self.allowed(sm) == {None}]
        if healthy:  # give it known contents (so that later reads can be checked)
            self.copy_to_device(self.smodels.index(healthy[0]), len(self.bmodels) - 1, 1, nbytes)

    @precondition(_has_b)
    @rule(bm=IDX)
    def free_buffer(self, bm: Any) -> None:
        bm = self._b(bm)
        self.bmodels.remove(bm)

        async def free() -> None:
            bm.buf.free()

        self.call(free)
        self.freed.append(bm.buf)
        del self.freed[:-2]

    @precondition(_has_b)
    @rule(bm=IDX)
    def drop_buffer(self, bm: Any) -> None:
        bm = self._b(bm)
        self.bmodels.remove(bm)
        bm.buf = None  # type: ignore[assignment]
        del bm
        gc.collect()  # freed by the library at the next malloc or flush, with a warning

    # --- copies ----------------------------------------------------------------------------

    @precondition(_has_sb)
    @rule(sm=IDX, bm=IDX, frac=st.sampled_from([1, 2, 7]), seed=st.integers(0, 2**16))
    def copy_to_device(self, sm: Any, bm: Any, frac: int, seed: int) -> None:
        sm, bm = self._s(sm), self._b(bm)
        if not sm.usable():
            return
        n = max(4, (bm.nbytes // frac) // 4 * 4)
        src = _floats(seed, n)

        async def go() -> BaseException | None:
            return await self._submit_and_wait(
                sm, "copy_to_device", lambda: sm.stream.copy_to_device(bm.buf, src)
            )

        if self.call(go) is None:
            bm.data[:n] = src
            bm.known[:n] = True
        else:
            bm.tainted = True

    @precondition(_has_sb)
    @rule(sm=IDX, bm=IDX, frac=st.sampled_from([1, 3]))
    def copy_to_host(self, sm: Any, bm: Any, frac: int) -> None:
        sm, bm = self._s(sm), self._b(bm)
        if not sm.usable():
            return
        n = max(1, bm.nbytes // frac)
        dst = np.full(n, CANARY, np.uint8)

        async def go() -> BaseException | None:
            return await self._submit_and_wait(
                sm, "copy_to_host", lambda: sm.stream.copy_to_host(dst, bm.buf)
            )

        if self.call(go) is None:
            if not bm.tainted:
                known = bm.known[:n]
                bad = np.flatnonzero(dst[known] != bm.data[:n][known])
                type(self).figures.checked_bytes += int(known.sum())
                assert bad.size == 0, f"copy_to_host: {bad.size} bytes differ from the model"
        else:
            assert (dst == CANARY).all(), "a failed copy_to_host wrote the user's array"
            self.canaries.append(dst)

    @precondition(_has_sb)
    @rule(sm=IDX, bm=IDX, seed=st.integers(0, 2**16))
    def round_trip(self, sm: Any, bm: Any, seed: int) -> None:
        """copy_to_device then copy_to_host on one stream, pipelined: stream order holds."""
        sm, bm = self._s(sm), self._b(bm)
        if not sm.usable():
            return
        src = _floats(seed, bm.nbytes)
        dst = np.full(bm.nbytes, CANARY, np.uint8)
        allowed = self.allowed(sm)

        async def go() -> tuple[BaseException | None, BaseException | None]:
            results: list[BaseException | None] = []
            with anyio.fail_after(BOUND):
                try:
                    up = await sm.stream.copy_to_device(bm.buf, src)
                    down = await sm.stream.copy_to_host(dst, bm.buf)
                except (aa.DeviceFaultError, aa.TaskTimeoutError) as exc:
                    self.refused_in_call("round trip", exc, allowed)
                    return exc, exc
                for task in (up, down):
                    try:
                        await task
                        results.append(None)
                    except (aa.TaskTimeoutError, aa.DeviceFaultError) as exc:
                        results.append(exc)
            return results[0], results[1]

        up_exc, down_exc = self.call(go)
        self.check_outcome("round trip up", up_exc, allowed)
        self.check_outcome("round trip down", down_exc, allowed)
        if up_exc is None:
            bm.data[:] = src
            bm.known[:] = True
        else:
            bm.tainted = True
        if down_exc is None:
            if up_exc is None:
                np.testing.assert_array_equal(dst, src)
                type(self).figures.checked_bytes += dst.size
        else:
            assert (dst == CANARY).all(), "a failed copy_to_host wrote the user's array"
            self.canaries.append(dst)

    # --- kernels ---------------------------------------------------------------------------

    def _float_inputs_known(self, n: int, *bms: BModel) -> bool:
        return all(not bm.tainted and bm.known[: 4 * n].all() for bm in bms)

    @precondition(_has_sb)
    @rule(sm=IDX, x=IDX, y=IDX, z=IDX, blocks=st.integers(1, 8))
    def vector_add(self, sm: Any, x: Any, y: Any, z: Any, blocks: int) -> None:
        sm = self._s(sm)
        if not sm.usable():
            return
        x, y, z = self._b(x), self._b(y), self._b(z)
        n = min(x.nbytes, y.nbytes, z.nbytes) // 4
        known = self._float_inputs_known(n, x, y)
        expected = None
        if known:
            expected = x.data[: 4 * n].view(np.float32) + y.data[: 4 * n].view(np.float32)
        args = aa.HostArgs().ptr(x.buf).ptr(y.buf).ptr(z.buf).u32(n)

        async def go() -> BaseException | None:
            fn = self.dev.function("vector_add")  # type: ignore[union-attr]
            return await self._submit_and_wait(
                sm, "vector_add", lambda: sm.stream.launch(fn, blocks, args)
            )

        self._kernel_result(self.call(go), z, n, expected)

    @precondition(_has_sb)
    @rule(sm=IDX, x=IDX, y=IDX, a=st.integers(-3, 3), blocks=st.integers(1, 8))
    def axpy(self, sm: Any, x: Any, y: Any, a: int, blocks: int) -> None:
        sm = self._s(sm)
        if not sm.usable():
            return
        x, y = self._b(x), self._b(y)
        n = min(x.nbytes, y.nbytes) // 4
        expected = None
        if self._float_inputs_known(n, x, y):
            xs = x.data[: 4 * n].view(np.float32)
            ys = y.data[: 4 * n].view(np.float32)
            expected = np.float32(a) * xs + ys
        args = aa.HostArgs().ptr(x.buf).ptr(y.buf).f32(float(a)).u32(n)

        async def go() -> BaseException | None:
            fn = self.dev.function("axpy")  # type: ignore[union-attr]
            return await self._submit_and_wait(
                sm, "axpy", lambda: sm.stream.launch(fn, blocks, args)
            )

        self._kernel_result(self.call(go), y, n, expected)

    def _kernel_result(self, exc: BaseException | None, out: BModel, n: int, expected: Any) -> None:
        if exc is not None:
            out.tainted = True
        elif expected is None:
            out.known[: 4 * n] = False
        else:
            out.data[: 4 * n] = np.asarray(expected, np.float32).view(np.uint8)
            out.known[: 4 * n] = True

    @precondition(_has_s)
    @rule(sm=IDX, us=st.integers(100, 20_000))
    def short_sleep(self, sm: Any, us: int) -> None:
        sm = self._s(sm)
        if not sm.usable():
            return

        async def go() -> None:
            fn = self.dev.function("sleep")  # type: ignore[union-attr]
            await self._submit_and_wait(
                sm, "sleep", lambda: sm.stream.launch(fn, 1, aa.HostArgs().u32(us))
            )

        self.call(go)

    def _launch_pending(
        self, sm: Any, name: str, args: aa.HostArgs | None, allowed: set[Outcome]
    ) -> None:
        """Launch ``name`` and leave its task pending (checked by the invariant, bounded)."""
        if self.faulted:
            allowed = {aa.DeviceFaultError}
        before = self.allowed(sm)

        async def go() -> aa.Task | None:
            fn = self.dev.function(name)  # type: ignore[union-attr]
            with anyio.fail_after(BOUND):
                try:
                    return await sm.stream.launch(fn, 1, args)
                except (aa.DeviceFaultError, aa.TaskTimeoutError) as exc:
                    self.refused_in_call(name, exc, before)
                    return None

        task = self.call(go)
        if task is not None:
            self.pending.append(Pending(task, allowed, time.monotonic(), BOUND, name))

    @precondition(_has_s)
    @rule(sm=IDX)
    def long_sleep(self, sm: Any) -> None:
        """A sleep longer than task_timeout: TaskTimeoutError; the stream is busy meanwhile."""
        sm = self._s(sm)
        if not sm.usable():
            return
        self._launch_pending(sm, "sleep", aa.HostArgs().u32(LONG_SLEEP_US), {aa.TaskTimeoutError})
        # 2x margins: later work on it may or may not time out until the sleep is done (the
        # device runs such sleeps one after the other, though the watchdog failed them)
        sm.busy_until = max(sm.busy_until, time.monotonic()) + 2 * LONG_SLEEP_US / 1e6

    @precondition(_has_s)
    @rule(sm=IDX)
    def hang(self, sm: Any) -> None:
        sm = self._s(sm)
        if not sm.usable():
            return
        self._launch_pending(sm, "hang", None, {aa.TaskTimeoutError})
        sm.hung = True
        type(self).figures.hangs += 1

    @precondition(_has_s)
    @rule(sm=IDX)
    def fault(self, sm: Any) -> None:
        """A fault kernel: DeviceFaultError, sticky for the device until it is reopened."""
        sm = self._s(sm)
        if not sm.usable():
            return
        was_faulted = self.faulted or self.fault_pending
        busy = time.monotonic() < sm.busy_until
        before = self.allowed(sm)

        async def go() -> BaseException | None:
            fn = self.dev.function("fault")  # type: ignore[union-attr]
            with anyio.fail_after(BOUND):
                try:
                    task = await sm.stream.launch(fn, 1, aa.HostArgs().u32(507015))
                except aa.DeviceFaultError as exc:
                    if not was_faulted:
                        raise AssertionError("fault: refused on a healthy device") from exc
                    return exc
                except aa.TaskTimeoutError as exc:  # (a stalled stream: it never ran)
                    self.refused_in_call("fault", exc, before)
                    never_queued.append(exc)
                    return exc
                try:
                    await task
                except Exception as exc:  # checked below
                    return exc
            return None

        never_queued: list[BaseException] = []
        exc = self.call(go)
        if never_queued:
            return
        if sm.hung:  # never runs: its task times out, unless a fault elsewhere came first
            self.check_outcome("fault behind a hang", exc, {aa.TaskTimeoutError})
        elif busy and isinstance(exc, aa.TaskTimeoutError):
            self.fault_pending = True  # it still runs once the sleep before it is done
        else:
            assert isinstance(exc, aa.DeviceFaultError), f"fault kernel: got {exc!r}"
            if self.backend == "sim" and not was_faulted:  # acl's attribution: issue 15
                assert exc.__cause__ is None and exc.code == 507015, repr(exc)
            self.faulted = True
            type(self).figures.faults += 1

    # --- bad input: TypeError/ValueError in the call, nothing changes ----------------------

    @precondition(_has_sb)
    @rule(
        sm=IDX,
        bm=IDX,
        which=st.sampled_from(
            [
                "blocks0",
                "blocks_big",
                "blocks_neg",
                "blocks_str",
                "blocks_float",
                "blocks_bool",
                "fn_str",
                "args_bytes",
                "copy_too_big",
                "copy_empty",
                "copy_object",
                "dst_strided",
                "dst_readonly",
                "dst_object",
                "src_not_buffer",
                "freed_buffer",
                "timing_int",
                "wait_not_event",
            ]
        ),
    )
    def bad_input(self, sm: Any, bm: Any, which: str) -> None:
        sm, bm = self._s(sm), self._b(bm)
        dev = self.dev
        assert dev is not None
        s = sm.stream
        buf = bm.buf
        freed = self.freed[-1] if self.freed else None
        if which == "freed_buffer" and freed is None:
            return

        async def go() -> None:
            noop = dev.function("noop")
            before = dict(dev.stats())
            in_flight = s.in_flight
            calls: dict[str, Callable[[], Awaitable[Any]]] = {
                "blocks0": lambda: s.launch(noop, 0),
                "blocks_big": lambda: s.launch(noop, 65536),
                "blocks_neg": lambda: s.launch(noop, -1),
                "blocks_str": lambda: s.launch(noop, "3"),  # type: ignore[arg-type]
                "blocks_float": lambda: s.launch(noop, 1.5),  # type: ignore[arg-type]
                "blocks_bool": lambda: s.launch(noop, True),
                "fn_str": lambda: s.launch("noop", 1),  # type: ignore[arg-type]
                "args_bytes": lambda: s.launch(noop, 1, b"\0" * 8),  # type: ignore[arg-type]
                "copy_too_big": lambda: s.copy_to_device(buf, np.zeros(buf.nbytes + 1, np.uint8)),
                "copy_empty": lambda: s.copy_to_device(buf, np.zeros(0, np.uint8)),
                "copy_object": lambda: s.copy_to_device(buf, np.array([1, "x"], dtype=object)),
                "dst_strided": lambda: s.copy_to_host(np.zeros((8, 2), np.uint8)[:, 0], buf),
                "dst_readonly": lambda: s.copy_to_host(_readonly(16), buf),
                "dst_object": lambda: s.copy_to_host(np.empty(2, dtype=object), buf),
                "src_not_buffer": lambda: s.copy_to_host(np.zeros(8, np.uint8), 1234),  # type: ignore[arg-type]
                "freed_buffer": lambda: s.launch(noop, 1, aa.HostArgs().ptr(freed)),
                "timing_int": lambda: s.record_event(timing=1),  # type: ignore[arg-type]
                "wait_not_event": lambda: s.wait_event(object()),  # type: ignore[arg-type]
            }
            with anyio.fail_after(BOUND):
                with pytest.raises((TypeError, ValueError)):
                    await calls[which]()
            after = dict(dev.stats())
            assert s.in_flight == in_flight, f"{which}: in_flight {in_flight} -> {s.in_flight}"
            for key in ("in_flight", "streams", "device_buffers"):
                assert after[key] == before[key], f"{which}: {key} {before[key]} -> {after[key]}"

        self.call(go)
        type(self).figures.bad_inputs += 1

    # --- events ----------------------------------------------------------------------------

    @precondition(_has_s)
    @rule(a=IDX, b=IDX)
    def event_between(self, a: Any, b: Any) -> None:
        """Record on ``a``, wait on ``b``: ``b`` now also waits for what ``a`` waits for."""
        a, b = self._s(a), self._s(b)
        if not (a.usable() and b.usable()):
            return
        allowed_a = self.allowed(a)
        allowed_b = allowed_a | self.allowed(b)
        if None not in allowed_a:
            allowed_b.discard(None)

        async def go() -> None:
            with anyio.fail_after(BOUND):
                try:
                    ev = await a.stream.record_event()
                except (aa.DeviceFaultError, aa.TaskTimeoutError) as exc:
                    self.refused_in_call("record_event", exc, allowed_a)
                    return
                try:
                    wait: aa.Task | None = await b.stream.wait_event(ev)
                except (aa.DeviceFaultError, aa.TaskTimeoutError) as exc:
                    self.refused_in_call("wait_event", exc, self.allowed(b))
                    wait = None
                try:
                    await ev
                    exc = None
                except (aa.TaskTimeoutError, aa.DeviceFaultError) as err:
                    exc = err
                self.check_outcome("event", exc, allowed_a)
                if wait is not None:
                    try:
                        await wait
                        exc = None
                    except (aa.TaskTimeoutError, aa.DeviceFaultError) as err:
                        exc = err
                    self.check_outcome("wait_event", exc, allowed_b)

        self.call(go)
        b.hung = b.hung or a.hung
        b.busy_until = max(b.busy_until, a.busy_until)

    # --- cancellation ----------------------------------------------------------------------

    @precondition(_has_s)
    @rule(sm=IDX)
    def cancel_a_waiter(self, sm: Any) -> None:
        """Cancelling ``await task`` stops that waiter only: the task still completes."""
        sm = self._s(sm)
        if not sm.usable():
            return
        allowed = self.allowed(sm)

        # The sleep runs on when its waiter is cancelled: a run of such steps queues their
        # sleeps one behind the other, and the watchdog counts from admission. Once what is
        # queued may take half of task_timeout (each sleep counted 2x: a loaded machine),
        # work on the stream may time out.
        now = time.monotonic()
        sm.queued_until = max(sm.queued_until, now) + 2 * CANCELLED_SLEEP_US / 1e6
        if sm.queued_until - now > TASK_TIMEOUT / 2:
            sm.busy_until = max(sm.busy_until, sm.queued_until)
            allowed = allowed | {aa.TaskTimeoutError}

        async def go() -> None:
            fn = self.dev.function("sleep")  # type: ignore[union-attr]
            try:
                task = await sm.stream.launch(fn, 1, aa.HostArgs().u32(CANCELLED_SLEEP_US))
            except (aa.DeviceFaultError, aa.TaskTimeoutError) as exc:
                self.refused_in_call("sleep", exc, allowed)
                return
            with anyio.move_on_after(0.005) as scope:
                await task
            if scope.cancelled_caught:
                self.pending.append(Pending(task, allowed, time.monotonic(), BOUND, "cancelled"))
            else:  # it finished within 5 ms: a failure
                assert task.done()
                self.check_outcome("sleep", task.exception(), allowed)

        self.call(go)

    @precondition(lambda self: self.dev is not None and not (self.faulted or self.fault_pending))
    @rule()
    def cancel_admission(self) -> None:
        """A caller waiting for admission that is cancelled never launches."""
        dev = self.dev
        assert dev is not None

        async def go() -> None:
            s = dev.stream(max_in_flight=1)
            sleep = await s.launch(dev.function("sleep"), 1, aa.HostArgs().u32(50_000))
            with anyio.move_on_after(0.01) as scope:
                await s.launch(dev.function("noop"), 1)
            if not self.faulted:
                assert scope.cancelled_caught, "admission did not wait behind max_in_flight=1"
                # only the sleep may be in flight (a loaded machine may even have finished it)
                expected = 0 if sleep.done() else 1
                assert s.in_flight == expected, (
                    f"a cancelled admission left in_flight={s.in_flight}"
                )
            with anyio.fail_after(BOUND):
                try:
                    await sleep
                    await (await s.launch(dev.function("noop"), 1))
                except aa.DeviceFaultError:
                    assert self.fault_pending
                    self.faulted = True
                await s.aclose()

        self.call(go)

    # --- shapes that broke promises between streams and at shutdown ------------------------

    @precondition(lambda self: self.dev is not None and len(self.smodels) >= 2)
    @rule(a=IDX, b=IDX, seed=st.integers(0, 2**16))
    def big_copies_on_two_streams(self, a: Any, b: Any, seed: int) -> None:
        """Big uploads and downloads on two streams at once (staged aside, in stream order,
        data intact) while a third stream's launch keeps flowing."""
        sa, sb = self._s(a), self._s(b)
        if sa is sb:
            sb = self.smodels[(self.smodels.index(sa) + 1) % len(self.smodels)]
        if not (sa.usable() and sb.usable()):
            return
        dev = self.dev
        assert dev is not None
        flow: list[float] = []

        async def one(sm: SModel, src: np.ndarray[Any, Any]) -> None:
            buf = dev.malloc(src.nbytes)
            try:
                exc = await self._submit_and_wait(
                    sm, "big upload", lambda: sm.stream.copy_to_device(buf, src)
                )
                if exc is not None:
                    return
                out = np.full(src.nbytes, CANARY, np.uint8)
                exc = await self._submit_and_wait(
                    sm, "big download", lambda: sm.stream.copy_to_host(out, buf)
                )
                if exc is None:
                    assert (out == src).all(), "a big round trip changed the data"
                else:
                    self.canaries.append(out)
            finally:
                buf.free()  # deferred while its copies are queued

        async def go() -> None:
            with anyio.fail_after(BOUND * 2):
                await both()

        async def both() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, sa, _floats(seed, BIG))
                tg.start_soon(one, sb, _floats(seed + 1, BIG))
                if not (self.faulted or self.fault_pending):
                    flow.append(await self._round_trip_elsewhere("beside big copies"))

        self.call(go)
        figs = type(self).figures
        figs.max_flow_s = max([figs.max_flow_s, *flow])

    @precondition(_has_s)
    @rule(sm=IDX)
    def drop_stream(self, sm: Any) -> None:
        """A stream dropped without aclose(): its queued work still resolves (the pending
        list holds its tasks), and an idle one is destroyed once collected."""
        sm = self._s(sm)
        self.smodels.remove(sm)
        dev = self.dev
        assert dev is not None
        idle = not (sm.hung or time.monotonic() < sm.busy_until) and sm.stream.in_flight == 0
        healthy = not (self.faulted or self.fault_pending)

        async def go() -> None:
            nonlocal sm
            before = dev.stats()["streams"]
            sm = None
            gc.collect()
            if not (idle and healthy):
                return
            with anyio.fail_after(BOUND):  # retired on a later loop turn
                while dev.stats()["streams"] != before - 1:  # noqa: ASYNC110 - a counter
                    await anyio.sleep(0.005)

        self.call(go)

    @precondition(lambda self: self.dev is not None and not (self.faulted or self.fault_pending))
    @rule(wait_device=st.booleans())
    def synchronize_racing_a_forced_close(self, wait_device: bool) -> None:
        """synchronize() waiting while a forced close fails the work never reports success."""
        dev = self.dev
        assert dev is not None
        outcomes: dict[str, BaseException | None] = {}

        async def go() -> None:
            s = dev.stream()
            await s.launch(dev.function("hang"), 1)

            async def wait(name: str, sync: Callable[[], Awaitable[None]]) -> None:
                try:
                    await sync()
                    outcomes[name] = None
                except Exception as exc:
                    outcomes[name] = exc

            with anyio.fail_after(BOUND):
                await self._race_close(wait, s, wait_device)

        self.call(go)
        type(self).figures.hangs += 1
        for name, exc in outcomes.items():
            assert exc is not None, f"{name} synchronize() reported success for killed work"
        self._close_device()  # already closed: the checks after a close

    async def _race_close(self, wait: Any, s: aa.Stream, wait_device: bool) -> None:
        dev = self.dev
        assert dev is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, "stream", s.synchronize)
            if wait_device:
                tg.start_soon(wait, "device", dev.synchronize)
            await anyio.sleep(0.01)
            await dev.aclose(cancel=True, timeout=0.05)

    @precondition(_has_s)
    @rule(sm=IDX, waiters=st.sampled_from([300, 2000]))
    def many_waiters_on_one_task(self, sm: Any, waiters: int) -> None:
        """Many coroutines awaiting one task all resume, with the same outcome, in bound."""
        sm = self._s(sm)
        if not sm.usable():
            return
        allowed = self.allowed(sm)
        dev = self.dev
        assert dev is not None

        async def go() -> None:
            try:
                task = await sm.stream.launch(dev.function("sleep"), 1, aa.HostArgs().u32(2_000))
            except (aa.DeviceFaultError, aa.TaskTimeoutError) as exc:
                self.refused_in_call("sleep (many waiters)", exc, allowed)
                return
            seen: list[BaseException | None] = []

            async def waiter() -> None:
                try:
                    await task
                    seen.append(None)
                except (aa.TaskTimeoutError, aa.DeviceFaultError) as exc:
                    seen.append(exc)

            with anyio.fail_after(BOUND):
                async with anyio.create_task_group() as tg:
                    for _ in range(waiters):
                        tg.start_soon(waiter)
            assert len(seen) == waiters
            kinds = {type(exc) for exc in seen}
            assert len(kinds) == 1, f"waiters on one task saw different outcomes: {kinds}"
            self.check_outcome("sleep (many waiters)", seen[0], allowed)

        self.call(go)

    # --- the device ------------------------------------------------------------------------

    @precondition(lambda self: self.dev is not None)
    @rule(
        cancel=st.booleans(),
        timeout=st.sampled_from([None, 1.0]),
        reopen=st.booleans(),
    )
    def close_device(self, cancel: bool, timeout: float | None, reopen: bool) -> None:
        self._close_device(cancel=cancel, timeout=timeout)
        if reopen:
            self._open()
            type(self).figures.reopens += 1

    @precondition(lambda self: self.dev is None)
    @rule()
    def reopen_device(self) -> None:
        self._open()
        type(self).figures.reopens += 1

    def _close_device(self, *, cancel: bool = False, timeout: float | None = None) -> None:
        dev = self.dev
        assert dev is not None
        self.dev = None

        async def close() -> None:
            with anyio.fail_after(BOUND + TASK_TIMEOUT):
                await dev.aclose(cancel=cancel, timeout=timeout)

        t0 = time.monotonic()
        self.call(close)
        elapsed = time.monotonic() - t0
        type(self).figures.max_wait_s = max(type(self).figures.max_wait_s, elapsed)
        # everything resolved; what failed kept its canary
        for p in self.pending:
            assert p.task.done(), f"{p.what}: unresolved after aclose()"
            exc = p.task.exception()
            allowed = p.allowed | {aa.ClosedError, aa.TaskTimeoutError}
            self.check_outcome(f"{p.what} (closed)", exc, allowed)
        self.pending.clear()
        self._check_canaries()
        self.canaries.clear()
        deadline = time.monotonic() + 2.0
        while _library_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _library_threads(), f"threads left after aclose(): {_library_threads()}"
        assert_runtime_clean(dev)
        assert dev.stats()["device_buffers"] == 0, dev.stats()
        # the model's objects are dead now
        self.smodels.clear()
        self.bmodels.clear()
        self.freed.clear()
        self.faulted = False

    # --- invariants ------------------------------------------------------------------------

    def _check_canaries(self) -> None:
        for dst in self.canaries:
            assert (dst == CANARY).all(), "a failed copy_to_host wrote the user's array later"

    @invariant()
    def model_holds(self) -> None:
        type(self).figures.steps += 1
        self._check_canaries()
        now = time.monotonic()
        still = []
        for p in self.pending:
            if p.task.done():
                self.check_outcome(p.what, p.task.exception(), p.allowed)
            else:
                assert now - p.submitted < p.bound, (
                    f"{p.what}: not resolved {now - p.submitted:.1f} s after submission"
                )
                still.append(p)
        self.pending = still
        if self.dev is None or self.faulted or self.fault_pending:
            return
        blocked = any(sm.hung or now < sm.busy_until for sm in self.smodels)
        if blocked:
            self._other_streams_flow()

    async def _round_trip_elsewhere(self, beside: str) -> float:
        """A noop round trip on a fresh stream (within FLOW_BOUND); its time."""
        dev = self.dev
        assert dev is not None
        s = dev.stream()
        t0 = time.monotonic()
        with anyio.fail_after(FLOW_BOUND):
            try:
                await (await s.launch(dev.function("noop"), 1))
            except aa.DeviceFaultError:
                assert self.fault_pending, f"a healthy stream failed {beside}"
                self.faulted = True
        elapsed = time.monotonic() - t0
        with anyio.fail_after(BOUND):
            await s.aclose()
        return elapsed

    def _other_streams_flow(self) -> None:
        elapsed = self.call(self._round_trip_elsewhere, "while another was hung")
        figs = type(self).figures
        figs.max_flow_s = max(figs.max_flow_s, elapsed)

    def teardown(self) -> None:
        try:
            if self.dev is not None:
                self._close_device(cancel=True, timeout=1.0)
        finally:
            self._portal_cm.__exit__(None, None, None)


def _readonly(n: int) -> np.ndarray[Any, Any]:
    a = np.zeros(n, np.uint8)
    a.flags.writeable = False
    return a


def _run(backend: str, loop: str, examples: int, steps: int) -> None:
    machine: Any = type(
        f"DeviceMachine_{backend}_{loop}",
        (DeviceMachine,),
        {"backend": backend, "loop": loop, "figures": Figures()},
    )
    t0 = time.monotonic()
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,  # liveness is checked by the machine (fail_after, bounds)
            derandomize=not STRESS,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    figs = machine.figures
    print(
        f"\n[figures] model-{backend}-{loop}: examples={figs.examples} steps={figs.steps} "
        f"faults={figs.faults} hangs={figs.hangs} timeouts={figs.timeouts} "
        f"bad_inputs={figs.bad_inputs} reopens={figs.reopens} checked_bytes={figs.checked_bytes} "
        f"max_wait={figs.max_wait_s:.3f}s max_flow_round_trip={figs.max_flow_s * 1e3:.1f}ms "
        f"wall={time.monotonic() - t0:.1f}s"
    )


COMBINATIONS = [
    pytest.param(backend, loop, id=f"{backend}-{loop}")
    for backend in ("sim", "acl")
    for loop in ("asyncio", "trio")
]


@pytest.mark.model
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("backend", "loop"), COMBINATIONS)
def test_one_device_against_the_model(backend: str, loop: str) -> None:
    _run(backend, loop, examples=15, steps=25)


@pytest.mark.model
@pytest.mark.stress
@pytest.mark.timeout(3600)
@pytest.mark.skipif(not STRESS, reason="set AIO_ASCEND_STRESS=1 for the long run")
@pytest.mark.parametrize(("backend", "loop"), COMBINATIONS)
def test_one_device_against_the_model_long(backend: str, loop: str) -> None:
    _run(backend, loop, examples=200, steps=50)
