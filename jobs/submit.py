"""Submit a loaded spec: a run directory, then sbatch (Slurm) or local processes, then records.

One code path for single jobs and sweeps: a sweep is one job array (several when it is bigger
than the cluster's MaxArraySize), one resolved spec per task, recorded as ONE run. The script
is :func:`jobs.render.sbatch_script`'s (rendered by submitit's executor), which ``--dry-run``
(:func:`dry_run`) prints too; the tasks' pickles are submitit's ``DelayedSubmission``s; sbatch
runs through :class:`cluster.client.SlurmClient` with its own environment (``os.environ`` is
never touched). In the allocation ``submitit.core._submit`` loads the task's pickle and calls it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster import ClusterError
from jobs import records
from jobs.errors import InputError, JobsError, SubmitError
from jobs.load import LoadedSpec, Task
from jobs.pids import wait_exec
from jobs.records import Plan
from jobs.render import asks_expedite, sbatch_script, submitit_folder, submitted_pickle
from jobs.slurmmap import timeout_min
from jobs.taskstart import first_note
from train import runfiles
from train.safepath import python_module_argv
from train.spec import dump_spec

if TYPE_CHECKING:
    from cluster import ClusterLimits, ClusterState, Slurm
    from jobs.spec import JobSpec


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
    # Quoted by the loader's own rules, so train reads back exactly these values ("y", "0o17").
    return dump_spec(data)


def _resolved_text(task: Task) -> str:
    return _yaml_text(_resolved_data(task.spec))


def dry_run(loaded: LoadedSpec, plan: Plan, template: str | None = None) -> str:
    """What ``submit`` would hand to sbatch (or ``sbatch_templates/TEMPLATE`` filled in).

    Both come from :func:`jobs.render.slurm_options`; nothing is written and no cluster is asked.
    """
    if template:
        from jobs.templates import render_template

        return render_template(template, loaded, loaded.path)
    size = len(loaded.tasks) if loaded.is_array else None
    # what each rank runs is in the script itself (jobs.render.rank_note)
    return sbatch_script(loaded.spec, plan.run_dir, size)


def dry_run_note(loaded: LoadedSpec) -> str | None:
    """A line for stderr when the sweep is bigger than one array can be by Slurm's default."""
    if not loaded.is_array:
        return None
    from cluster import ClusterLimits

    default = ClusterLimits().max_array_size
    if len(loaded.tasks) <= default:
        return None
    return (
        f"jobs: {len(loaded.tasks)} tasks are more than one array holds where MaxArraySize is "
        f"Slurm's default {default}: submit splits them into arrays of at most the cluster's "
        "MaxArraySize, each after the previous one (--dependency=afterany)"
    )


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
        # through the run directory's owner: never through a link planted in a shared run dir
        runfiles.make_dirs(plan.run_dir, runfiles.SLURM_DIR)
        runfiles.atomic_write(plan.run_dir / runfiles.SPEC, loaded.text, durable=False)
        if loaded.is_array:
            # The whole validated spec, sweep included, for people reading the run directory.
            text = _yaml_text(_resolved_data(loaded.spec, keep_sweep=True))
            runfiles.atomic_write(plan.run_dir / runfiles.RESOLVED, text, durable=False)
        out = []
        for task in loaded.tasks:
            task_dir = plan.task_dir(task.index if loaded.is_array else None)
            config = task_dir / "resolved.yaml"
            if lazy and loaded.is_array:
                pending = json.dumps(_resolved_data(task.spec), separators=(",", ":"))
                out.append(TaskFiles(task, config, task_dir, pending))
                continue
            runfiles.make_dirs(task_dir)
            runfiles.atomic_write(config, _resolved_text(task), durable=False)
            out.append(TaskFiles(task, config, task_dir))
    except OSError as exc:
        raise _cannot_make(plan, exc) from None
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


