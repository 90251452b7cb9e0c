"""A three-stage, multi-stream pipeline: copy in / compute / copy out, overlapped.

Runs on the embedded simulator (``sim``)::

    python examples/pipeline.py                        # 2000 requests
    python examples/pipeline.py --requests 200 --streams 2 --loop trio

Each request copies two vectors to the device on one stream, computes ``z = f * (a*x + y)``
(``axpy`` then ``scale``) on a second, and copies ``z`` back on a third. The stages are chained
on the device with events (``record_event`` / ``wait_event``), so the host never waits between
them, and many requests are in flight at once. Every result is checked against numpy.

The core of one request (see ``aio_ascend/_demo.py`` for the whole thing, which also backs
``aio-ascend demo``)::

    await s_in.copy_to_device(dx, x); await s_in.copy_to_device(dy, y)
    ev_in = await s_in.record_event()

    await s_c.wait_event(ev_in)
    await s_c.launch(axpy, 8, HostArgs().ptr(dx).ptr(dy).f32(a).u32(n))
    await s_c.launch(scale, 8, HostArgs().ptr(dy).ptr(dz).placeholder(pack("<If", n, f)))
    ev_c = await s_c.record_event()

    await s_out.wait_event(ev_c)
    await (await s_out.copy_to_host(out, dz))
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from aio_ascend._tools.demo import DemoConfig, format_demo, run_demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="copy/compute/copy pipeline on the sim backend")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=1, help="streams per stage")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--size", type=int, default=16_384, help="float32 elements per vector")
    parser.add_argument("--loop", choices=["asyncio", "uvloop", "trio"], default="asyncio")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    cfg = DemoConfig(
        requests=args.requests,
        streams=args.streams,
        concurrency=args.concurrency,
        n=args.size,
        loop=args.loop,
        progress=None if args.quiet else sys.stderr,
    )
    try:
        cfg.validate()
    except ValueError as exc:
        parser.error(str(exc))
    result = run_demo(cfg)
    print(format_demo(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
