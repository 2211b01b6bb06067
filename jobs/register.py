"""Record a run that a plain ``sbatch`` of a template started, so ``jobs status/list/logs/plot``
see it like a ``jobs submit`` run.

    python -P -m jobs.register --config SPEC --job-id ID [--set K=V ...] [--run-dir DIR]
        [--world-size N] [--partition P] [--cluster NAME] [python -m train options...]

``sbatch_templates/*.sbatch`` run it at the start of each allocation, before the step, from the
folder sbatch ran in. It decides the run directory and prints it (one line on stdout):
``--run-dir`` (the template's ``RUN_DIR``, or a ``--run-dir`` among train's options), else the
spec's ``train.run_dir``, else ``RUNS/NAME-jobID`` where RUNS is ``$SLURM_TRAIN_RUNS_DIR`` or the
state folder's ``runs/`` (never the submission folder: a checkout stays clean).

The first time (a new job id) it claims the directory (:func:`jobs.claim.claim`: refused, one
line and exit 2, when it is another run's that is not over), writes ``spec.yaml``,
``resolved.yaml`` and ``run.json``, and adds one line to the run index of the user the job runs
as, all through :mod:`train.runfiles`. A requeued job (the same job id, its ``run.json`` there)
is registered already: nothing is written twice, and a start cut short between ``run.json`` and
the index line is completed. Torch-free.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cluster.errors import BadInputError
from jobs import records
from jobs.claim import claim, owner_id
from jobs.errors import JobsError, RunNotFoundError
from jobs.load import load_spec
from jobs.records import Plan, RunRecord
from jobs.submit import new_record, write_run_files

__all__ = ["main", "register", "template_run_dir"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jobs.register",
        description="record a run started by sbatch of a template; print its run directory",
    )
    p.add_argument("--config", required=True, help="the spec the template runs")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    p.add_argument("--run-dir", default=None, help="the run directory (default: see above)")
    p.add_argument("--job-id", required=True, help="SLURM_JOB_ID")
    p.add_argument("--world-size", type=int, default=0, help="SLURM_NTASKS")
    p.add_argument("--partition", default="", help="SLURM_JOB_PARTITION")
    p.add_argument("--cluster", default="", help="SLURM_CLUSTER_NAME")
    return p


def template_run_dir(name: str, job_id: str, spec_run_dir: str | None) -> Path:
    """Where a template's run lives when no ``--run-dir`` is given (see the module's doc)."""
    if spec_run_dir:
        return Path(spec_run_dir).absolute()
    root = os.environ.get(records.RUNS_ENV) or records.state_dir() / "runs"
    return Path(root).absolute() / f"{name}-job{job_id}"


def _indexed(run_id: str) -> bool:
    return any(e.get("run_id") == run_id for e in records.read_index(report=False))


def register(args: argparse.Namespace) -> Path:
    """Record the run (once per job id) and return its directory."""
    if not args.job_id.strip():
        raise BadInputError("jobs.register: --job-id is empty (run the template with sbatch)")
    loaded = load_spec(args.config, args.overrides)
    if loaded.is_array:
        raise BadInputError(
            f"{args.config}: has a sweep: section; this template runs one configuration "
            "(use sbatch_templates/array.sbatch, or python -m jobs submit)"
        )
    spec = loaded.spec
    run_id = f"{spec.name}-job{args.job_id}"
    spec_dir = spec.train.run_dir if spec.train is not None else None
    run_dir = (
        Path(args.run_dir).absolute()
        if args.run_dir
        else template_run_dir(spec.name, args.job_id, spec_dir)
    )
    try:
        record: RunRecord | None = records.load_record(run_dir)
    except RunNotFoundError:
        record = None
    plan = Plan(run_id, run_dir, explicit=True)
    if record is None or record.run_id != run_id:
        if owner_id(run_dir) != run_id:  # not a start of ours cut short: claim it
            from cluster import slurm_client

            claim(plan, slurm_client)
        files = write_run_files(loaded, plan)
        record = new_record(loaded, plan, "slurm", files)
        record.job_id = args.job_id
        record.world_size = args.world_size or spec.world_size
        record.partition = args.partition or record.partition
        record.cluster = args.cluster
        records.save_record(record)
    if not _indexed(run_id):
        records.append_index(record)
    return run_dir


def main(argv: Sequence[str] | None = None) -> int:
    # train's own options after the spec pass through: only --set and --run-dir are ours
    args, _ = _parser().parse_known_args(argv)
    try:
        run_dir = register(args)
    except BadInputError as exc:  # a bad spec, a run dir that is another run's: one line
        print(f"jobs.register: {exc}", file=sys.stderr)
        return 2
    except (JobsError, OSError) as exc:
        print(f"jobs.register: {exc}", file=sys.stderr)
        return 1
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
