"""The submitter thread's CPU per launch on the acl backend over its C test double: hops of
256 plain launches (one batch each) handed to ``Submitter`` directly, with the native batch
submit and launching one by one (a ctypes call each), the two interleaved round by round so
that a noisy machine drifts both alike; and the native call alone (its floor: the double's own
work in C, and the task id read after each launch). Thread CPU, not process CPU: the double's
device thread is left out.

    python benchmarks/acl_submit.py [--rounds 5] [--hops 100]

Run from a checkout (it builds the double from ``tests/doubles/``, and the extension from
``aio_ascend/_runtime/acl/_native.c`` when it is not installed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from doubles.acl_double import build_double, native_extension

from aio_ascend._host.pool import HostBuffer
from aio_ascend._runtime.abi import ACL_EVENT_CAPTURE_STREAM_PROGRESS
from aio_ascend._runtime.acl import batch
from aio_ascend._runtime.acl.runtime import AclRuntime, open_acl_runtime
from aio_ascend._sched.batching import Hop
from aio_ascend._sched.events import BatchEvents
from aio_ascend._sched.faults import FaultState
from aio_ascend._sched.lane import Lane
from aio_ascend._sched.submitter import Submitter
from aio_ascend._sched.work import Batch, Launch

PER_HOP = 256


class _Kept:
    def release(self, requests: Any) -> None:
        pass


def _measure(rt: AclRuntime, mode: str, hops: int) -> float:
    built = build_double()
    stream = rt.create_stream()
    func = rt.get_function(rt.load_binary(built.builtins), "noop")
    image = rt.malloc_host(64)
    event = rt.create_event(ACL_EVENT_CAPTURE_STREAM_PROGRESS)
    events = BatchEvents(rt)
    batches: list[Batch | Any] = []
    submitter = Submitter(
        runtime=rt,
        device_id=0,
        faults=FaultState(),
        lifetimes=_Kept(),  # type: ignore[arg-type]
        batch_events=events,
        post=lambda deliveries, counters: None,
        stage=None,  # type: ignore[arg-type]
        to_poller=batches.append,
        task_timeout=60.0,
    )
    lane = Lane(stream, 1 << 20, 1 << 22)
    host = HostBuffer(0, image, image, 64, memoryview(bytearray(64)))
    spent = 0.0
    for _ in range(hops):
        requests = [
            Launch(lane, None, host, (), func, 1, None, 8, 8, 0)  # type: ignore[arg-type]
            for _ in range(PER_HOP)
        ]
        requests[-1].closes_batch = True
        hop = Hop(list(requests), time.monotonic() + 60)
        t0 = time.thread_time()
        if mode == "native call alone":
            assert rt.launch_batch is not None
            rt.launch_batch(requests)
        else:
            submitter._hop(hop)
        spent += time.thread_time() - t0
        rt.record_event(event, stream)
        rt.synchronize_event(event, -1)
        for done in batches:
            events.give_back(done.event)
        batches.clear()
    for handle in events.created:
        rt.destroy_event(handle)
    rt.destroy_event(event)
    rt.destroy_stream(stream)
    return spent / (hops * PER_HOP) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hops", type=int, default=100)
    args = parser.parse_args()
    native = native_extension()
    library = build_double().library
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for mode in ("native batch submit", "one by one (ctypes)", "native call alone"):
            with batch.native_disabled() if mode.startswith("one") else _installed(native):
                rt = open_acl_runtime(0, library_path=library)
            try:
                results.setdefault(mode, []).append(_measure(rt, mode, args.hops))
            finally:
                rt.close()
    print(f"submitter thread CPU per launch, {PER_HOP}-launch hops, median of {args.rounds}:")
    for mode, values in results.items():
        spread = f"{min(values):.2f}-{max(values):.2f}"
        print(f"  {mode:<22} {statistics.median(values):6.2f} us  ({spread})")


class _installed:
    """The extension used by runtimes opened meanwhile (built for this run if not installed)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __enter__(self) -> None:
        self.saved = batch._NATIVE
        batch._NATIVE = self.module

    def __exit__(self, *exc: object) -> None:
        batch._NATIVE = self.saved


if __name__ == "__main__":
    main()
