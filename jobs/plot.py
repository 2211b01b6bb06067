"""``python -m jobs plot RUN [-o FILE.png]``: one picture of a run's life.

Four panels: training loss and test accuracy against the step (top) and against wall time
(bottom). Every interruption recorded in ``events.jsonl`` (preempted, timeout, failure, hang,
node_fail, cancelled) is a dashed vertical line at the step where it stopped; each resume is a
dot-dash line at the step it resumed from, and the steps between the two (done, lost with the
interruption, and done again) are shaded. Works on a running job (whatever the files hold so
far) and on sweeps (``RUN/tasks/N``: one curve per task). Reads ``metrics.jsonl`` and
``events.jsonl`` through their schemas (:mod:`train.schema`: a damaged record is skipped and
reported in one line). matplotlib is imported
here only, so no other command pays for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.errors import UsageError
from jobs.goodput import LABELS, Ledger
from train.history import STOP_EVENTS
from train.runfiles import EVENT_KINDS, EVENTS_FILE, METRICS_FILE, TASKS_DIR
from train.schema import EVENT, METRIC, read_records

__all__ = ["TaskSeries", "plot_run", "read_series"]

STOPS = STOP_EVENTS
_COLORS = {k.name: k.colour for k in EVENT_KINDS if k.colour}


@dataclass
class TaskSeries:
    """What one task's files hold: curves, interruptions and resumes."""

    label: str
    train: list[tuple[int, float, float]] = field(default_factory=list)  # step, time, loss
    evals: list[tuple[int, float, float]] = field(default_factory=list)  # step, time, accuracy
    stops: list[tuple[str, int]] = field(default_factory=list)  # kind, step
    stop_times: list[tuple[str, float]] = field(default_factory=list)  # kind, time
    resumes: list[int] = field(default_factory=list)  # step resumed from
    # (step resumed from, step reached before the interruption): steps done twice
    redone: list[tuple[int, int]] = field(default_factory=list)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def read_series(task_dir: Path, label: str) -> TaskSeries:
    """The curves and events of one task directory (missing files: empty)."""
    s = TaskSeries(label)
    for rec in read_records(task_dir / METRICS_FILE, METRIC):
        step, t = _num(rec.get("step")), _num(rec.get("time"))
        if step is None or t is None:
            continue
        if rec.get("kind") == "train" and (loss := _num(rec.get("loss"))) is not None:
            s.train.append((int(step), t, loss))
        elif rec.get("kind") == "eval" and (acc := _num(rec.get("test_accuracy"))) is not None:
            s.evals.append((int(step), t, acc))
    reached: int | None = None  # the step of the last interruption not yet resumed
    for ev in read_records(task_dir / EVENTS_FILE, EVENT):
        if ev.get("event") == "restart_in_place" and s.stops:
            # the interruption went on in the same allocation: say so on its mark
            kind, at = s.stops[-1]
            s.stops[-1] = (f"{kind}, restart in place", at)
            continue
        step = _num(ev.get("step"))
        if step is None:
            continue
        if ev.get("event") in STOPS:
            s.stops.append((str(ev["event"]), int(step)))
            if (t := _num(ev.get("time"))) is not None:
                s.stop_times.append((str(ev["event"]), t))
            reached = int(step)
        elif ev.get("event") == "resume":
            s.resumes.append(int(step))
            if reached is not None and reached > step:
                s.redone.append((int(step), reached))
            reached = None
    return s


def _tasks(run_dir: Path) -> list[TaskSeries]:
    tasks = run_dir / TASKS_DIR
    if tasks.is_dir():
        dirs = sorted(
            (p for p in tasks.iterdir() if p.is_dir() and p.name.isdigit()),
            key=lambda p: int(p.name),
        )
        return [read_series(p, f"task {p.name}") for p in dirs]
    return [read_series(run_dir, run_dir.name)]


