"""CLI speed benchmark (not a timed test): ``python -m bench.bench_cli [--runs N] [--no-cluster]``.

1. ``python -m jobs submit --dry-run examples/cifar.yaml`` against its import floor
   (:data:`FLOOR`): the imports of its dependencies that its own modules make (``import
   submitit, yaml`` and ``from pydantic import`` the names the spec modules use), nothing of
   ours; measured in the same run, interleaved, medians after warm-up. Goal: dry-run <= 1.3x
   the floor. There is no cache: every dry-run reads, validates and renders the spec (the cold
   path users meet after every edit). Reported beside it, without a goal: the old floor
   ``import submitit, pydantic, yaml`` (pydantic 2's package is lazy: that line imports none of
   its model API, ~45 ms of the dry-run's own imports here) and that floor plus ONE one-field
   pydantic model (any pydantic spec's start). ``tests/unit/test_bench_cli.py`` checks that
   the floor imports no module the dry-run does not.
2. With the local cluster up: a 1000-point sweep is submitted as ONE array (goal < 2 s for the
   whole ``python -m jobs submit``), ``status`` of its 1000 tasks uses ONE Slurm command
   (squeue/sacct, counted through logging shims on PATH); the array is cancelled afterwards.

Prints every number and the ratios, writes bench/results/cli.json, exits 1 if a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import time_process

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
RATIO_GOAL = 1.3
SWEEP_GOAL_S = 2.0


#: The names the spec's modules import from pydantic (``jobs/spec.py``, ``train/spec/``).
PYDANTIC_NAMES = (
    "AliasChoices",
    "BaseModel",
    "ConfigDict",
    "Field",
    "ValidationError",
    "field_validator",
    "model_validator",
)
#: The dry-run's import floor: its dependencies imported as its modules import them.
FLOOR = f"import submitit, yaml\nfrom pydantic import {', '.join(PYDANTIC_NAMES)}\n"
#: The floor before issue 41's last round: ``import pydantic`` imports pydantic 2's lazy
#: package only (no ``BaseModel``, ``Field``, ...).
PACKAGE_FLOOR = "import submitit, pydantic, yaml"

ONE_MODEL = (
    "import submitit, pydantic, yaml\n"
    "class M(pydantic.BaseModel):\n"
    "    x: int\n"
    "M.model_validate({'x': 1})\n"
)


def _run(cmd: list[str], env: dict[str, str]) -> float:
    return time_process(cmd, env=env, cwd=REPO)


def bench_dry_run(runs: int, warmup: int, env: dict[str, str]) -> dict[str, object]:
    cmds = {
        "floor": [PY, "-c", FLOOR],
        "dry_run": [PY, "-m", "jobs", "submit", "--dry-run", "examples/cifar.yaml"],
        "package_floor": [PY, "-c", PACKAGE_FLOOR],
        # The floor plus one one-field model built and validated, in a plain interpreter (the
        # collector on, as in the floor): what a naive pydantic-validating CLI starts from.
        "one_model": [PY, "-c", ONE_MODEL],
    }
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for i in range(warmup + runs):
        order = list(cmds) if i % 2 == 0 else list(reversed(cmds))  # ABBA: drift hits all
        for name in order:
            t = _run(cmds[name], env)
            if i >= warmup:
                times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "runs": runs,
        "warmup": warmup,
        "median_s": med,
        "all_s": times,
        "ratio": med["dry_run"] / med["floor"],
        "ratio_package_floor": med["dry_run"] / med["package_floor"],
        "ratio_one_model": med["one_model"] / med["package_floor"],
        "goal_ratio": RATIO_GOAL,
    }


SWEEP_SPEC = """name: bench-sweep
resources: {partition: debug, nodes: 1, ntasks_per_node: 1, cpus_per_task: 1, time: "00:05:00"}
train:
  model: tinycnn
  width: 4
  max_steps: 1
  batch_size: 16
  data: {kind: synthetic, train_size: 64, test_size: 16}
sweep:
  max_parallel: 2
  grid:
    train.seed: [%s]
