"""The latency plot: one panel per measurement, CDFs on a log axis, the format from the file's
extension, readable ticks; and the one percentile (numpy's nearest rank)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aio_ascend._tools import plot
from aio_ascend._tools.cli import main
from aio_ascend._tools.stats import percentile

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "svg": b"<?xml", "pdf": b"%PDF"}


def _reference_percentile(values: list[float], q: float) -> float:
    """The hand-written nearest-rank helper the tools had before (issue 18)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200),
    st.one_of(st.sampled_from([0, 1, 25, 50, 75, 90, 99, 99.9, 100]), st.floats(0, 100)),
)
def test_percentile_matches_the_nearest_rank_reference(values: list[float], q: float) -> None:
    assert percentile(values, q) == _reference_percentile(values, q)


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("a.png", "png"), ("a.SVG", "svg"), ("dir.v2/a.pdf", "pdf")],
)
def test_plot_format(name: str, fmt: str) -> None:
    assert plot.plot_format(name) == fmt


@pytest.mark.parametrize("name", ["a", "a.jpg", "a.png.txt", ".png/a"])
def test_plot_format_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"\.png, \.svg, \.pdf"):
        plot.plot_format(name)


@given(st.floats(1e-3, 1e7), st.floats(1.05, 1e4))
def test_log_ticks_are_plain_numbers_inside_the_range(low: float, factor: float) -> None:
    high = low * factor
    ticks = plot.log_ticks(low, high)
    assert len(ticks) >= 2
    assert ticks == sorted(set(ticks))
    assert all(low * 0.999 <= t <= high * 1.001 for t in ticks)
    assert all("e" not in plot._number(t) for t in ticks if t >= 1e-2)
    if factor >= 10:  # a decade or more: 1-2-5 steps, at least three of them
        assert len(ticks) >= 3
        assert {f"{t:.1e}"[0] for t in ticks} <= {"1", "2", "5"}


