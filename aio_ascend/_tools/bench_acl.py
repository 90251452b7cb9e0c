"""The bench's rows on the ``acl`` backend over the C test double (``tests/doubles/acl_double.c``).

In a source checkout the bench builds the double with the system C compiler, as the tests do
(``tests/doubles/acl_double.py``, which takes its flags from here), and runs the bench's own
measurements on it: (a) the raw runtime loop (each launch a ctypes call) and (c) the scheduler,
with the native batch submit where it is built (``aio_ascend/_runtime/acl/batch.py``), and
without it for comparison. The double is a CPU model: its own work (a call log, a device thread)
is in both rows. Without the source or a compiler, the rows say why they were skipped.

With ``AIO_ASCEND_REALRT_LIB`` set to the library folder ``tests/realrt/build.sh`` prints (the
real CANN runtime built from its source, over our fake driver), the same (a) and (c) run on it
too (``realrt_raw``, ``realrt_poll``), beside the double's: the runtime's own per-launch work
(task objects, queues, the driver's SQE copies) is in both of those rows.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Final

from .._runtime.acl.batch import native_disabled, native_submit
from .._runtime.acl.library import HOME_ENV_VARS
from .._runtime.acl.runtime import ENV_BUILTINS
from .stats import cpu_ratio

__all__ = [
    "ACL_STEPS",
    "REALRT_ENV",
    "BUILTINS_MAGIC",
    "DOUBLE_CFLAGS",
    "DOUBLE_KERNELS",
    "DOUBLE_SOURCE",
    "acl_ratios",
    "acl_rows",
    "acl_steps",
    "on_acl_double",
]

#: the double's source in a checkout (absent from an installed wheel)
DOUBLE_SOURCE: Final = Path(__file__).resolve().parents[2] / "tests" / "doubles" / "acl_double.c"
#: how the double is compiled (the tests use the same flags)
DOUBLE_CFLAGS: Final = ["-shared", "-fPIC", "-O2", "-pthread", "-std=gnu11", "-Wall", "-Wextra"]
#: the first bytes of the file the double loads as its built-in kernels, then their names
BUILTINS_MAGIC: Final = b"AIO_ASCEND_ACL_DOUBLE_BUILTINS"
DOUBLE_KERNELS: Final = b"vector_add axpy scale matmul sleep fault hang noop"
#: the steps' keys: (a), (c) with the native submit where built, (c) launching one by one;
#: (a) and (c) on the real runtime over our driver
ACL_STEPS: Final = ("acl_raw", "acl_poll", "acl_poll_ctypes", "realrt_raw", "realrt_poll")
#: the library folder of the real runtime built by tests/realrt/build.sh (its last line)
REALRT_ENV: Final = "AIO_ASCEND_REALRT_LIB"
_KERNEL_MAKER: Final = DOUBLE_SOURCE.parents[1] / "realrt" / "make_kernel_elf.py"

_built: list[tuple[Path, Path] | str] = []  # once per process: (home, builtins) or why not


def _compiler() -> str | None:
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _scratch(prefix: str) -> Path:
    # A folder for what the bench builds, removed when the process exits (the runtime keeps
    # the library loaded from it until then)
    home = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, home, True)
    return home


def _build() -> tuple[Path, Path] | str:
    if _built:
        return _built[0]
    compiler = _compiler()
    if not DOUBLE_SOURCE.exists():
        why: tuple[Path, Path] | str = (
            f"no acl test double source ({DOUBLE_SOURCE}): not a checkout"
        )
    elif compiler is None:
        why = "no C compiler (cc/gcc/clang) to build the acl test double"
    else:
        home = _scratch("aio_ascend_bench_acl_")
        (home / "lib64").mkdir()
        library = home / "lib64" / "libascendcl.so"
        command = [compiler, *DOUBLE_CFLAGS, "-o", str(library), str(DOUBLE_SOURCE)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            shutil.rmtree(home, ignore_errors=True)
            why = f"building the acl test double failed: {result.stderr.strip()[-300:]}"
        else:
            builtins = home / "builtins.o"
            builtins.write_bytes(BUILTINS_MAGIC + b"\n" + DOUBLE_KERNELS)
            why = (home, builtins)
    _built.append(why)
    return why


def _realrt() -> tuple[Path, Path] | str:
    # An install folder whose lib64/libascendcl.so is the real runtime's libacl_rt.so (every
    # file of the build linked beside it: its rpath is $ORIGIN), and the kernel object; once
    # per process.
    if not _realrt_built:
        _realrt_built.append(_realrt_install())
    return _realrt_built[0]


_realrt_built: list[tuple[Path, Path] | str] = []


def _realrt_install() -> tuple[Path, Path] | str:
    folder = os.environ.get(REALRT_ENV)
    if not folder:
        return f"{REALRT_ENV} is not set (bash tests/realrt/build.sh prints the folder)"
    lib = Path(folder)
    if not (lib / "libacl_rt.so").exists() or not _KERNEL_MAKER.exists():
        return f"no real runtime build in {lib}, or not a checkout"
    home = _scratch("aio_ascend_bench_realrt_")
    (home / "lib64").mkdir()
    for item in lib.iterdir():
        (home / "lib64" / item.name).symlink_to(item)
    (home / "lib64" / "libascendcl.so").symlink_to(lib / "libacl_rt.so")
    spec = importlib.util.spec_from_file_location("aio_ascend_realrt_kernels", _KERNEL_MAKER)
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = maker  # (its dataclasses look their module up)
    spec.loader.exec_module(maker)
    builtins: Path = maker.write_kernel_elf(home / "kernels.o")
    return home, builtins


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def on_acl_double(
    measure: Callable[[Any], dict[str, Any]],
    *,
    native: bool | None = None,
    install: Callable[[], tuple[Path, Path] | str] = _build,
) -> Callable[[Any], dict[str, Any]]:
    """``measure`` (a bench step) run on the acl backend over the double (or ``install``'s
    library): the install found through ``ASCEND_HOME_PATH`` meanwhile. For a step through
    the scheduler, ``native``: with the native batch submit where built (``True``), or
    launching one by one."""

    def step(cfg: Any) -> dict[str, Any]:
        built = install()
        if isinstance(built, str):
            return {"skipped": built}
        if native is False and not native_submit():
            return {
                "skipped": "the native batch submit is not built: (c) above launches one by one"
            }
        home, builtins = built
        values = {name: str(home) for name in HOME_ENV_VARS} | {ENV_BUILTINS: str(builtins)}
        acl = dataclasses.replace(cfg, backend="acl", results={}, tracer=None)
        with _environment(values), native_disabled() if native is False else nullcontext():
            result = measure(acl)
        if native is not None:
            result["native_submit"] = native and native_submit()
        return result

    return step


def acl_steps(
    raw: Callable[[Any], dict[str, Any]], scheduler: Callable[[Any], dict[str, Any]]
) -> list[tuple[str, str, Callable[[Any], dict[str, Any]]]]:
    """The bench's steps on the double (keys :data:`ACL_STEPS`): the bench's ``raw`` (a) and
    ``scheduler`` (c) measurements, (c) with the native submit where built and without."""
    return [
        ("acl_raw", "(a) raw runtime loop, acl double", on_acl_double(raw)),
        ("acl_poll", "(c) scheduler, acl double", on_acl_double(scheduler, native=True)),
        (
            "acl_poll_ctypes",
            "(c) scheduler, acl double, one by one",
            on_acl_double(scheduler, native=False),
        ),
        ("realrt_raw", "(a) raw runtime loop, real runtime", on_acl_double(raw, install=_realrt)),
        (
            "realrt_poll",
            "(c) scheduler, real runtime",
            on_acl_double(scheduler, native=True, install=_realrt),
        ),
    ]


def _measured(r: dict[str, Any], key: str) -> dict[str, Any] | None:
    x = r.get(key)
    return x if isinstance(x, dict) and "cpu_us_per_launch" in x else None


def acl_ratios(r: dict[str, Any], add: Callable[[str, float, str, bool], None]) -> None:
    """The acl double's target: host CPU per launch, (c) with the native submit / (a)."""
    raw, poll = _measured(r, "acl_raw"), _measured(r, "acl_poll")
    if raw is not None and poll is not None:
        v = cpu_ratio(poll, raw)
        add("host CPU per launch (c)/(a), acl", v, "<= 1.2", v <= 1.2)