def submit(
    loaded: LoadedSpec,
    plan: Plan,
    client: Slurm | None,
    executor: str = "auto",
    *,
    preflight: bool = True,
    after: Sequence[str] = (),
) -> records.RunRecord:
    """Submit to Slurm (after the preflight) or run locally; ``auto``: Slurm when it answers.
    ``after``: sbatch options of the run's first job (a pipeline's ``--dependency``).

    Slurm costs one ``sinfo`` (which also tells ``auto`` that Slurm answers) and one sbatch per
    array; the array limits come from :func:`jobs.preflight.cluster_limits` (cached).
    """
    if executor == "local" or client is None:
        return submit_local(loaded, plan)
    from cluster import SlurmCommandError

    state: ClusterState | None = None
    if executor == "auto":
        answers = False
        if client.installed():
            try:
                if preflight:
                    state, answers = client.cluster_state(), True
                else:
                    answers = client.ping()
            except SlurmCommandError:
                answers = False
        if not answers:
            msg = "jobs: no Slurm cluster answers; running locally (--executor local)"
            print(msg, file=sys.stderr)
            return submit_local(loaded, plan)
    limit = None
    limits: ClusterLimits | None = None
    requested = loaded.spec.requeue.mode
    auto = requested in ("auto", "fastest") and not loaded.is_array
    if preflight:
        from jobs.preflight import (
            array_limit,
            check_sbatch_release,
            cluster_limits,
            save_lead_notes,
            sbatch_options,
            shapes_note,
        )
        from jobs.preflight import preflight as check

        state = state or client.cluster_state()  # the one sinfo of this submission
        partition = check(loaded.spec, client, loaded.where, state=state)
        # the options against this cluster's sbatch release (its --help, cached per cluster)
        live = sbatch_options(client, records.state_dir())
        check_sbatch_release(loaded.spec, live, loaded.where)
        for line in save_lead_notes(loaded.spec, [plan.run_dir], partition, state):
            print(line, file=sys.stderr)  # the warning fits the save (train.stop.lead)
        note = shapes_note(loaded.spec, state)  # resources.nodes "MIN-MAX": which shapes
        if note:
            print(note, file=sys.stderr)
        # the release and its restart levers (cached per slurm.conf, like the array limits):
        # exported to the ranks, --requeue=expedite where the cluster allows it
        limits = cluster_limits(client, records.state_dir())
        if loaded.is_array:
            limit = array_limit(len(loaded.tasks), limits, loaded.where)
        loaded, why = _chain_or_requeue(loaded, client, partition, limits)
    else:
        why = f"requeue.mode: {requested}"
    try:
        record = submit_slurm(
            loaded, plan, client, array_limit=limit, after=after, cluster=limits,
            restart_reason=why,
        )  # fmt: skip
    except SubmitError as exc:
        from jobs.chain import requeue_refused, with_mode

        # a site that refuses --requeue (a job submit plugin): the run as a chain (mode auto)
        if not (auto and loaded.spec.requeue.mode != "chain" and requeue_refused(str(exc))):
            raise
        why = f"requeue does not work here: sbatch refused --requeue ({_last_line(exc)})"
        _chain_note(loaded, f"sbatch refused --requeue ({exc})")
        loaded = with_mode(loaded, "chain")
        record = submit_slurm(
            loaded, plan, client, array_limit=limit, after=after, cluster=limits,
            restart_reason=why,
        )  # fmt: skip
    return record


def _chain_note(loaded: LoadedSpec, why: str) -> None:
    depth = loaded.spec.requeue.chain_depth
    print(
        f"jobs: requeue does not work here: {why}; the run goes as a chain of jobs, each "
        f"resuming from the last checkpoint ({depth} queued ahead; requeue.mode: requeue to "
        "submit it as one job anyway)",
        file=sys.stderr,
    )


def _chain_or_requeue(
    loaded: LoadedSpec, client: Slurm, partition: str, limits: ClusterLimits
) -> tuple[LoadedSpec, str]:
    """``requeue.mode`` auto or fastest resolved by the preflight, and why: chain where
    requeue does not work for this partition (jobs.chain.requeue_support); with fastest, chain
    also where a successor queued ahead is back sooner than a requeued job
    (jobs.chain.hold_against_successor, from ``limits``: the preflight's cached ``scontrol
    show config``, no query of its own); else requeue."""
    from jobs.chain import hold_against_successor, requeue_support, with_mode

    mode = loaded.spec.requeue.mode
    if mode == "chain" and loaded.is_array:
        raise SubmitError(
            f"{loaded.where(('requeue', 'mode'))}: requeue.mode: a sweep cannot run as a chain "
            "of jobs yet (submit its points as separate specs, or requeue.mode: requeue)"
        )
    if mode not in ("auto", "fastest"):
        return loaded, f"requeue.mode: {mode}"
    why = requeue_support(client, partition, records.state_dir())
    if why is None and mode == "fastest":
        sooner, reason = hold_against_successor(limits)
        if sooner and not loaded.is_array:
            print(f"jobs: a successor queued ahead is back sooner than a requeue here: "
                  f"{reason}; the run goes as a chain of jobs ({loaded.spec.requeue.chain_depth} "
                  "queued ahead; requeue.mode: requeue to keep one job)",
                  file=sys.stderr)  # fmt: skip
            return with_mode(loaded, "chain"), f"requeue.mode: fastest: {reason}"
        if sooner:
            reason += "; a sweep cannot be a chain yet"
        return with_mode(loaded, "requeue"), f"requeue.mode: fastest: {reason}"
    if why is None or loaded.is_array:
        if why is not None:
            print(f"jobs: requeue does not work here ({why}); a sweep cannot be a chain yet: "
                  "a preempted task is not resumed", file=sys.stderr)  # fmt: skip
            return with_mode(loaded, "requeue"), f"requeue does not work here: {why}"
        return with_mode(loaded, "requeue"), f"requeue.mode: {mode}: requeue works here"
    _chain_note(loaded, why)
    return with_mode(loaded, "chain"), f"requeue does not work here: {why}"


