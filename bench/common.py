"""Timing helpers and result records shared by every benchmark (stdlib only, no torch).

The machines these run on are small and shared, so absolute times mean little. Every figure is
therefore a *ratio* between our number and a baseline measured in the same run, interleaved
with it (ABBA order, so a slow spell hits both sides), after warm-up rounds that are thrown
away, as the median of several rounds:

    samples = interleave({"ours": timed(run_ours), "base": timed(run_base)}, repeats=5)
    fig = Figure.measured("Command line", "submit --dry-run", "s", samples["ours"],
                          samples["base"], baseline_name="import submitit, pydantic, yaml",
                          goal=Goal("<=", 1.3))

:func:`write_report` turns a list of :class:`Figure` into ``report.md`` and ``report.json``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "REPO",
    "Figure",
    "Goal",
    "Options",
    "bench_env",
    "errored",
    "free_port",
    "interleave",
    "median",
    "paired_spread",
    "ratio",
    "render_markdown",
    "run_command",
    "skipped",
    "timed",
    "write_report",
]

REPO = Path(__file__).resolve().parents[1]

Status = Literal["pass", "fail", "info", "skipped", "error"]
GoalOp = Literal["<=", "<", ">=", ">", "=="]
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "==": lambda a, b: a == b,
}


@dataclass(frozen=True)
class Options:
    """What ``python -m bench`` was asked for; every benchmark receives it."""

    repeats: int = 5
    warmup: int = 1
    quick: bool = False
    workdir: Path = REPO / "bench" / "results" / "work"
    slurm_conf: str | None = None
    verbose: bool = True

    def log(self, message: str) -> None:
        """Progress on stderr (the report goes to files and stdout)."""
        if self.verbose:
            print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Goal:
    """A target: ``ratio <= 1.3`` (``on="ratio"``) or ``ours < 2`` (``on="ours"``)."""

    op: GoalOp
    value: float
    on: Literal["ratio", "ours"] = "ratio"

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown goal operator {self.op!r}; use one of {', '.join(_OPS)}")

    def met(self, ours: float | None, ratio_value: float | None) -> bool | None:
        """Whether the goal holds; None when the number it is about is missing."""
        subject = ratio_value if self.on == "ratio" else ours
        if subject is None or math.isnan(subject):
            return None
        return _OPS[self.op](subject, self.value)

    def describe(self, unit: str = "") -> str:
        """``ratio <= 1.3x`` / ``ours < 2 s``."""
        if self.on == "ratio":
            return f"ratio {self.op} {self.value:g}x"
        return f"{self.op} {self.value:g}{f' {unit}' if unit else ''}"


def median(values: Sequence[float]) -> float | None:
    """Median of the finite values, None when there are none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(finite) if finite else None


def ratio(ours: float | None, baseline: float | None) -> float | None:
    """``ours / baseline``; None when either is missing or the baseline is zero."""
    if ours is None or baseline is None or baseline == 0:
        return None
    return ours / baseline


def paired_spread(ours: Sequence[float], baseline: Sequence[float] | None) -> str:
    """``per-round ratio 0.91-1.10 (median 1.02)`` when both sides ran in the same rounds.

    Each round measures both sides back to back, so a round's own ratio is less exposed to load
    drift than the ratio of the two medians; their range shows how noisy the row is.
    """
    if baseline is None or len(ours) != len(baseline) or len(ours) < 2:
        return ""
    paired = [o / b for o, b in zip(ours, baseline, strict=True) if b]
    mid = median(paired)
    if mid is None:
        return ""
    return f"per-round ratio {min(paired):.2f}-{max(paired):.2f} (median {mid:.2f})"


@dataclass
class Figure:
    """One row of the report: our number, the baseline measured in the same run, the ratio."""

    section: str
    name: str
    unit: str
    ours: float | None = None
    baseline: float | None = None
    baseline_name: str = ""
    ratio: float | None = None
    goal: Goal | None = None
    status: Status = "info"
    note: str = ""
    samples: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def measured(
        cls,
        section: str,
        name: str,
        unit: str,
        ours: Sequence[float],
        baseline: Sequence[float] | None = None,
        *,
        baseline_name: str = "",
        goal: Goal | None = None,
        note: str = "",
    ) -> Figure:
        """A row from raw samples: medians, their ratio and the goal's verdict."""
        ours_m = median(ours)
        base_m = median(baseline) if baseline is not None else None
        spread = paired_spread(ours, baseline)
        if spread:
            note = f"{note}; {spread}" if note else spread
        fig = cls(
            section,
            name,
            unit,
            ours=ours_m,
            baseline=base_m,
            baseline_name=baseline_name,
            ratio=ratio(ours_m, base_m),
            goal=goal,
            note=note,
            samples={"ours": list(ours), **({"baseline": list(baseline)} if baseline else {})},
        )
        fig.status = fig.verdict()
        return fig

    def verdict(self) -> Status:
        """pass/fail against the goal; info without one; error when the number is missing."""
        if self.goal is None:
            return "info" if self.ours is not None else "error"
        met = self.goal.met(self.ours, self.ratio)
        if met is None:
            return "error"
        return "pass" if met else "fail"

    def to_json(self) -> dict[str, Any]:
        """Plain data for report.json (the goal as its description too)."""
        data = asdict(self)
        data["goal"] = (
            None if self.goal is None else {**asdict(self.goal), "text": self.goal.describe()}
        )
        return data


