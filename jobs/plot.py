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

A run of the user's own code (``entrypoint``) has no built-in curves: its picture is its life
and its own numbers. The life (against wall time, from ``events.jsonl``): each attempt a bar
from its start to its end, each interruption a line of its colour, the waits in the queue the
gaps between bars. The numbers, against the step, from whichever the run left in its directory:
``train.report`` lines in ``metrics.jsonl`` (:mod:`train.report`), TensorBoard event files
(``**/events.out.tfevents.*``, read with tensorboard where it is installed), Lightning's CSV logs
(``lightning_logs/version_*/metrics.csv``); at most four of them, the first found. A run that
wrote none of them is drawn all the same: its life and its goodput.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.errors import UsageError
from jobs.goodput import LABELS, Ledger
from train.history import STOP_EVENTS
from train.report import REPORT_KIND
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
    # the user's own numbers (train.report, TensorBoard, Lightning's CSV): name -> (step, value)
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    # the run's life: (time, event, attempt) of each event that has a time
    life: list[tuple[float, str, str]] = field(default_factory=list)

    @property
    def curves(self) -> bool:
        return bool(self.train or self.evals)


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
        elif rec.get("kind") == REPORT_KIND and isinstance(rec.get("scalars"), dict):
            for name, value in rec["scalars"].items():
                if (v := _num(value)) is not None:
                    s.scalars.setdefault(str(name), []).append((int(step), v))
    reached: int | None = None  # the step of the last interruption not yet resumed
    links: dict[str, int] = {}  # a chain of jobs (jobs.chain): each link is an attempt
    for ev in read_records(task_dir / EVENTS_FILE, EVENT):
        if ev.get("event") == "link_started":
            links.setdefault(str(ev.get("job_id")), len(links))
        if (t := _num(ev.get("time"))) is not None:
            link = links.get(str(ev.get("job_id")))
            attempt = f"{ev.get('restart_count') or 0}" if link is None else f"(link {link})"
            s.life.append((t, str(ev["event"]), attempt))
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


_MAX_SCALARS = 4
_MAX_FILES = 50


def _own_logs(task_dir: Path, s: TaskSeries) -> None:
    """The user's numbers from the frameworks' own logs, where the run has no reports."""
    if len(s.scalars) >= _MAX_SCALARS:
        return
    for path in sorted(task_dir.glob("lightning_logs/version_*/metrics.csv"))[:_MAX_FILES]:
        _lightning_csv(path, s)
    events = sorted(task_dir.glob("**/events.out.tfevents.*"))[:_MAX_FILES]
    if events and len(s.scalars) < _MAX_SCALARS:
        _tensorboard(events, s)


def _lightning_csv(path: Path, s: TaskSeries) -> None:
    import csv

    try:
        with path.open(newline="", encoding="utf-8", errors="replace") as f:
            for row in csv.DictReader(f):
                step = _num(_float(row.get("step")))
                if step is None:
                    continue
                for name, text in row.items():
                    if name in (None, "step", "epoch") or (v := _float(text)) is None:
                        continue
                    if name in s.scalars or len(s.scalars) < _MAX_SCALARS:
                        s.scalars.setdefault(str(name), []).append((int(step), v))
    except (OSError, csv.Error):
        return


def _float(text: object) -> float | None:
    try:
        value = float(str(text))
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def _tensorboard(paths: list[Path], s: TaskSeries) -> None:
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except ImportError:
        return
    for path in paths:
        try:
            for event in EventFileLoader(str(path)).Load():
                for value in event.summary.value:
                    number = _tb_value(value)
                    if number is None:
                        continue
                    if value.tag in s.scalars or len(s.scalars) < _MAX_SCALARS:
                        s.scalars.setdefault(value.tag, []).append((int(event.step), number))
        except Exception:  # noqa: S112 -- a damaged event file: what was read stays
            continue


def _tb_value(value: Any) -> float | None:
    if value.HasField("simple_value"):
        return _float(value.simple_value)
    tensor = getattr(value, "tensor", None)
    if tensor is not None and tensor.float_val:
        return _float(tensor.float_val[0])
    if tensor is not None and tensor.double_val:
        return _float(tensor.double_val[0])
    return None


def _tasks(run_dir: Path) -> list[TaskSeries]:
    tasks = run_dir / TASKS_DIR
    if tasks.is_dir():
        dirs = sorted(
            (p for p in tasks.iterdir() if p.is_dir() and p.name.isdigit()),
            key=lambda p: int(p.name),
        )
        out = [read_series(p, f"task {p.name}") for p in dirs]
    else:
        out = [read_series(run_dir, run_dir.name)]
    for s, d in zip(out, dirs if tasks.is_dir() else [run_dir], strict=True):
        if not s.curves and not s.scalars:
            _own_logs(d, s)
    return out


