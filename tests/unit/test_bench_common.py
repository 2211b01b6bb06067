"""Unit tests for the pure helpers of bench/common.py (no timing assertions: not a benchmark)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.common import (
    Figure,
    Goal,
    errored,
    interleave,
    median,
    paired_spread,
    ratio,
    render_markdown,
    skipped,
    write_report,
)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([3.0, 1.0, 2.0], 2.0),
        ([1.0, 2.0, 3.0, 4.0], 2.5),
        ([5.0], 5.0),
        ([1.0, math.nan, 3.0], 2.0),
        ([math.inf, 2.0], 2.0),
        ([], None),
        ([math.nan], None),
    ],
)
def test_median_ignores_non_finite(values: list[float], expected: float | None) -> None:
    assert median(values) == expected


@pytest.mark.parametrize(
    ("ours", "base", "expected"),
    [(2.0, 1.0, 2.0), (1.0, 4.0, 0.25), (1.0, 0.0, None), (None, 1.0, None), (1.0, None, None)],
)
def test_ratio(ours: float | None, base: float | None, expected: float | None) -> None:
    assert ratio(ours, base) == expected


@pytest.mark.parametrize(
    ("goal", "ours", "r", "met"),
    [
        (Goal("<=", 1.3), 1.0, 1.3, True),
        (Goal("<=", 1.3), 1.0, 1.31, False),
        (Goal(">=", 0.97), 1.0, 0.97, True),
        (Goal(">=", 0.97), 1.0, 0.96, False),
        (Goal("<", 2.0, on="ours"), 1.99, None, True),
        (Goal("<", 2.0, on="ours"), 2.0, None, False),
        (Goal("==", 1, on="ours"), 1.0, None, True),
        (Goal("==", 1, on="ours"), 2.0, None, False),
        (Goal(">=", 0.97), 1.0, None, None),
        (Goal("<", 2.0, on="ours"), None, 1.0, None),
        (Goal("<", 2.0, on="ours"), math.nan, 1.0, None),
    ],
)
def test_goal_met(goal: Goal, ours: float | None, r: float | None, met: bool | None) -> None:
    assert goal.met(ours, r) is met


def test_goal_rejects_unknown_operator() -> None:
    with pytest.raises(ValueError, match="unknown goal operator '=<'"):
        Goal("=<", 1.0)  # type: ignore[arg-type]


def test_goal_describe() -> None:
    assert Goal("<=", 1.3).describe("s") == "ratio <= 1.3x"
    assert Goal("<", 2.0, on="ours").describe("s") == "< 2 s"


def test_figure_measured_takes_medians_and_judges_the_ratio() -> None:
    fig = Figure.measured(
        "S", "f", "s", [1.0, 3.0, 2.0], [1.0, 1.0, 1.0], baseline_name="b", goal=Goal("<=", 1.3)
    )
    assert (fig.ours, fig.baseline, fig.ratio) == (2.0, 1.0, 2.0)
    assert fig.status == "fail"
    assert fig.samples == {"ours": [1.0, 3.0, 2.0], "baseline": [1.0, 1.0, 1.0]}
    assert fig.note == "per-round ratio 1.00-3.00 (median 2.00)"


@pytest.mark.parametrize(
    ("ours", "goal", "status"),
    [
        ([1.0], None, "info"),
        ([], None, "error"),
        ([], Goal("<", 2.0, on="ours"), "error"),
        ([1.5], Goal("<", 2.0, on="ours"), "pass"),
    ],
)
def test_figure_status(ours: list[float], goal: Goal | None, status: str) -> None:
    assert Figure.measured("S", "f", "s", ours, goal=goal).status == status


def test_skipped_and_errored_rows() -> None:
    s = skipped("GPU", "images/s", "no CUDA device")
    assert (s.status, s.note) == ("skipped", "skipped: no CUDA device")
    e = errored("Train", "x", RuntimeError("boom\nsecond line"))
    assert (e.status, e.note) == ("error", "error: RuntimeError: boom")


def test_interleave_alternates_order_and_drops_warmup() -> None:
    calls: list[str] = []
    counter = {"a": 0, "b": 0}

    def make(name: str) -> Callable[[], float]:
        def measure() -> float:
            calls.append(name)
            counter[name] += 1
            return float(counter[name])

        return measure

    order: list[list[str]] = []
    out = interleave({"a": make("a"), "b": make("b")}, repeats=3, warmup=1, order=order)
    assert order == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert out == {"a": [2.0, 3.0, 4.0], "b": [2.0, 3.0, 4.0]}


def test_interleave_needs_a_round() -> None:
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        interleave({"a": lambda: 1.0}, repeats=0)


def test_render_markdown_groups_sections_and_escapes_pipes() -> None:
    figs = [
        Figure.measured("A", "f1", "s", [0.5], [0.25], baseline_name="a|b", goal=Goal("<=", 3)),
        skipped("B", "f2", "no cluster"),
        Figure.measured("A", "f3", "img/s", [1500.0], [1000.0]),
    ]
    text = render_markdown(figs, {"host": "h"})
    assert "- host: h" in text
    assert "Summary: info 1, pass 1, skipped 1" in text
    assert text.index("## A") < text.index("## B")
    a_block = text[text.index("## A") : text.index("## B")]
    assert "| f1 | 500.0 ms | 250.0 ms (a\\|b) | 2x | ratio <= 3x | pass |" in a_block
    assert "| f3 | 1,500 img/s | 1,000 img/s | 1.5x | — | info |" in a_block
    assert "skipped: no cluster" in text


def test_write_report_round_trips_json(tmp_path: Path) -> None:
    figs = [Figure.measured("A", "f", "s", [1.0, 2.0], [1.0], goal=Goal("<", 2.0, on="ours"))]
    md, js = write_report(figs, tmp_path / "out", {"host": "h"})
    assert md.read_text().startswith("# Benchmark report")
    data = json.loads(js.read_text())
    assert data["meta"] == {"host": "h"}
    (fig,) = data["figures"]
    assert fig["ours"] == 1.5
    assert fig["status"] == "pass"
    assert fig["goal"] == {"op": "<", "value": 2.0, "on": "ours", "text": "< 2"}


@pytest.mark.parametrize(
    ("ours", "base", "text"),
    [
        ([1.0, 2.0, 3.0], [1.0, 1.0, 2.0], "per-round ratio 1.00-2.00 (median 1.50)"),
        ([1.0], [1.0], ""),
        ([1.0, 2.0], None, ""),
        ([1.0, 2.0], [1.0], ""),
    ],
)
def test_paired_spread(ours: list[float], base: list[float] | None, text: str) -> None:
    assert paired_spread(ours, base) == text
