"""Submit a loaded spec: a run directory, then submitit (Slurm) or local processes, then records.

One code path for single jobs and sweeps: a sweep is ONE job array (``submit_array``), one
resolved spec per task. ``render.slurm_parameters`` feeds both this and ``--dry-run``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from jobs import records
from jobs.errors import SubmitError
from jobs.load import LoadedSpec, Task
from jobs.records import Plan
from jobs.render import slurm_parameters, submitit_folder

if TYPE_CHECKING:
    from cluster.client import SlurmClient
    from jobs.spec import JobSpec

_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def make_plan(loaded: LoadedSpec, root: Path) -> Plan:
    """Run id and directory for a loaded spec (``train.run_dir`` wins for a single job)."""
    spec = loaded.spec
    explicit = spec.train.run_dir if spec.train is not None and not loaded.is_array else None
    return Plan.new(spec.name, explicit, root)


def _resolved_data(spec: JobSpec, *, keep_sweep: bool = False) -> dict[str, Any]:
    data = spec.model_dump(mode="json", exclude_none=True)
    if not keep_sweep:
        data.pop("sweep", None)
    return data


def _yaml_text(data: dict[str, Any]) -> str:
    text: str = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    return text


def _resolved_text(task: Task) -> str:
    return _yaml_text(_resolved_data(task.spec))


@dataclass(frozen=True)
class TaskFiles:
    """Where one task's resolved spec lives; ``pending`` holds it (JSON) when not yet written."""

    task: Task
    config: Path
    run_dir: Path
    pending: str = ""


def write_run_files(loaded: LoadedSpec, plan: Plan, *, lazy: bool = False) -> list[TaskFiles]:
    """Create the run directory with the spec as written and the resolved spec(s).

    ``lazy`` (big sweeps on Slurm): the array tasks' resolved specs travel inside their pickles
    and each task writes its own RUN_DIR/tasks/N/resolved.yaml when it starts; on a slow shared
    file system 1000 directories and files at submission would cost seconds.
    """
    try:
        (plan.run_dir / "slurm").mkdir(parents=True, exist_ok=True)
        (plan.run_dir / "spec.yaml").write_text(loaded.text, encoding="utf-8")
        if loaded.is_array:
            # The whole validated spec, sweep included, for people reading the run directory.
            text = _yaml_text(_resolved_data(loaded.spec, keep_sweep=True))
            (plan.run_dir / "resolved.yaml").write_text(text, encoding="utf-8")
        out = []
        for task in loaded.tasks:
            task_dir = plan.task_dir(task.index if loaded.is_array else None)
            config = task_dir / "resolved.yaml"
            if lazy and loaded.is_array:
                pending = json.dumps(_resolved_data(task.spec), separators=(",", ":"))
                out.append(TaskFiles(task, config, task_dir, pending))
                continue
            task_dir.mkdir(parents=True, exist_ok=True)
            config.write_text(_resolved_text(task), encoding="utf-8")
            out.append(TaskFiles(task, config, task_dir))
    except OSError as exc:
        raise SubmitError(f"{plan.run_dir}: cannot create the run directory: {exc}") from None
    return out


def new_record(
    loaded: LoadedSpec, plan: Plan, executor: str, files: list[TaskFiles]
) -> records.RunRecord:
    return records.RunRecord(
        run_id=plan.run_id,
        name=loaded.spec.name,
        run_dir=str(plan.run_dir),
        executor=executor,
        max_parallel=loaded.spec.sweep.max_parallel if loaded.spec.sweep else 1,
        array_size=len(loaded.tasks) if loaded.is_array else None,
        submitted_at=time.time(),
        spec_path=str(loaded.path.absolute()),
        overrides=loaded.overrides,
        tasks=[records.TaskRecord(f.task.index, str(f.run_dir), f.task.values) for f in files],
        world_size=loaded.spec.world_size,
        partition=loaded.spec.resources.partition or "",
    )


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """submitit runs sbatch with os.environ: lend it the client's (SLURM_CONF) for the call."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def submit_slurm(loaded: LoadedSpec, plan: Plan, client: SlurmClient) -> records.RunRecord:
    """One sbatch call through submitit; a sweep is one array. Returns the saved record."""
    import submitit

    from jobs.launch import TrainLaunch

    files = write_run_files(loaded, plan, lazy=True)
    signal_name = loaded.spec.requeue.signal
    launches = [
        TrainLaunch(str(f.config), str(f.run_dir), signal_name, resolved=f.pending) for f in files
    ]
    folder = submitit_folder(plan.run_dir)
    # submitit echoes sbatch's stderr on failure; the error below carries it as one line.
    with _environ(client.env()), contextlib.redirect_stderr(io.StringIO()):
        try:
            # max_num_timeout=0 and a callable without .checkpoint: submitit never requeues by
            # itself; train's guard decides (budgets in the spec's requeue section).
            executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
            executor.update_parameters(**slurm_parameters(loaded.spec))
            if loaded.is_array:
                jobs = executor.submit_array(launches)
            else:
                jobs = [executor.submit(launches[0])]
        except Exception as exc:  # submitit raises plain RuntimeErrors for sbatch failures
            if not (loaded.spec.train is not None and loaded.spec.train.run_dir):
                shutil.rmtree(plan.run_dir, ignore_errors=True)  # nothing was submitted
            raise SubmitError(f"sbatch failed: {_last_line(exc)}") from exc
    record = new_record(loaded, plan, "slurm", files)
    record.job_id = jobs[0].job_id.split("_", 1)[0]
    script = folder / f"{jobs[0].job_id}_submission.sh"
    with contextlib.suppress(OSError):  # a convenience copy; the record does not need it
        (plan.run_dir / "sbatch.sh").write_text(script.read_text("utf-8"), encoding="utf-8")
    _save(record)
    return record


def submit_local(loaded: LoadedSpec, plan: Plan) -> records.RunRecord:
    """Run the job on this machine: a detached supervisor starts the ranks (torchrun-style env)."""
    import subprocess

    files = write_run_files(loaded, plan)
    record = new_record(loaded, plan, "local", files)
    records.save_record(record)  # the supervisor reads it
    log = (plan.run_dir / "slurm" / "supervisor.log").open("ab")
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.localrun", str(plan.run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # outlives this shell, like a batch job
        )
    except OSError as exc:
        raise SubmitError(f"cannot start the local run: {exc}") from None
    finally:
        log.close()
    record.pid = proc.pid
    record.job_id = f"local-{proc.pid}"
    _save(record)
    return record


def _save(record: records.RunRecord) -> None:
    try:
        records.save_record(record)
        records.append_index(record)
    except OSError as exc:
        raise SubmitError(f"submitted, but the run record could not be written: {exc}") from None


def _last_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__