def submit_slurm(
    loaded: LoadedSpec,
    plan: Plan,
    client: Slurm,
    *,
    array_limit: int | None = None,
    after: Sequence[str] = (),
    cluster: ClusterLimits | None = None,
    restart_reason: str = "",
) -> records.RunRecord:
    """Submit through :class:`cluster.client.SlurmClient` (its environment, passed explicitly).

    Each task's :class:`~jobs.launch.TrainLaunch` is pickled in submitit's own
    ``DelayedSubmission`` (``RUN_DIR/slurm/JOBID[_N]_submitted.pkl``, read by
    ``submitit.core._submit`` in the allocation) and the script is
    :func:`jobs.render.sbatch_script`'s, the one ``--dry-run`` prints. A sweep is one array;
    when it has more tasks than ``array_limit`` (the cluster's MaxArraySize) it is several
    arrays of at most ``array_limit`` tasks, each after the previous one has ended
    (``--dependency=afterany``), so at most ``sweep.max_parallel`` tasks run at any time over
    all of them. All arrays go in or none: when one sbatch fails, the
    arrays already submitted are cancelled. ``cluster``: the preflight's
    :func:`jobs.preflight.cluster_limits` (the release, ``--requeue=expedite``; see
    :func:`jobs.render.sbatch_script`). ``restart_reason``: why the run comes back as it does
    (requeue or chain: the record's ``restart_mode``), as the preflight decided. Returns the
    saved record (one run).
    """
    plan = _claim(plan, lambda: client)  # before anything is written into it
    try:
        files = write_run_files(loaded, plan, lazy=True)
    except SubmitError:
        _release(plan)
        raise
    folder = submitit_folder(plan.run_dir)
    size = array_limit if loaded.is_array and array_limit else len(files)
    groups = [files[i : i + size] for i in range(0, len(files), size)]
    pending = folder / ".pending"
    job_ids: list[str] = []
    # a chain (jobs.chain): its first link and chain_depth links queued behind it, the same
    # script, each starting only when the one before did not complete
    chain = loaded.spec.requeue.mode == "chain" and not loaded.is_array
    if chain:
        groups = groups[:1] * (1 + loaded.spec.requeue.chain_depth)
    try:
        for k, group in enumerate(groups):
            pickles = _dump_launches(loaded, group, pending)
            count = len(group) if loaded.is_array else None
            path = plan.run_dir / ("sbatch.sh" if k == 0 or chain else f"sbatch-{k}.sh")
            if k == 0 or not chain:  # a chain's links share the one script
                script = sbatch_script(loaded.spec, plan.run_dir, count, cluster)
                runfiles.atomic_write(path, script, durable=False)
            dependency = "afternotok" if chain else "afterany"
            deps = [f"--dependency={dependency}:{job_ids[-1]}"] if job_ids else list(after)
            # sbatch from the caller's directory, as submitit did: the job's working directory.
            job_ids.append(client.submit(path, deps))
            for i, pkl in enumerate(pickles):
                jid = f"{job_ids[-1]}_{i}" if loaded.is_array else job_ids[-1]
                note = first_note_pending(pkl)
                if note.exists():  # before the pickle: the task reads it first
                    runfiles.rename(note, first_note(folder, jid))
                runfiles.rename(pkl, submitted_pickle(folder, jid))
    except (ClusterError, OSError) as exc:
        if job_ids:  # ours: submitted by this call a moment ago
            with contextlib.suppress(ClusterError):
                client.cancel(list(reversed(job_ids)), no_requeue=True)
        runfiles.remove_own_tree(pending)
        if not plan_is_explicit(loaded):
            runfiles.remove_own_tree(plan.run_dir)  # nothing of it runs (ours, made just now)
        else:
            _release(plan)
        if isinstance(exc, ClusterError):
            raise SubmitError(f"sbatch failed: {_last_line(exc)}") from exc
        raise SubmitError(f"{plan.run_dir}: cannot write the submission: {exc}") from exc
    with contextlib.suppress(OSError):
        pending.rmdir()
    record = new_record(loaded, plan, "slurm", files)
    if cluster is not None and asks_expedite(loaded.spec, cluster):
        # the script asked --requeue=expedite: the ledger shows the hold its requeue skipped
        record.expedited_hold_s = cluster.requeue_hold_s
    record.job_id = job_ids[0]
    record.cluster = client.cluster_name()
    # how a stop comes back, and why (issue 46: each recorded as what it was; jobs status)
    record.restart_mode = "chain" if chain else "requeue"
    record.restart_reason = restart_reason or f"requeue.mode: {loaded.spec.requeue.mode}"
    if chain:
        record.chain_job_ids = job_ids
    elif len(job_ids) > 1:
        record.array_job_ids = job_ids
        record.array_chunk = size
    _save(record)
    return record


