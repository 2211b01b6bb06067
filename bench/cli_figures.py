"""Command-line figures for the report, built on :mod:`bench.bench_cli` (the jobs engineer's).

From ``bench_cli`` (called as it is):

- ``bench_dry_run``: ``jobs submit --dry-run examples/cifar.yaml`` (no cache: it validates
  every time) against its import floor, ``bench_cli.FLOOR`` (``import submitit, yaml`` and
  ``from pydantic import`` the spec modules' names; goal <= 1.3x), and, for scale, against
  ``import submitit, pydantic, yaml`` (pydantic 2's lazy package: none of its model API);
- ``bench_cluster``: a 1000-point sweep submitted as one array (goal < 2 s) and ``jobs status``
  of its 1000 tasks with one Slurm command; it cancels the array afterwards.

Added here: a sbatch shim on PATH counts the sbatch calls of the sweep (goal: one); a real
``jobs submit`` (with preflight) against the least it can cost, the same import floor followed
by a plain ``sbatch`` of the equivalent script (the one ``--dry-run`` prints), both ``--hold`` so
nothing runs, interleaved and cancelled right after (goal <= 1.3x), with the Slurm commands one
submit runs counted by shims (goal: 2, one preflight query and one sbatch; the array limits are
cached on slurm.conf's stamp); and ``jobs status`` of the 1000-task array against one plain
``sacct`` of the same array (measured after ``bench_cluster`` cancelled it: both sides see the
same records).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    Figure,
    Goal,
    Options,
    bench_env,
    interleave,
    run_command,
    skipped,
)

__all__ = ["run"]

SECTION = "Command line"
SHIM = """#!/bin/sh
echo "$@" >> {log}
exec {real} "$@"
"""
SACCT_FIELDS = "JobID,State,ExitCode,Reason,NodeList,Elapsed,Partition,JobName"


def _shim(directory: Path, name: str, log: Path, env: dict[str, str]) -> None:
    import shlex

    real = shutil.which(name, path=env.get("PATH"))
    if real is None:
        raise RuntimeError(f"{name} is not on PATH")
    path = directory / name
    path.write_text(SHIM.format(log=shlex.quote(str(log)), real=shlex.quote(real)))
    path.chmod(0o755)


def _dry_run(opts: Options, env: dict[str, str]) -> list[Figure]:
    from bench.bench_cli import FLOOR, PACKAGE_FLOOR, bench_dry_run

    runs = 5 if opts.quick else max(9, 2 * opts.repeats)
    res: dict[str, Any] = bench_dry_run(runs, 2, env)
    times = res["all_s"]
    note = f"median of {runs} (4 commands interleaved, 2 warm-up rounds; bench/bench_cli.py)"
    floor = f"python -c {FLOOR.strip()!r}"
    package = f'python -c "{PACKAGE_FLOOR}"'
    return [
        Figure.measured(
            SECTION,
            "submit --dry-run examples/cifar.yaml (cold, no cache)",
            "s",
            times["dry_run"],
            times["floor"],
            baseline_name=floor,
            goal=Goal("<=", 1.3),
            note=f"reads, validates and renders every call; the floor: its dependencies "
            f"imported as its modules import them; {note}",
        ),
        Figure.measured(
            SECTION,
            "for scale: the dry-run against pydantic's lazy package",
            "s",
            times["dry_run"],
            times["package_floor"],
            baseline_name=package,
            note=f"`import pydantic` (pydantic 2) imports none of BaseModel, Field, ...; {note}",
        ),
        Figure.measured(
            SECTION,
            "for scale: import + one one-field pydantic model",
            "s",
            times["one_model"],
            times["package_floor"],
            baseline_name=package,
            note=f"a plain interpreter (collector on, like the floor) validating one model; {note}",
        ),
    ]


def _job_id(text: str) -> str:
    import json

    line = text.strip().splitlines()[-1]
    if line.startswith("{"):
        return str(json.loads(line)["job_id"])
    return line.split(";", 1)[0].strip()


def _real_submit(opts: Options, env: dict[str, str], tmp: Path) -> list[Figure]:
    """``jobs submit`` (held) vs the import floor + ``sbatch`` of the same script (held)."""
    from bench.bench_cli import FLOOR, count_calls, slurm_shims
    from cluster import slurm_client

    client = slurm_client(environ=env)
    spec = REPO / "examples" / "cifar.yaml"
    hold = ["--set", "launch.sbatch_args.hold=true"]
    py = sys.executable
    script = tmp / "equivalent.sbatch"
    dry = run_command([py, "-m", "jobs", "submit", str(spec), "--dry-run", *hold], env=env)
    script.write_text(dry.stdout)
    submitted: list[str] = []

    def ours() -> float:
        t0 = time.perf_counter()
        out = run_command([py, "-m", "jobs", "submit", str(spec), "--json", *hold], env=env)
        elapsed = time.perf_counter() - t0
        submitted.append(_job_id(out.stdout))
        return elapsed

    def plain() -> float:
        t0 = time.perf_counter()
        run_command([py, "-c", FLOOR], env=env)
        out = run_command(["sbatch", "--parsable", str(script)], env=env, cwd=tmp)
        elapsed = time.perf_counter() - t0
        submitted.append(_job_id(out.stdout))
        return elapsed

    def cancelled(fn: Callable[[], float]) -> Callable[[], float]:
        def run() -> float:
            try:
                return fn()
            finally:
                if submitted:
                    client.cancel(submitted)
                    submitted.clear()

        return run

    # As many rounds as the dry-run: one round is two submissions and two cancels (~0.5 s),
    # and with 5 the median swung by 0.1x from run to run.
    repeats = 3 if opts.quick else max(9, 2 * opts.repeats)
    samples = interleave(
        {"ours": cancelled(ours), "plain": cancelled(plain)}, repeats=repeats, warmup=1
    )
    # The Slurm commands of one more submit (limits already cached by the rounds above).
    log = tmp / "submit-calls.txt"
    shim_env = slurm_shims(tmp / "submit-shims", log, env)
    out = run_command([py, "-m", "jobs", "submit", str(spec), "--json", *hold], env=shim_env)
    client.cancel([_job_id(out.stdout)], no_requeue=True)
    calls = count_calls(log)
    commands = sorted({ln.split(" ", 1)[0] for ln in log.read_text().splitlines()})
    return [
        Figure.measured(
            SECTION,
            "submit examples/cifar.yaml (real, with preflight)",
            "s",
            samples["ours"],
            samples["plain"],
            baseline_name="the dry-run's import floor (bench_cli.FLOOR) + sbatch of its script",
            goal=Goal("<=", 1.3),
            note=f"both --hold and cancelled at once; median of {repeats}",
        ),
        Figure.measured(
            SECTION,
            "Slurm commands per submit",
            "calls",
            [float(calls)],
            goal=Goal("<=", 2, on="ours"),
            note=f"counted by shims on PATH: {', '.join(commands)} (one preflight query + sbatch)",
        ),
    ]


def _sweep_and_status(opts: Options, env: dict[str, str], tmp: Path) -> list[Figure]:
    from bench.bench_cli import bench_cluster

    shims = tmp / "sbatch-shim"
    shims.mkdir()
    calls = tmp / "sbatch-calls.txt"
    calls.touch()
    _shim(shims, "sbatch", calls, env)
    shim_env = {**env, "PATH": f"{shims}{os.pathsep}{env['PATH']}"}
    opts.log("cli: 1000-point sweep as one array (bench_cli.bench_cluster)")
    res: dict[str, Any] = bench_cluster(shim_env, tmp)
    if "skipped" in res:
        return [skipped(SECTION, "1000-point sweep", str(res["skipped"]))]
    if "error" in res:
        raise RuntimeError(f"sweep submission failed: {res['error']}")
    sbatch_calls = len(calls.read_text().splitlines())
    figures = [
        Figure.measured(
            SECTION,
            "submit a 1000-point sweep (one array)",
            "s",
            [float(res["submit_s"])],
            goal=Goal("<", 2.0, on="ours"),
            note=(
                f"{res['array_tasks']} array tasks, {sbatch_calls} sbatch call(s) "
                f"(goal 1: {'ok' if sbatch_calls == 1 else 'MISSED'}); one run; cancelled"
            ),
        ),
        Figure.measured(
            SECTION,
            "sbatch calls for the 1000-point sweep",
            "calls",
            [float(sbatch_calls)],
            goal=Goal("==", 1, on="ours"),
            note="counted by an sbatch shim on PATH",
        ),
        Figure.measured(
            SECTION,
            "Slurm commands for status of 1000 tasks",
            "calls",
            [float(res["status_slurm_calls"])],
            goal=Goal("==", 1, on="ours"),
            note=(
                f"status listed {res['status_tasks']} tasks in {res['status_s']:.2f} s "
                "while the array was queued; squeue+sacct counted by shims"
            ),
        ),
    ]
    job = str(res["job_id"])
    py = sys.executable
    status_cmd = [py, "-m", "jobs", "status", job, "--json"]
    sacct_cmd = ["sacct", "-X", "-n", "-P", "-o", SACCT_FIELDS, "-j", job]
    repeats = 3 if opts.quick else opts.repeats
    samples = interleave(
        {
            "ours": lambda: _time(status_cmd, env),
            "plain": lambda: _time(sacct_cmd, env),
        },
        repeats=repeats,
        warmup=1,
    )
    figures.append(
        Figure.measured(
            SECTION,
            "status of a 1000-task array",
            "s",
            samples["ours"],
            samples["plain"],
            baseline_name="one plain sacct of the array",
            note=(
                f"after the array was cancelled (same records on both sides); median of "
                f"{repeats}; queued-array status took {res['status_s']:.2f} s"
            ),
        )
    )
    return figures


def _time(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    run_command(cmd, env=env, cwd=REPO)
    return time.perf_counter() - t0


def run(opts: Options) -> list[Figure]:
    """Dry-run, real submit, sweep and status figures (cluster parts skipped without Slurm)."""
    import compileall

    # As after `make setup`: with PYTHONDONTWRITEBYTECODE set, a source edited since would be
    # compiled again by every timed command (tens of ms that no user of an install pays).
    for package in ("jobs", "cluster", "train"):
        compileall.compile_dir(REPO / package, quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="cli-", dir=opts.workdir))
    env = bench_env(threads=None)
    env["SLURM_TRAIN_STATE_DIR"] = str(tmp / "state")
    env["SLURM_TRAIN_RUNS_DIR"] = str(tmp / "runs")
    if opts.slurm_conf:
        env["SLURM_CONF"] = opts.slurm_conf
    opts.log("cli: submit --dry-run vs its import floor")
    figures = _dry_run(opts, env)
    from cluster import slurm_client

    if not slurm_client(environ=env).ping():
        reason = "no Slurm controller answers (python -m cluster up)"
        figures.append(skipped(SECTION, "real submit, 1000-point sweep, status", reason))
        return figures
    opts.log("cli: real submit vs plain sbatch (held, cancelled)")
    figures.extend(_real_submit(opts, env, tmp))
    figures.extend(_sweep_and_status(opts, env, tmp))
    shutil.rmtree(tmp, ignore_errors=True)
    return figures
