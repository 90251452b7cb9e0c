"""``python -m aio_ascend``: the ``aio-ascend`` command line."""

from ._tools.cli import main

raise SystemExit(main())