"""

SHIM = """#!/bin/sh
echo "%s $*" >> "%s"
exec "%s" "$@"
"""
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "sinfo", "scancel")


def slurm_shims(directory: Path, log: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with logging shims of every Slurm command first on PATH (one line per call)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in SLURM_COMMANDS:
        real = shutil.which(name, path=env.get("PATH"))
        if real is None:
            continue
        (directory / name).write_text(SHIM % (name, log, real))
        (directory / name).chmod(0o755)
    return {**env, "PATH": f"{directory}{os.pathsep}{env['PATH']}"}


def count_calls(log: Path, *names: str) -> int:
    """Calls logged by :func:`slurm_shims` (of ``names``, or of every command)."""
    try:
        lines = log.read_text().splitlines()
    except FileNotFoundError:
        return 0
    return sum(1 for ln in lines if not names or ln.split(" ", 1)[0] in names)


def bench_cluster(env: dict[str, str], tmp: Path) -> dict[str, object]:
    from cluster import slurm_client

    client = slurm_client(environ=env)
    if not client.ping():
        return {"skipped": "no Slurm controller answers (python -m cluster up)"}
    spec = tmp / "sweep1000.yaml"
    spec.write_text(SWEEP_SPEC % ", ".join(str(i) for i in range(1000)))
    calls = tmp / "slurm-calls.txt"
    cenv = slurm_shims(tmp / "shim", calls, env)
    t = time.perf_counter()
    proc = subprocess.run(
        [PY, "-m", "jobs", "submit", str(spec), "--json"],
        cwd=REPO,
        env=cenv,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    submit_s = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()}
    sub = json.loads(proc.stdout)
    try:
        calls.write_text("")
        t = time.perf_counter()
        status = subprocess.run(
            [PY, "-m", "jobs", "status", sub["run_id"], "--json"],
            cwd=REPO,
            env=cenv,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        status_s = time.perf_counter() - t
        tasks = json.loads(status.stdout)["tasks"]
        status_calls = count_calls(calls, "squeue", "sacct")
    finally:
        client.cancel([sub["job_id"]], no_requeue=True)
    return {
        "array_tasks": len(sub["job_ids"]),
        "job_id": sub["job_id"],
        "submit_s": submit_s,
        "goal_submit_s": SWEEP_GOAL_S,
        "status_s": status_s,
        "status_tasks": len(tasks),
        "status_slurm_calls": status_calls,
        "cancelled": True,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-cluster", action="store_true", help="skip the sweep benchmarks")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    env = dict(os.environ)
    env["SLURM_TRAIN_STATE_DIR"] = str(tmp / "state")
    env["SLURM_TRAIN_RUNS_DIR"] = str(tmp / "runs")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result: dict[str, object] = {"python": sys.version.split()[0], "time": time.time()}
    dry = bench_dry_run(args.runs, args.warmup, env)
    result["dry_run"] = dry
    med = dry["median_s"]
    assert isinstance(med, dict)
    print(f"floor   {FLOOR.strip()!r}  median {med['floor'] * 1e3:7.1f} ms")
    print(
        f"dry-run python -m jobs submit --dry-run (no cache)  median {med['dry_run'] * 1e3:7.1f} ms"
    )
    package = med["package_floor"] * 1e3
    print(f"for scale: {PACKAGE_FLOOR!r}  median {package:7.1f} ms")
    one = med["one_model"] * 1e3
    print(f"for scale: that + one one-field pydantic model      median {one:7.1f} ms")
    print(f"ratio {dry['ratio']:.2f}x (goal <= {RATIO_GOAL}x)")
    print(f"against {PACKAGE_FLOOR!r}: {dry['ratio_package_floor']:.2f}x (no goal)")
    print(f"one-model against it: {dry['ratio_one_model']:.2f}x")
    ok = float(dry["ratio"]) <= RATIO_GOAL  # type: ignore[arg-type]
    if not args.no_cluster:
        cl = bench_cluster(env, tmp)
        result["cluster"] = cl
        if "array_tasks" in cl:
            print(
                f"sweep: {cl['array_tasks']} tasks as one array (job {cl['job_id']}) submitted in "
                f"{cl['submit_s']:.2f} s (goal < {SWEEP_GOAL_S} s)"
            )
            print(
                f"status of {cl['status_tasks']} tasks: {cl['status_s']:.2f} s, "
                f"{cl['status_slurm_calls']} Slurm command(s); array cancelled"
            )
            ok = ok and float(cl["submit_s"]) < SWEEP_GOAL_S  # type: ignore[arg-type]
            ok = ok and cl["status_slurm_calls"] == 1 and cl["status_tasks"] == 1000
        else:
            print(f"cluster benchmarks: {cl}")
    result["goals_met"] = ok
    out = REPO / "bench" / "results" / "cli.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out.relative_to(REPO)}; goals {'met' if ok else 'MISSED'}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
