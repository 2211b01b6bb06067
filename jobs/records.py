"""Run directories and the run index, so later shells can find a submission.

    RUN_DIR/spec.yaml        the spec as written
    RUN_DIR/resolved.yaml    the validated spec after --set (array: RUN_DIR/tasks/N/resolved.yaml)
    RUN_DIR/run.json         job ids, executor, times, sweep points (this module's RunRecord)
    RUN_DIR/sbatch.sh        the script that was submitted (slurm executor)
    RUN_DIR/slurm/           submitit pickles and per-rank logs  JOB_RANK_log.out
    RUN_DIR/events.jsonl     requeue history, written by train (read here, never written)

The names, who writes and who reads each one: :data:`train.runfiles.LAYOUT`; every write goes
through :mod:`train.runfiles` (``run.json`` atomically, never through a link).

The index is one JSON line per submission in ``$SLURM_TRAIN_STATE_DIR/runs.jsonl`` (default
``${XDG_STATE_HOME:-~/.local/state}/slurm-train/runs.jsonl``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jobs.errors import RunNotFoundError
from train import runfiles
from train.schema import METRIC, Schema, check_lines, report

STATE_ENV = "SLURM_TRAIN_STATE_DIR"
RUNS_ENV = "SLURM_TRAIN_RUNS_DIR"
RECORD = runfiles.RUN_RECORD


def state_dir() -> Path:
    """Where the run index lives (``$SLURM_TRAIN_STATE_DIR`` overrides, e.g. in tests)."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "slurm-train"


def index_path() -> Path:
    return state_dir() / runfiles.RUN_INDEX


def ensure_state_dir() -> Path:
    """The state folder, for a write: made (no writes of others: ``0755`` at most) or proven
    this user's (a directory, not a link, ours: :func:`train.runfiles.private_dir`); another
    user's folder or a planted link raises :class:`train.runfiles.NotOursError` (one line)."""
    d = state_dir()
    return runfiles.private_dir(d.parent, d.name, mode=0o755)


def runs_root(explicit: str | None = None) -> Path:
    """Parent of new run directories: ``--runs-dir``, ``$SLURM_TRAIN_RUNS_DIR`` or ``./runs``."""
    return Path(explicit or os.environ.get(RUNS_ENV) or "runs").absolute()


@dataclass(frozen=True)
class Plan:
    """Where a submission will live; known before anything is written (``--dry-run``)."""

    run_id: str
    run_dir: Path

    explicit: bool = False

    @classmethod
    def new(cls, name: str, explicit_dir: str | None, root: Path) -> Plan:
        """A fresh run id (48 random bits after the second); ``explicit_dir`` (the spec's
        train.run_dir) is the user's choice, e.g. to resume an earlier run in place."""
        run_id = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(6).hex()}"
        if explicit_dir:
            return cls(run_id, Path(explicit_dir).absolute(), explicit=True)
        return cls(run_id, root / run_id)

    def claim(self, attempts: int = 5) -> Plan:
        """Create the run directory exclusively and return the plan that owns it.

        A generated directory that already exists belongs to another submission: a fresh id
        is drawn (never ``exist_ok``: two submissions must never share one directory). An
        explicit ``train.run_dir`` is the user's to reuse and is only made sure to exist.
        """
        if self.explicit:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            return self
        plan = self
        for _ in range(attempts):
            plan.run_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                plan.run_dir.mkdir()
                return plan
            except FileExistsError:
                name = plan.run_id.rsplit("-", 3)[0]
                plan = Plan.new(name, None, plan.run_dir.parent)
        raise FileExistsError(
            f"{self.run_dir.parent}: no free run directory after {attempts} tries"
        )

    def task_dir(self, index: int | None) -> Path:
        """train's run directory for array task ``index`` (None: the job is not an array)."""
        return self.run_dir if index is None else self.run_dir / runfiles.TASKS_DIR / str(index)