def acl_rows(r: dict[str, Any], row: Callable[[str, str], None]) -> None:
    """The table's lines of the acl rows (through ``row``); the skipped ones with why."""
    labels = {
        "acl_raw": "(a) raw runtime loop (a ctypes call each)",
        "acl_poll": "(c) scheduler",
        "acl_poll_ctypes": "(c) scheduler, launching one by one (ctypes)",
        "realrt_raw": "real runtime: (a) raw runtime loop",
        "realrt_poll": "real runtime: (c) scheduler",
    }
    for key, label in labels.items():
        x = r.get(key)
        if not isinstance(x, dict):
            continue
        if "skipped" in x:
            row(label, f"skipped: {x['skipped']}")
            continue
        rate, cpu = x["launches_per_s"], x["cpu_us_per_launch"]
        if key in ("acl_poll", "realrt_poll"):
            label += ", native batch submit" if x.get("native_submit") else ", one by one"
        row(label, f"{rate:>10,.0f} launches/s  {cpu:6.1f} us CPU/launch")
    raw, poll = _measured(r, "realrt_raw"), _measured(r, "realrt_poll")
    if raw is not None and poll is not None:  # (no target: the runtime's own cost is in both)
        v = poll["cpu_us_per_launch"] / raw["cpu_us_per_launch"]
        row("real runtime: host CPU per launch (c)/(a)", f"{v:.2f}")
