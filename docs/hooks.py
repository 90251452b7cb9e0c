"""mkdocs hooks (``hooks:`` in mkdocs.yml): generated parts of the pages.

1. ``<!-- aio-ascend help: COMMAND -->`` in a page becomes the command's ``--help`` text, read
   from the parser itself (:func:`on_page_markdown`), so the command-line page cannot drift
   from the command.
2. The docstrings are reST-flavoured (``:param x:`` fields, parsed by mkdocstrings'
   ``sphinx`` style) and name other objects with roles: ``:class:`Task```. Markdown has no
   roles, so :func:`on_page_content` renders each as the plain code span it wraps (and
   drops the second colon of reST's ``Example::`` before a code block).
3. The site builds with ``--strict``: every warning fails it. A docstring warning listed in
   :data:`KNOWN` is about code the docs do not own (the public facades are changed on another
   branch); it is logged as INFO, marked, instead of failing the build. Fix the docstring,
   then delete its entry here. Nothing else is let through.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

#: (file, text the warning contains): fix the docstring, then remove the entry
KNOWN: tuple[tuple[str, str], ...] = ()

#: a reST role around a code span, as Markdown renders it: ``:class:<code>Task</code>``
_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj|const):<code>~?")


#: ``<!-- aio-ascend help: bench -->`` (``aio-ascend`` alone: the top-level help)
_HELP = re.compile(r"<!-- aio-ascend help:\s*([a-z]*)\s*-->")


def _help_text(command: str) -> str:
    from aio_ascend._tools.cli import build_parser, subcommands

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "96"  # argparse wraps to the terminal; pages get a fixed width
    try:
        parser = build_parser()
        if command:
            parser = subcommands(parser)[command]
        return parser.format_help().rstrip()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Put each ``<!-- aio-ascend help: COMMAND -->`` marker's help text in its place."""
    return _HELP.sub(lambda m: f"```text\n{_help_text(m.group(1))}\n```", markdown)


#: reST's ``text::`` before a literal block (Markdown renders the block, keeps the ``::``)
_LITERAL = re.compile(r'::</p>(\s*<div class="highlight">)')


def on_page_content(html: str, **kwargs: Any) -> str:
    """``:class:`Task``` in a docstring reads as ``Task`` (a code span), and reST's
    ``Example::`` before a code block as ``Example:``."""
    return _LITERAL.sub(r":</p>\1", _ROLE.sub("<code>", html))


class _KnownDocstringWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING:
            message = record.getMessage()
            if any(path in message and text in message for path, text in KNOWN):
                record.levelno, record.levelname = logging.INFO, "INFO"
                record.msg, record.args = f"(known, see docs/hooks.py) {message}", ()
        return True


logging.getLogger("mkdocs.plugins.griffe").addFilter(_KnownDocstringWarnings())