@dataclass
class TaskRecord:
    """One array task (or the only task): its sweep values and train's run directory."""

    index: int
    run_dir: str
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunRecord:
    """Everything ``status``/``logs``/``cancel`` need about one submission."""

    run_id: str
    name: str
    run_dir: str
    executor: str
    job_id: str = ""
    array_size: int | None = None
    max_parallel: int = 1
    submitted_at: float = 0.0
    spec_path: str = ""
    overrides: list[str] = field(default_factory=list)
    tasks: list[TaskRecord] = field(default_factory=list)
    world_size: int = 1
    partition: str = ""
    pid: int | None = None
    # A sweep bigger than the cluster's MaxArraySize is several arrays, one run (jobs.submit):
    # the id of each array in order (job_id is the first) and the tasks per array.
    array_job_ids: list[str] = field(default_factory=list)
    array_chunk: int = 0
    # The Slurm cluster it was submitted to (slurm.conf's ClusterName; "" before it was kept):
    # a job id means something only on its own cluster.
    cluster: str = ""
    # A run submitted as a chain of jobs (jobs.chain; requeue.mode chain): every link's job id
    # in submission order (job_id is the first); links queue the next ones and add them here.
    chain_job_ids: list[str] = field(default_factory=list)
    # A stage of a pipeline (jobs.pipeline): the pipeline's id, the stage's name, and the job
    # ids of the next stage waiting on this one (``dependents_after``: ok or any).
    pipeline: str = ""
    stage: str = ""
    dependents: list[str] = field(default_factory=list)
    dependents_after: str = ""
    # `jobs cancel` asked (mark_cancel): when, and which ids (a job, an array or one task;
    # every id of the run for the whole run). status/list show CANCELLING until it is over.
    cancel_requested_at: float | None = None
    cancel_targets: list[str] = field(default_factory=list)
    # Submitted with --requeue=expedite (the cluster allows it, issue 43): the hold in seconds
    # its requeue after a node failure skips (ClusterLimits.requeue_hold_s: requeue_delay,
    # else cred_expire, as the preflight read them); None: a plain requeue, held as usual.
    expedited_hold_s: int | None = None
    # How a stopped run of Slurm's comes back (issue 46): requeue (the same job) or chain (a
    # successor queued ahead, jobs.chain), and why, as jobs submit's preflight decided.
    restart_mode: str = ""
    restart_reason: str = ""

    def cancel_requested(self, task_job_id: str) -> bool:
        """``jobs cancel`` asked to cancel this task (its id, its array's or the job's)."""
        if self.cancel_requested_at is None:
            return False
        return any(task_job_id == t or task_job_id.startswith(f"{t}_") for t in self.cancel_targets)

    def slurm_job_ids(self) -> list[str]:
        """The Slurm job id of every array, of every link of a chain, or of the job of this run,
        in submission order."""
        if self.chain_job_ids:
            return list(self.chain_job_ids)
        return list(self.array_job_ids) or ([self.job_id] if self.job_id else [])

    def job_ids(self) -> list[str]:
        """Slurm ids of every task: ``["12"]`` or ``["12_0", "12_1", ...]`` (task i of a split
        sweep is ``array_job_ids[i // array_chunk]_{i % array_chunk}``)."""
        if not self.job_id:
            return []
        if self.array_size is None:
            return [self.job_id]
        if self.array_job_ids and self.array_chunk > 0:
            ids, n = self.array_job_ids, self.array_chunk
            return [f"{ids[min(t.index // n, len(ids) - 1)]}_{t.index % n}" for t in self.tasks]
        return [f"{self.job_id}_{t.index}" for t in self.tasks]

    def log_file(self, task_job_id: str, rank: int) -> Path:
        """Per-rank log of one task (submitit's ``%j_%t_log.out`` naming, local runs alike)."""
        return Path(self.run_dir) / runfiles.SLURM_DIR / f"{task_job_id}_{rank}_log.out"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> RunRecord:
        """A record from its JSON, through :data:`RUN_RECORD`; a damaged or foreign run.json
        raises ValueError (what does not fit)."""
        why = RUN_RECORD.problem(data)
        if why is not None:
            raise ValueError(why)
        fields = cls.__dataclass_fields__
        known = {k: v for k, v in data.items() if k in fields and v is not None}
        for key in ("run_id", "name", "run_dir", "executor"):
            if not known[key]:
                raise ValueError(f"{key}: empty")
        tasks = []
        for task in known.get("tasks", []):
            why = TASK_RECORD.problem(task)
            if why is not None:
                raise ValueError(f"tasks: {why}")
            tasks.append(TaskRecord(task["index"], task["run_dir"], task.get("values") or {}))
        known["tasks"] = tasks
        return cls(**known)