def test_numbers_never_use_exponents_for_latencies() -> None:
    assert plot._number(1750.4) == "1,750"
    assert plot._number(99.71) == "99.7"
    assert plot._number(123456.0) == "123,456"


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf"])
def test_plot_writes_the_format_its_extension_names(fmt: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / f"lat.{fmt}"
    panels = {
        "launch + await": {"a": [100.0 + i for i in range(50)], "b": [200.0, 300.0]},
        "wake": {"c": [40.0, 50.0, 60.0]},
        "nothing": {"d": []},
    }
    assert plot.plot_latencies(path, panels, title="t") == fmt
    assert path.read_bytes().startswith(MAGIC[fmt])


def test_plot_refuses_no_samples(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no latency samples"):
        plot.plot_latencies(tmp_path / "x.png", {"p": {"a": [], "b": [0.0]}}, title="t")
    with pytest.raises(ValueError, match="extension"):
        plot.plot_latencies(tmp_path / "x.bmp", {"p": {"a": [1.0]}}, title="t")
    assert list(tmp_path.iterdir()) == []


def test_plot_one_panel_per_measurement_cdf_on_a_log_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figures = []
    real_close = plt.close

    def keep(fig: object) -> None:  # inspect the figure instead of closing it
        figures.append(fig)

    monkeypatch.setattr(plt, "close", keep)
    panels = {
        "launch": {"naive": [200.0, 250.0, 400.0, 300.0], "poll": [150.0, 180.0, 900.0]},
        "wake": {"poll": [80.0, 90.0, 100.0], "block": [50.0, 2000.0]},
    }
    plot.plot_latencies(tmp_path / "x.png", panels, title="bench")
    (fig,) = figures
    try:
        axes = fig.get_axes()  # type: ignore[attr-defined]
        assert [ax.get_title(loc="left") for ax in axes] == ["launch", "wake"]
        for ax, series in zip(axes, panels.values(), strict=True):
            assert ax.get_xscale() == "log"
            named = ax.get_legend_handles_labels()[1]
            curves = [line for line in ax.get_lines() if line.get_label() in named]
            assert len(curves) == len(series)
            assert ax.get_yscale() == "function"  # the tail-stretching share axis
            for line, values in zip(curves, series.values(), strict=True):
                xs, ys = line.get_data()
                assert list(xs) == sorted(values)  # a CDF: sorted samples ...
                n = len(values)  # ... at Hazen's positions, (i - 0.5) / n
                assert math.isclose(ys[0], 0.5 / n) and math.isclose(ys[-1], 1 - 0.5 / n)
            labels = [t.get_text() for t in ax.get_xticklabels()]
            assert labels and all("e" not in label and "$" not in label for label in labels)
    finally:
        real_close(fig)


def test_cli_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    svg = tmp_path / "demo.svg"
    assert main(["demo", "--requests", "20", "--size", "256", "-q", "--plot", str(svg)]) == 0
    assert svg.read_bytes().startswith(MAGIC["svg"]) and b"<svg" in svg.read_bytes()
    pdf = tmp_path / "bench.pdf"
    assert main(["bench", "--scale", "0.02", "--only", "wake_poll", "-q", "--plot", str(pdf)]) == 0
    assert pdf.read_bytes().startswith(MAGIC["pdf"])
    assert f"plot: {pdf}" in capsys.readouterr().out


def _keep_figures(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], Any]:
    import matplotlib.pyplot as plt

    figures: list[Any] = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", figures.append)  # inspect the figure instead
    return figures, real_close


def test_the_tail_above_p99_gets_room(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 1,000 samples, 10 of them slow: on a linear share axis the samples above p99 shared the
    # top 1 % of the panel's height, pressed into its edge
    pytest.importorskip("matplotlib")
    figures, real_close = _keep_figures(monkeypatch)
    values = [100.0 + i % 50 for i in range(990)] + [1000.0 + 100 * i for i in range(10)]
    plot.plot_latencies(tmp_path / "x.png", {"launch": {"a": values}}, title="t")
    (fig,) = figures
    try:
        (ax,) = fig.get_axes()
        fig.canvas.draw()
        bottom, top = (ax.transData.transform((1000.0, y))[1] for y in ax.get_ylim())
        p99 = ax.transData.transform((1000.0, 0.99))[1]
        assert (top - p99) / (top - bottom) > 0.25
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == ["0", "p50", "p90", "p99", "p99.9"]  # the top: 1 - 0.5 / 1000
        (curve,) = (line for line in ax.get_lines() if line.get_label().startswith("a:"))
        assert "max 1,900" in curve.get_label()
    finally:
        real_close(fig)


def test_the_bench_plot_shows_throughput_and_cpu_beside_the_latencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from aio_ascend._tools.bench import ratios
    from aio_ascend._tools.cli import _bench_bars

    results: dict[str, Any] = {
        "raw": {"launches_per_s": 700_000.0, "cpu_us_per_launch": 1.4},
        "naive": {
            "launches_per_s": 10_000.0,
            "cpu_us_per_launch": 118.0,
            "single_launch_p50_us": 144.0,
        },
        "poll": {
            "launches_per_s": 180_000.0,
            "cpu_us_per_launch": 5.5,
            "single_launch_p50_us": 163.0,
            "host_allocations_after_warmup": 0,
        },
        "handler": {"cpu_us_per_launch": 7.7},
    }
    results["ratios"] = ratios(results)
    bars = _bench_bars(results)
    assert list(bars) == ["throughput, noop kernels", "host CPU per launch"]
    assert bars["throughput, noop kernels"].values == {
        "(a) raw runtime loop": 700_000.0,
        "(b) naive to_thread": 10_000.0,
        "(c) scheduler, poll": 180_000.0,
    }
    assert "(c) request-handler shape" in bars["host CPU per launch"].values
    assert "target throughput (c)/(b) >= 15: 18, met" in bars["throughput, noop kernels"].target

    figures, real_close = _keep_figures(monkeypatch)
    panels = {"launch": {"(b)": [144.0, 150.0], "(c)": [163.0, 170.0]}}
    plot.plot_latencies(tmp_path / "x.png", panels, title="bench", bars=bars)
    (fig,) = figures
    try:
        throughput, cpu, latency = fig.get_axes()
        assert throughput.get_title(loc="left").startswith("throughput, noop kernels (higher")
        assert cpu.get_title(loc="left").startswith("host CPU per launch (lower is better)")
        # side by side, above the latency panel
        assert throughput.get_position().y0 == pytest.approx(cpu.get_position().y0)
        assert throughput.get_position().x1 < cpu.get_position().x0
        assert latency.get_position().y1 < throughput.get_position().y0
        texts = [t.get_text() for t in throughput.texts]
        assert any("180,000 launches/s  (18x (b))" in t for t in texts)
        assert throughput.get_xscale() == "log"  # 70x between the bars
        assert [t.get_text() for t in cpu.get_yticklabels()] == [
            "(a) raw runtime loop",
            "(b) naive to_thread",
            "(c) scheduler, poll",
            "(c) request-handler shape",
        ]
    finally:
        real_close(fig)
