"""Refusing hostile specs costs no more than accepting a good one (issue 12).

Ours: ``python -m jobs submit --dry-run`` on the slowest to refuse of the worst inputs (a
532-byte billion-laughs alias bomb, 100000-deep nesting, a file over the 1 MiB cap). Baseline:
the same command accepting ``examples/cifar.yaml``, interleaved in the same run. Two rows: whole
processes (what a user waits for) and in-process calls of ``jobs.cli.main`` (the loader alone,
without the interpreter start both share).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import REPO, Figure, Goal, Options, bench_env, interleave

SECTION = "Bad input (issue 12)"
CIFAR = REPO / "examples" / "cifar.yaml"


def worst_inputs(folder: Path) -> dict[str, Path]:
    """The inputs that once took 2 GiB, a RecursionError or a hang, written under ``folder``."""
    lol = ",".join(['"lol"'] * 9)
    bomb = f"a: &a [{lol}]\n" + "".join(
        f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    files = {
        "alias bomb": bomb,
        "deep nesting": "name: demo\ntrain: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "2 MiB file": "name: demo\ntrain: {}\n" + "# padding\n" * 200_000,
    }
    out = {}
    for name, text in files.items():
        path = folder / (name.replace(" ", "-") + ".yaml")
        path.write_text(text)
        out[name] = path
    return out


def _process(spec: Path, env: dict[str, str], expect: int) -> Callable[[], float]:
    argv = [sys.executable, "-m", "jobs", "submit", str(spec), "--dry-run"]

    def run() -> float:
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        elapsed = time.perf_counter() - t0
        if proc.returncode != expect or (expect == 2 and proc.stderr.count("\n") != 1):
            raise RuntimeError(f"{spec.name}: exit {proc.returncode}: {proc.stderr[-300:]}")
        return elapsed

    return run


def _in_process(spec: Path, expect: int) -> Callable[[], float]:
    from jobs.cli import main

    def run() -> float:
        err = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(err):
            code = main(["submit", str(spec), "--dry-run"], out=io.StringIO())
        elapsed = time.perf_counter() - t0
        if code != expect:
            raise RuntimeError(f"{spec.name}: exit {code}: {err.getvalue()[-300:]}")
        return elapsed

    return run


def _row(
    kind: str,
    make: Callable[[Path, int], Callable[[], float]],
    specs: dict[str, Path],
    n: int,
    goal: Goal | None,
) -> Figure:
    measures = {name: make(path, 2) for name, path in specs.items()}
    measures["accept"] = make(CIFAR, 0)
    samples = interleave(measures, repeats=n, warmup=1)
    medians = {k: sorted(v)[len(v) // 2] for k, v in samples.items() if k != "accept"}
    worst = max(medians, key=lambda k: medians[k])
    each = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in medians.items())
    return Figure.measured(
        SECTION,
        f"refuse the worst input ({kind})",
        "s",
        samples[worst],
        samples["accept"],
        baseline_name="accept examples/cifar.yaml (submit --dry-run)",
        goal=goal,
        note=f"worst: {worst}; medians {each}; exit 2 and one line checked every round",
    )


def run(opts: Options) -> list[Figure]:
    """Both rows; the refusals are checked (exit 2, one line) on every round."""
    folder = Path(tempfile.mkdtemp(prefix="refuse-", dir=opts.workdir))
    specs = worst_inputs(folder)
    env = bench_env(threads=None)
    env["SLURM_TRAIN_STATE_DIR"] = str(folder / "state")
    env["SLURM_TRAIN_RUNS_DIR"] = str(folder / "runs")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    repeats = 3 if opts.quick else max(5, opts.repeats)
    opts.log("refuse: hostile specs vs accepting examples/cifar.yaml (processes)")

    def process(path: Path, expect: int) -> Callable[[], float]:
        return _process(path, env, expect)

    # What a user waits for: refusing any of them is no slower than accepting a good spec.
    figures = [_row("whole process", process, specs, repeats, Goal("<=", 1.0))]
    opts.log("refuse: the same in-process (jobs.cli.main)")
    saved = {k: os.environ.get(k) for k in ("SLURM_TRAIN_STATE_DIR", "SLURM_TRAIN_RUNS_DIR")}
    os.environ.update({k: env[k] for k in saved})
    try:
        # The loader alone (information, no goal): libyaml's scanner reads ahead through the
        # 200 KB of brackets before the depth limit stops it, ~5 ms against ~3 ms of a dry-run.
        figures.append(_row("in-process", _in_process, specs, repeats * 4, None))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return figures