# RUN_DIR/run.json: the fields of RunRecord and their types (train.schema).
RUN_RECORD = Schema(
    "run record",
    required={"run_id": "str", "name": "str", "run_dir": "str", "executor": "str"},
    optional={
        "job_id": "str",
        "array_size": "count",
        "max_parallel": "count",
        "submitted_at": "time",
        "spec_path": "str",
        "overrides": "list[str]",
        "tasks": "list[dict]",
        "world_size": "count",
        "partition": "str",
        "pid": "int",
        "array_job_ids": "list[str]",
        "array_chunk": "count",
        "cluster": "str",
        "chain_job_ids": "list[str]",
        "pipeline": "str",
        "stage": "str",
        "dependents": "list[str]",
        "dependents_after": "str",
        "cancel_requested_at": "time",
        "cancel_targets": "list[str]",
        "expedited_hold_s": "count",
        "restart_mode": "str",
        "restart_reason": "str",
    },
)
TASK_RECORD = Schema(
    "task", required={"index": "count", "run_dir": "str"}, optional={"values": "dict"}
)
# One line of $SLURM_TRAIN_STATE_DIR/runs.jsonl (append_index writes it).
INDEX_ENTRY = Schema(
    "index entry",
    required={"run_dir": "str"},
    optional={
        "run_id": "str",
        "name": "str",
        "job_id": "str",
        "executor": "str",
        "submitted_at": "time",
        "submit_dir": "str",
    },
)


def save_record(record: RunRecord) -> None:
    """Write RUN_DIR/run.json atomically (another shell may read it at any time), never
    through a link (:func:`train.runfiles.atomic_write`)."""
    runfiles.atomic_write(Path(record.run_dir) / RECORD, record.to_json() + "\n")


def mark_cancel(record: RunRecord, targets: list[str]) -> RunRecord:
    """Record in RUN_DIR/run.json that ``jobs cancel`` asked to cancel ``targets`` (job, array
    or task ids) now: ``status``/``list`` show the cancel (CANCELLING) from this record until
    Slurm or the local supervisor confirms it. Re-read first: the newest record is the one
    kept (a submission may have added arrays since ``record`` was read)."""
    try:
        current = load_record(record.run_dir)
    except RunNotFoundError:
        current = record
    if current.run_id != record.run_id:  # another submission's directory by now: not ours
        return record
    current.cancel_requested_at = time.time()
    current.cancel_targets = list(dict.fromkeys([*current.cancel_targets, *targets]))
    save_record(current)
    return current


def load_record(run_dir: str | Path) -> RunRecord:
    """RUN_DIR/run.json; a missing, damaged or foreign one raises RunNotFoundError (one line)."""
    path = Path(run_dir) / RECORD
    try:
        return _read_record(path)
    except (OSError, ValueError, TypeError, RecursionError) as exc:
        raise RunNotFoundError(f"{path}: not a readable run record ({exc})") from None


def _read_record(path: Path) -> RunRecord:
    return RunRecord.from_dict(json.loads(path.read_bytes().decode("utf-8")))


def append_index(record: RunRecord) -> None:
    """Add one line to the index (O_APPEND: concurrent submissions do not interleave lines),
    in the state folder proven ours, never through a link."""
    path = ensure_state_dir() / runfiles.RUN_INDEX
    line = json.dumps(
        {
            "run_id": record.run_id,
            "name": record.name,
            "run_dir": record.run_dir,
            "job_id": record.job_id,
            "executor": record.executor,
            "submitted_at": record.submitted_at,
            # where the command of the run runs (jobs.workdir: an earlier run's files there)
            "submit_dir": os.getcwd(),
        },
        sort_keys=True,
    )
    runfiles.append_line(path, line, durable=False)  # a torn last line is not glued onto