def _dump_launches(loaded: LoadedSpec, group: list[TaskFiles], pending: Path) -> list[Path]:
    """One pickled :class:`~jobs.launch.TrainLaunch` per task, in submitit's
    ``DelayedSubmission`` (what its runtime loads; its ``dump``), under temporary names."""
    import pickle

    import cloudpickle
    from submitit.helpers import DelayedSubmission

    from jobs.launch import TrainLaunch, command_first

    minutes = timeout_min(loaded.spec)
    signal_name = loaded.spec.requeue.signal
    runfiles.make_dirs(pending.parent, pending.name)
    paths = []
    for f in group:
        entry = f.task.spec.entrypoint
        command = command_first(entry.command if entry is not None else None)
        launch = TrainLaunch(
            str(f.config),
            str(f.run_dir),
            signal_name,
            resolved=f.pending,
            command=command,
            stop_signal=str(entry.stop_signal) if command and entry is not None else "auto",
        )
        delayed = DelayedSubmission(launch)
        delayed.set_timeout(minutes, 0)  # 0 timeouts: submitit never requeues by itself
        paths.append(pending / f"{f.task.index}.pkl")
        # submitit's own pickling (DelayedSubmission.dump is cloudpickle.dump at the highest
        # protocol), written through the owner: never through a link planted in .pending
        data = cloudpickle.dumps(delayed, pickle.HIGHEST_PROTOCOL)
        runfiles.atomic_write(paths[-1], data, durable=False)
        if command:  # jobs.taskstart starts it before submitit loads: the same as the pickle's
            note = {"command": list(command), "run_dir": str(f.run_dir), "signal": signal_name,
                    "stop_signal": launch.stop_signal}  # fmt: skip
            runfiles.atomic_write(first_note_pending(paths[-1]), json.dumps(note), durable=False)
    return paths


def first_note_pending(pickle_path: Path) -> Path:
    """The first-start note written beside a task's pending pickle (``.pending/N.pkl``)."""
    return pickle_path.with_name(f"{pickle_path.stem}.first.json")


def plan_is_explicit(loaded: LoadedSpec) -> bool:
    """Whether the run directory is the user's ``train.run_dir`` (never removed by us)."""
    return bool(loaded.spec.train is not None and loaded.spec.train.run_dir)


def submit_local(loaded: LoadedSpec, plan: Plan) -> records.RunRecord:
    """Run the job on this machine: a detached supervisor starts the ranks (torchrun-style env)."""
    import subprocess

    plan = _claim(plan, _slurm_client)  # before anything is written into it
    try:
        files = write_run_files(loaded, plan)
    except SubmitError:
        _release(plan)
        raise
    record = new_record(loaded, plan, "local", files)
    records.save_record(record)  # the supervisor reads it
    log = os.fdopen(
        runfiles.open_fd(
            plan.run_dir / runfiles.SLURM_DIR / "supervisor.log",
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        ),
        "ab",
    )
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    try:
        proc = subprocess.Popen(
            python_module_argv("jobs.localrun", str(plan.run_dir)),
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
    # its command line proves it ours to every reader of the record (jobs.monitor.supervisor):
    # the record names it only once the line can be read
    wait_exec(proc.pid)
    record.pid = proc.pid
    record.job_id = f"local-{proc.pid}"
    _save(record)
    return record


def _slurm_client() -> Slurm:
    from cluster import slurm_client

    return slurm_client()


def _cannot_make(plan: Plan, exc: OSError) -> JobsError:
    if isinstance(exc, runfiles.RunDirError):  # the place the spec names: bad input (exit 2)
        return InputError(str(exc))
    return SubmitError(f"{plan.run_dir}: cannot create the run directory: {exc.strerror or exc}")


def _claim(plan: Plan, client: Callable[[], Slurm]) -> Plan:
    """The run directory, this submission's from now on (:mod:`jobs.claim`): refused in one line
    when it belongs to a run that is not over."""
    from jobs.claim import claim

    try:
        return claim(plan, client)
    except OSError as exc:
        raise _cannot_make(plan, exc) from None


def _release(plan: Plan) -> None:
    from jobs.claim import release

    release(plan)


def _save(record: records.RunRecord) -> None:
    try:
        records.save_record(record)
        records.append_index(record)
    except OSError as exc:
        raise SubmitError(f"submitted, but the run record could not be written: {exc}") from None


def _last_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__