def skipped(section: str, name: str, reason: str) -> Figure:
    """A row for a benchmark that could not run here (``skipped: <reason>``)."""
    return Figure(section, name, "", status="skipped", note=f"skipped: {reason}")


def errored(section: str, name: str, exc: BaseException | str) -> Figure:
    """A row for a benchmark that crashed: the report still gets written."""
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    first = text.strip().splitlines()[0] if text.strip() else "error"
    return Figure(section, name, "", status="error", note=f"error: {first[:300]}")


# -- measuring ----------------------------------------------------------------------------------
def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """A callable that runs ``fn`` and returns its wall time in seconds."""

    def run() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return run


def interleave(
    measures: Mapping[str, Callable[[], float]],
    repeats: int,
    warmup: int = 1,
    order: list[list[str]] | None = None,
) -> dict[str, list[float]]:
    """Run every measure once per round, ``warmup + repeats`` rounds; keep the last ``repeats``.

    Rounds alternate forward and reversed order (ABBA...), so a drift in machine load weighs
    on every measure alike. Each measure returns its own number (seconds, images/s, ...).
    ``order``, when given, receives the names in the order they ran (for tests).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    names = list(measures)
    out: dict[str, list[float]] = {n: [] for n in names}
    for i in range(warmup + repeats):
        this_round = names if i % 2 == 0 else names[::-1]
        if order is not None:
            order.append(list(this_round))
        for name in this_round:
            value = measures[name]()
            if i >= warmup:
                out[name].append(value)
    return out


def bench_env(extra: Mapping[str, str] | None = None, threads: int | None = 1) -> dict[str, str]:
    """Environment for benchmark subprocesses: the checkout on PYTHONPATH, fixed thread counts,
    and no launcher variables leaking in (a bench run inside a Slurm job stays a plain run)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SBATCH_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
        env["MKL_NUM_THREADS"] = str(threads)
    if extra:
        env.update(extra)
    return env


def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run one command (argument list, timeout); raise RuntimeError with its stderr on failure."""
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {' | '.join(tail)}")
    return proc


def time_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 120.0,
) -> float:
    """Wall time of one command, start to exit, to the resolution of the clock.

    ``subprocess.run(..., timeout=T)`` without pipes waits by polling ``waitpid`` with sleeps
    doubling up to 50 ms, so every time it returns lands on that schedule (a 120 ms process
    reads 164 ms). Here the wait blocks in ``waitpid``; a timer kills the process at ``timeout``.
    Output goes to /dev/null; a non-zero exit raises RuntimeError.
    """
    import threading

    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(env) if env is not None else None,
        cwd=cwd,
    )
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        code = proc.wait()
    finally:
        killer.cancel()
    elapsed = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"{argv[0]} exited {code}" + (" (timed out)" if code < 0 else ""))
    return elapsed


def free_port() -> int:
    """A TCP port nobody listens on right now (for a rendezvous on 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- the report ---------------------------------------------------------------------------------
def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif value == int(value):
        text = f"{value:.0f}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}".strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(figures: Sequence[Figure], meta: Mapping[str, Any] | None = None) -> str:
    """The report as one markdown table per section, in the order the figures came."""
    lines = ["# Benchmark report", ""]
    for key, value in (meta or {}).items():
        lines.append(f"- {key}: {value}")
    if meta:
        lines.append("")
    counts: dict[str, int] = {}
    for f in figures:
        counts[f.status] = counts.get(f.status, 0) + 1
    lines.append("Summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    lines.append("")
    sections: dict[str, list[Figure]] = {}
    for f in figures:
        sections.setdefault(f.section, []).append(f)
    for section, rows in sections.items():
        lines += [
            f"## {section}",
            "",
            "| figure | ours | baseline | ratio | goal | result | notes |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in rows:
            base = _fmt(f.baseline, f.unit)
            if f.baseline_name and f.baseline is not None:
                base = f"{base} ({f.baseline_name})"
            ratio_text = "—" if f.ratio is None else f"{f.ratio:.3g}x"
            goal = f.goal.describe(f.unit) if f.goal else "—"
            cells = [f.name, _fmt(f.ours, f.unit), base, ratio_text, goal, f.status, f.note]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def machine_meta() -> dict[str, Any]:
    """Where and when the report was measured."""
    return {
        "date (UTC)": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
    }


def write_report(
    figures: Sequence[Figure], out_dir: str | os.PathLike[str], meta: Mapping[str, Any]
) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.json`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "report.md"
    js = out / "report.json"
    md.write_text(render_markdown(figures, meta), encoding="utf-8")
    payload = {"meta": dict(meta), "figures": [f.to_json() for f in figures]}
    js.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    return md, js


class Skip(Exception):
    """A benchmark cannot run here (no cluster, a job that ended): the message is the reason."""


def wait_idle(client: Any, timeout_s: float = 60.0) -> None:
    """Until every node of the cluster is IDLE (at most ``timeout_s``): a row then starts on
    idle nodes, and a cancelled job has left them (its ranks no longer write into a run
    directory the bench is about to remove)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # a Slurm hiccup: ask again
            if all(n.idle for n in client.nodes()):
                return
        time.sleep(0.5)


def wait_until(what: str, check: Callable[[], Any], timeout: float, poll: float = 0.5) -> Any:
    """``check()``'s first true value, polled every ``poll`` s; :class:`Skip` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Skip(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)
