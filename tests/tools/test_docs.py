"""The documentation site: every page is in the nav and exists, the API reference is generated
from the code and covers every public name, the CLI page embeds each command's help, CI builds
it strictly; and (with the ``docs`` extra installed) the strict build itself."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import aio_ascend

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MKDOCS = (ROOT / "mkdocs.yml").read_text()


def _nav_pages() -> list[str]:
    nav = MKDOCS[MKDOCS.index("\nnav:") : MKDOCS.index("\ntheme:")]
    return re.findall(r"([\w./-]+\.md)\s*$", nav, re.M)


def test_every_page_is_in_the_nav_and_exists() -> None:
    pages = _nav_pages()
    assert len(pages) == len(set(pages))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert set(pages) == on_disk
    for required in ("architecture.md", "cli.md", "benchmarks.md", "reference/index.md"):
        assert required in pages


def test_the_guide_covers_the_concepts() -> None:
    guide = {p for p in _nav_pages() if p.startswith("guide/")}
    for concept in (
        "lifetimes",
        "batching",
        "backpressure",
        "cancellation",
        "faults",
        "one-await-or-two",
        "backends",
        "scaling-out",
        "serving",
    ):
        assert f"guide/{concept}.md" in guide


def _reference_names() -> list[str]:
    text = "\n".join(p.read_text() for p in sorted((DOCS / "reference").glob("*.md")))
    return re.findall(r"^::: ([\w.]+)", text, re.M)


def test_the_reference_is_generated_from_the_code_for_every_public_name() -> None:
    names = _reference_names()
    for name in names:  # each directive names something that exists
        module, _, attr = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), name
    documented = {name.removeprefix("aio_ascend.") for name in names}
    assert set(aio_ascend.__all__) <= documented
    # no hand-written member lists for the public classes: members come from the code
    assert not re.search(r"^\s+members:", (DOCS / "reference" / "stream.md").read_text(), re.M)
    assert not re.search(r"^\s+members:", (DOCS / "reference" / "device.md").read_text(), re.M)


def test_docstrings_are_read_as_they_are_written() -> None:
    assert re.search(r"^\s+docstring_style: sphinx$", MKDOCS, re.M)
    assert re.search(r"^strict: true$", MKDOCS, re.M)


def test_the_cli_page_embeds_each_commands_help() -> None:
    text = (DOCS / "cli.md").read_text()
    for command in ("", "info", "demo", "bench"):
        assert f"<!-- aio-ascend help: {command} -->".replace(":  ", ": ") in text


def test_ci_builds_the_docs_strictly() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip install .*-e \"\.\[[\w,]*docs[\w,]*\]\"", ci)
    build = next(line for line in ci.splitlines() if "mkdocs build" in line)
    assert "--strict" in build
    assert "-q" not in build.split() and "--quiet" not in build  # quiet hides the warnings
    assert "|| true" not in build


#: the width of a code block on the site (black's default; at Material's widest layout, with
#: both sidebars, a block shows about 84-88 characters before it scrolls)
CODE_WIDTH = 88


def _code_blocks(text: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_code_blocks_fit_the_page_width() -> None:
    # The snippets included from docs/images/ (the bench's own tables) are left out: they are
    # the command's output, verbatim.
    too_long = [
        f"{page.relative_to(DOCS)}: {len(line)}: {line.strip()[:60]}"
        for page in sorted(DOCS.rglob("*.md"))
        for block in _code_blocks(page.read_text())
        for line in block
        if len(line) > CODE_WIDTH and not line.startswith("--8<--")
    ]
    assert not too_long, "\n".join(too_long)


def _first_python_block(page: Path) -> str:
    code = re.search(r"```python\n(.*?)```", page.read_text(), re.S)
    assert code is not None, page
    return code.group(1)


@pytest.mark.parametrize("page", ["index.md", "getting-started.md"])
def test_first_examples_run_on_a_machine_with_cann(page: str, tmp_path: Path) -> None:
    # They use the sim's built-in kernels: with backend="auto" they would open a real CANN
    # install and fail there. AIO_ASCEND_BACKEND=acl stands for that machine (auto takes acl,
    # which is unavailable here, so only an explicit backend="sim" runs).
    script = tmp_path / "example.py"
    script.write_text(_first_python_block(DOCS / page))
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "AIO_ASCEND_BACKEND": "acl"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == ""


def test_cann_releases_are_reference_with_a_summary_on_top() -> None:
    nav = MKDOCS[MKDOCS.index("\nnav:") : MKDOCS.index("\ntheme:")]
    section = re.search(r'^  - "Reference: CANN releases":\n((?:      - .*\n)+)', nav, re.M)
    assert section is not None
    assert "cann-support.md" in section.group(1)
    text = (DOCS / "cann-support.md").read_text()
    summary = text[: text.index("## Research notes")]
    assert summary.startswith("# CANN releases\n")
    for path in ("host_args", "args_handle", "device_args"):
        assert f'"{path}"' in summary


def test_the_guide_says_what_each_cann_release_runs_on() -> None:
    text = (DOCS / "guide" / "backends.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 8.0 "))
    assert '"device_args"' in row
    assert "refused with `BackendUnavailableError`" not in row


def test_readme_links_the_docs_after_its_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block_end = readme.index("```", readme.index("```bash") + 3)
    docs_line = readme.index('pip install -e ".[docs]" && mkdocs serve')
    assert docs_line > first_block_end


def test_strict_build(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("material")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    cli_page = (tmp_path / "cli" / "index.html").read_text()
    assert "usage: aio-ascend bench" in cli_page  # the generated help
    stream_page = (tmp_path / "reference" / "stream" / "index.html").read_text()
    assert "copy_to_host" in stream_page  # members picked up from the code
    assert ":class:" not in stream_page  # roles rendered as code
    signatures = re.findall(r'<div class="doc-signature[^"]*">(.*?)</div>', stream_page, re.S)
    launch = next(s for s in signatures if '<span class="nf">launch</span>' in s)
    # wrapped by the formatter, one parameter a line, and its type names linked
    assert re.search(r"launch</span><span class=\"p\">\(</span>\n    ", launch)
    assert 'href="../memory/#aio_ascend.HostArgs"' in launch
    assert 'href="../modules/#aio_ascend.Function"' in launch