def plot_run(run_dir: Path, out: Path, ledger: Ledger | None = None) -> Path:
    """Draw ``run_dir`` (a run or a sweep) into the PNG ``out``; return ``out``. With a goodput
    ``ledger`` (:mod:`jobs.goodput`), a bar below splits the wall time the same way."""
    every = _tasks(run_dir)
    series = [s for s in every if s.curves]
    if not series and not any(s.life or s.scalars for s in every):
        raise UsageError(
            f"plot: no metrics yet in {run_dir}, and no events: the run has not started"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("plot: needs matplotlib (pip install matplotlib, or make setup)") from None
    if not series:
        return _plot_life(plt, run_dir, every, out, ledger)
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
    "held": "tab:pink",
    "links": "tab:gray",
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


_ENDS = {**_COLORS, "complete": "tab:green", "budget_exhausted": "black", "requeue": "tab:olive"}


def _plot_life(
    plt: Any, run_dir: Path, every: list[TaskSeries], out: Path, ledger: Ledger | None
) -> Path:
    """The picture of a run without built-in curves: its life, its own numbers, its goodput."""
    names = list(dict.fromkeys(n for s in every for n in s.scalars))[:_MAX_SCALARS]
    bar = ledger is not None and ledger.wall_s > 0
    rows = (1 if names else 0) + 1 + (1 if bar else 0)
    height = 3.2 * rows + 0.8
    ratios = ([1.0] if names else []) + [0.8] + ([0.3] if bar else [])
    fig = plt.figure(figsize=(12, height))
    grid = fig.add_gridspec(
        rows, max(1, len(names)), height_ratios=ratios,
        left=0.9 / 12, right=1 - 0.3 / 12, top=1 - 0.65 / height, bottom=1.15 / height,
        hspace=0.55, wspace=0.25,
    )  # fmt: skip
    row = 0
    for col, name in enumerate(names):
        ax = fig.add_subplot(grid[0, col])
        for s in every:
            pts = sorted(s.scalars.get(name, []))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linewidth=1, label=s.label)
        ax.set_xlabel("step")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    row += 1 if names else 0
    _life(fig.add_subplot(grid[row, :]), every, _submitted_at(run_dir))
    if bar and ledger is not None:
        _goodput_bar(fig.add_subplot(grid[row + 1, :]), ledger)
    stops = sum(1 for s in every for _, ev, _ in s.life if ev in STOPS)
    what = "its own numbers" if names else "no numbers of its own (train.report, TensorBoard)"
    fig.suptitle(f"{run_dir.name}: {stops} interruption(s), {len(every)} task(s); {what}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out


def _submitted_at(run_dir: Path) -> float | None:
    from jobs.records import load_record

    try:
        at = load_record(run_dir).submitted_at
    except Exception:  # no record (a copied run directory): from its first event
        return None
    return at if at > 0 else None


def _life(ax: Any, every: list[TaskSeries], submitted_at: float | None) -> None:
    """One row per task: a bar per attempt (start -> its end), the end's colour and name; the
    axis starts at the submission, so the first gap is the first wait in the queue."""
    first = min((t for s in every for t, _, _ in s.life), default=0.0)
    t0 = min(first, submitted_at) if submitted_at else first
    last = max((t for s in every for t, _, _ in s.life), default=t0)
    unit, scale = ("min", 60.0) if last - t0 > 180 else ("s", 1.0)
    for y, s in enumerate(every):
        began: float | None = None
        for t, event, attempt in s.life:
            x = (t - t0) / scale
            if event in ("start", "resume", "restart_in_place"):
                began = x if began is None else began
                continue
            if event not in _ENDS:
                continue
            if began is not None:
                ax.barh(y, x - began, left=began, height=0.5, color="tab:green", alpha=0.35)
                ax.annotate(f"attempt {attempt}", (began, y + 0.3), fontsize="x-small")
                began = None
            color = _ENDS[event]
            ax.plot([x, x], [y - 0.3, y + 0.3], color=color, linewidth=2)
            ax.annotate(event, (x, y - 0.45), fontsize="x-small", color=color, ha="center")
        if began is not None:  # still running: up to the last thing it recorded
            end = (max(t for t, _, _ in s.life) - t0) / scale
            ax.barh(y, max(end - began, 0.01), left=began, height=0.5, color="tab:green",
                    alpha=0.35)  # fmt: skip
    labels = [s.label if len(every) > 1 else "attempts" for s in every]
    ax.set_yticks(range(len(every)), labels, fontsize="small")
    ax.set_ylim(-0.8, len(every) - 0.2)
    ax.set_xlim(left=0)
    ax.set_xlabel(
        f"wall time since submission ({unit}): bars are attempts; gaps: the queue, start-up"
    )
    ax.grid(alpha=0.3, axis="x")
