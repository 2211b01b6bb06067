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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cluster import BadInputError
from jobs import records
from jobs.claim import claim, owner_id
from jobs.errors import JobsError, RunNotFoundError
from jobs.load import load_spec
from jobs.records import Plan, RunRecord
from jobs.submit import new_record, write_run_files
from train import runfiles

if TYPE_CHECKING:
    from jobs.load import LoadedSpec

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
    p.add_argument(
        "--name", default="", help="SLURM_JOB_NAME: the run's name when the spec has none"
    )
    return p


def template_run_dir(name: str, job_id: str, spec_run_dir: str | None) -> Path:
    """Where a template's run lives when no ``--run-dir`` is given (see the module's doc)."""
    if spec_run_dir:
        return Path(spec_run_dir).absolute()
    root = os.environ.get(records.RUNS_ENV) or records.state_dir() / "runs"
    return Path(root).absolute() / f"{name}-job{job_id}"


def _indexed(run_id: str) -> bool:
    return any(e.get("run_id") == run_id for e in records.read_index(report=False))


def _spec_run_dir(config: str, overrides: Sequence[str]) -> str | None:
    """train.run_dir as train reads it (None when train cannot read the spec either)."""
    from train.errors import ConfigError
    from train.spec import load_run_config

    try:
        run = load_run_config(config, overrides)
    except (ConfigError, OSError):
        return None
    return run.train.run_dir


def register(args: argparse.Namespace) -> Path:
    """Record the run (once per job id) and return its directory."""
    if not args.job_id.strip():
        raise BadInputError("--job-id is empty (run the template with sbatch)")
    try:
        loaded: LoadedSpec | None = load_spec(args.config, args.overrides)
    except BadInputError as exc:
        # A spec python -m train takes may not be a whole job spec (the template's #SBATCH
        # lines are its resources): recorded with what the job says, not refused
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(
            f"jobs.register: not a whole job spec ({first}): recorded without it", file=sys.stderr
        )
        loaded = None
    if loaded is not None and loaded.is_array:
        raise BadInputError(
            f"{args.config}: has a sweep: section; this template runs one configuration "
            "(use sbatch_templates/array.sbatch, or python -m jobs submit)"
        )
    name = loaded.spec.name if loaded is not None else (args.name or "sbatch")
    run_id = f"{name}-job{args.job_id}"
    run_dir = (
        Path(args.run_dir).absolute()
        if args.run_dir
        else template_run_dir(name, args.job_id, _spec_run_dir(args.config, args.overrides))
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
        if loaded is not None:
            record = new_record(loaded, plan, "slurm", write_run_files(loaded, plan))
        else:
            runfiles.make_dirs(run_dir, runfiles.SLURM_DIR)
            record = RunRecord(
                run_id, name, str(run_dir), "slurm", submitted_at=time.time(),
                spec_path=str(Path(args.config).absolute()), overrides=list(args.overrides),
                tasks=[records.TaskRecord(0, str(run_dir))],
            )  # fmt: skip
        record.job_id = args.job_id
        record.world_size = args.world_size or record.world_size
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
    except BadInputError as exc:  # a run dir that is another run's, a state folder not ours
        print(f"jobs.register: {exc}", file=sys.stderr)
        return 2
    except (JobsError, OSError) as exc:
        print(f"jobs.register: {exc}", file=sys.stderr)
        return 1
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
