"""``python -m aio_ascend``: the ``aio-ascend`` command line."""

from .cli import main

raise SystemExit(main())