def read_index(report: bool = True) -> list[dict[str, Any]]:
    """Index entries, oldest first, each through :data:`INDEX_ENTRY`. A damaged line (a bad
    byte, torn JSON, a foreign entry, a field of the wrong type) is skipped and, with
    ``report``, named in one line on stderr; the others are all returned."""
    try:
        data = index_path().read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return []
    good: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, entry in check_lines(data.split(b"\n")):
        if entry is not None and INDEX_ENTRY.problem(entry) is None and entry["run_dir"]:
            good.append(entry)
        elif number:  # 0: the last line, still being written
            bad.append(number)
    if report and bad:
        where = f" (line {', '.join(map(str, bad[:5]))}{', ...' if len(bad) > 5 else ''})"
        print(
            f"jobs: warning: {index_path()}: skipped {len(bad)} damaged "
            f"entr{'y' if len(bad) == 1 else 'ies'}{where}",
            file=sys.stderr,
        )
    return good


def iter_records() -> Iterator[RunRecord]:
    """Records of indexed runs whose directory still exists, newest first; a damaged run.json
    is reported in one line and skipped (one bad run never hides the others)."""
    for _, record in _indexed():
        if isinstance(record, RunRecord):
            yield record
        else:
            report(record.path, "run", [(0, record.why)])


@dataclass(frozen=True)
class _Unreadable:
    path: Path
    why: str


def _indexed() -> Iterator[tuple[dict[str, Any], RunRecord | _Unreadable]]:
    seen: set[str] = set()
    for entry in reversed(read_index()):
        run_dir = entry["run_dir"]
        path = Path(run_dir) / RECORD
        if run_dir in seen or not path.exists():
            continue
        seen.add(run_dir)
        try:
            yield entry, _read_record(path)
        except (OSError, ValueError, TypeError, RecursionError) as exc:
            yield entry, _Unreadable(path, str(exc))


def find_run(query: str | None) -> RunRecord:
    """A run by run id, job id (``12``, ``12_3``), name (newest) or run directory; None: newest."""
    if query and (Path(query) / RECORD).exists():
        return load_record(query)
    base = query.split("_", 1)[0] if query and query.split("_", 1)[0].isdigit() else None
    for entry, record in _indexed():
        if isinstance(record, _Unreadable):
            if query is not None and query in (entry.get(k) for k in ("run_id", "name", "job_id")):
                raise RunNotFoundError(f"{record.path}: not a readable run record ({record.why})")
            report(record.path, "run", [(0, record.why)])
            continue
        if query is None or query in (record.run_id, record.name, record.job_id):
            return record
        if base is not None and base in record.slurm_job_ids():
            return record
    if query is None:
        raise RunNotFoundError(f"no runs recorded yet in {index_path()} (submit one first)")
    raise RunNotFoundError(
        f"no run matches {query!r} in {index_path()} (give a run id, a job id or a name; "
        "`python -m jobs list` shows them)"
    )


def latest_progress(run_dir: str | Path, tail_bytes: int = 16384) -> dict[str, Any]:
    """Newest step, loss and test accuracy from train's RUN_DIR/metrics.jsonl (its tail only)."""
    path = Path(run_dir) / runfiles.METRICS_FILE
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - tail_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return {}
    progress: dict[str, Any] = {}
    unfit: list[tuple[int, str]] = []
    for line in lines:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue  # the first (cut) or last (being written) line
        why = METRIC.problem(rec)
        if why is not None:  # typed (train.schema): a damaged or foreign record is skipped
            unfit.append((0, why))
            continue
        if rec.get("kind") == "train":
            progress.update(step=rec.get("step"), loss=rec.get("loss"))
        elif rec.get("kind") == "eval" and rec.get("test_accuracy") is not None:
            progress["test_accuracy"] = rec["test_accuracy"]
    if unfit:
        report(path, METRIC.kind, unfit)
    return progress


def describe_progress(progress: dict[str, Any]) -> str:
    """e.g. ``step 64 loss 0.421 test acc 99.2%``."""
    parts = []
    if progress.get("step") is not None:
        parts.append(f"step {progress['step']}")
    if isinstance(progress.get("loss"), int | float):
        parts.append(f"loss {progress['loss']:.3f}")
    if isinstance(progress.get("test_accuracy"), int | float):
        parts.append(f"test acc {100 * progress['test_accuracy']:.1f}%")
    return " ".join(parts)
