"""``python -m bench`` (= ``make bench``): run every benchmark, write one report.

    python -m bench [--only cli,train,...] [--quick] [--repeats N] [--out DIR] [--strict]

Writes ``DIR/report.md`` and ``DIR/report.json`` (default ``bench/results/``, git-ignored)
and prints the markdown table. A benchmark that cannot run here (no cluster, no CUDA) reports
``skipped: <reason>``; one that crashes reports ``error: ...``; the others still run.
Exit status 0, or with ``--strict`` 1 when a figure misses its goal or errored.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from bench.common import REPO, Figure, Options, errored, machine_meta, skipped, write_report

#: name -> (module, section shown when the module cannot even be imported)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "cli": ("bench.cli_figures", "Command line"),
    "data": ("bench.bench_data", "Data pipeline (CPU, 1 thread)"),
    "train": ("bench.bench_train", "Training throughput (CPU)"),
    "ckpt": ("bench.bench_ckpt", "Checkpoints"),
    "preempt": ("bench.bench_preempt", "Preemption (local Slurm cluster)"),
    "follow": ("bench.bench_follow", "Polling (local Slurm cluster)"),
    "gpu": ("bench.bench_gpu", "GPU path (CIFAR-10)"),
    "refuse": ("bench.bench_refuse", "Bad input (issue 12)"),
    "watchdog": ("bench.bench_watchdog", "Hang watchdog (issue 15)"),
    "inplace": ("bench.bench_inplace", "Restart in place (local Slurm cluster)"),
    "goodput": ("bench.bench_goodput", "Goodput under preemption (local Slurm cluster)"),
    "remote": ("bench.bench_remote", "From your laptop (local Slurm cluster over SSH)"),
}
DEFAULT_CONF = "/var/tmp/slurm-train-cluster/etc/slurm.conf"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    p.add_argument("--quick", action="store_true", help="fewer rounds and steps (smoke run)")
    p.add_argument("--repeats", type=int, default=5, help="measured rounds per figure (max)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="report dir")
    p.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    p.add_argument("--debug", action="store_true", help="print tracebacks of failed benchmarks")
    return p


def _run_one(name: str, opts: Options, debug: bool) -> list[Figure]:
    module_name, section = BENCHMARKS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return [skipped(section, name, f"{module_name.replace('.', '/')}.py does not exist")]
        return [errored(section, name, exc)]
    t0 = time.monotonic()
    try:
        figures: list[Figure] = module.run(opts)
    except Exception as exc:
        if debug:
            traceback.print_exc()
        return [errored(section, name, exc)]
    opts.log(f"{name}: done in {time.monotonic() - t0:.0f} s")
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks and write the report; returns the exit status."""
    args = _parser().parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"error: unknown benchmark(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    conf = os.environ.get("SLURM_CONF") or (DEFAULT_CONF if Path(DEFAULT_CONF).is_file() else None)
    workdir = args.out / "work"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    opts = Options(
        repeats=max(1, args.repeats), quick=args.quick, workdir=workdir.resolve(), slurm_conf=conf
    )
    t0 = time.monotonic()
    figures: list[Figure] = []
    for name in names:
        opts.log(f"{name}: start")
        figures.extend(_run_one(name, opts, args.debug))
    meta = {
        **machine_meta(),
        "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "total time": f"{time.monotonic() - t0:.0f} s",
    }
    md, js = write_report(figures, args.out, meta)
    shutil.rmtree(workdir, ignore_errors=True)
    print(md.read_text(encoding="utf-8"))
    print(f"(written to {md} and {js})")
    bad = [f for f in figures if f.status in ("fail", "error")]
    return 1 if args.strict and bad else 0


if __name__ == "__main__":
    sys.exit(main())