def plot_run(run_dir: Path, out: Path, ledger: Ledger | None = None) -> Path:
    """Draw ``run_dir`` (a run or a sweep) into the PNG ``out``; return ``out``. With a goodput
    ``ledger`` (:mod:`jobs.goodput`), a bar below splits the wall time the same way."""
    series = [s for s in _tasks(run_dir) if s.train or s.evals]
    if not series:
        raise UsageError(f"plot: no metrics yet in {run_dir} (metrics.jsonl is empty or missing)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("plot: needs matplotlib (pip install matplotlib, or make setup)") from None
    t0 = min(p[1] for s in series for p in (s.train + s.evals))
    rows = 3 if ledger is not None and ledger.wall_s > 0 else 2
    height = 8 if rows == 2 else 9.5
    fig = plt.figure(figsize=(12, height))
    # Margins fixed in inches (room for the tick labels, the titles and the bar's legend below
    # it), not tight_layout: that measures by drawing the whole figure once more before the
    # PNG is drawn (0.2-0.3 s of CPU of a 0.8 s `jobs plot`, median of 8, by hand).
    grid = fig.add_gridspec(
        rows, 2, height_ratios=[1, 1, 0.3][:rows], left=0.9 / 12, right=1 - 0.3 / 12,
        top=1 - 0.65 / height, bottom=(1.15 if rows == 3 else 0.6) / height,
        hspace=0.3 if rows == 2 else 0.4, wspace=0.2,
    )  # fmt: skip
    axes = [[fig.add_subplot(grid[r, c]) for c in range(2)] for r in range(2)]
    if ledger is not None and rows == 3:
        _goodput_bar(fig.add_subplot(grid[2, :]), ledger)
    for row, (xi, xlabel) in enumerate(((0, "step"), (1, "wall time (min)"))):
        for col, (attr, ylabel) in enumerate(
            (("train", "training loss"), ("evals", "test accuracy"))
        ):
            ax = axes[row][col]
            for s in series:
                pts = getattr(s, attr)
                xs = [p[0] if xi == 0 else (p[1] - t0) / 60 for p in pts]
                ax.plot(
                    xs,
                    [p[2] for p in pts],
                    marker="." if attr == "evals" else None,
                    linewidth=1,
                    label=s.label,
                )
                if xi == 0:
                    _mark(ax, s)
                else:
                    for kind, t in s.stop_times:
                        color = _COLORS.get(kind, "k")
                        ax.axvline((t - t0) / 60, color=color, linestyle="--", linewidth=1)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend(loc="best", fontsize="small")
    stops = sum(len(s.stops) for s in series)
    fig.suptitle(f"{run_dir.name}: {stops} interruption(s), {len(series)} task(s)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out


def _mark(ax: Any, s: TaskSeries) -> None:
    for kind, step in s.stops:
        color = _COLORS.get(kind.split(",")[0], "k")
        ax.axvline(step, color=color, linestyle="--", linewidth=1, alpha=0.8)
        ax.annotate(
            kind,
            (step, 1),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize="x-small",
            color=color,
        )
    for step in s.resumes:
        ax.axvline(step, color="tab:green", linestyle="-.", linewidth=1, alpha=0.8)
    for lo, hi in s.redone:
        ax.axvspan(lo, hi, color="tab:red", alpha=0.12, linewidth=0)


_PART_COLORS = {
    "productive": "tab:green",
    "eval": "tab:cyan",
    "checkpoint": "tab:blue",
    "startup": "tab:olive",
    "redone": "tab:red",
    "hang": "tab:brown",
    "stop": "tab:orange",
    "queued": "tab:purple",
    "unaccounted": "lightgray",
}


def _goodput_bar(ax: Any, ledger: Ledger) -> None:
    """One horizontal bar: the wall time split into the ledger's parts (seconds)."""
    left = 0.0
    for part, seconds in ledger.parts.items():
        if seconds <= 0:
            continue
        ax.barh(0, seconds, left=left, color=_PART_COLORS.get(part, "k"),
                label=f"{LABELS[part]} {seconds:.0f} s")  # fmt: skip
        left += seconds
    ax.set_yticks([])
    ax.set_xlabel("wall time (s)")
    ax.set_title(ledger.line(), fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6), ncol=5, fontsize="x-small")
