"""The spec -> Slurm options (sbatch + srun) and the exact sbatch script, rendered by submitit.

:func:`slurm_options` is the sbatch options of :data:`jobs.slurmmap.ROWS` (THE table) and the
srun options of ``launch``. Everything that asks Slurm for resources comes from it:
:func:`sbatch_script` (the script the real submission hands to sbatch and ``--dry-run`` prints,
so what is shown is what is submitted; rendered by submitit's ``SlurmExecutor`` through
:class:`jobs.executor.TrainExecutor`) and :mod:`jobs.templates` (the ``#SBATCH`` block of
``--template NAME``). GPUs are asked for one way only, ``--gres=gpu:N`` (works with
select/cons_res and cons_tres alike), and the time limit is written as ``[D-]HH:MM:SS``
rounded up to whole minutes (Slurm's granularity).

Ours in the script, beyond submitit's text: the setup block (:func:`setup_lines`), the ``-P``
of every interpreter (:func:`jobs.executor.safe_python`) and the loop that restarts a failed
step in place (:func:`jobs.executor.in_place_loop`, with what each rank runs as comments,
:func:`rank_note`).

Quoting: every ``#SBATCH`` value and srun argument is quoted (``shlex.quote``, by submitit),
and so are the variables and paths we add to the setup block. Setup lines from the spec are
shell code on purpose (``module load``, ``source .venv/bin/activate``).
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from jobs.slurmmap import RESOURCE_OPTIONS, sbatch_options, submitit_parameters
from train.env import SLURM_RELEASE_ENV
from train.runfiles import TASKS_DIR

if TYPE_CHECKING:
    from cluster import ClusterLimits
    from jobs.spec import JobSpec

# Where `jobs` (and `train`) live: exported so the tasks can unpickle jobs.launch.TrainLaunch
# even when the project is used from a checkout rather than installed.
PROJECT_ROOT = Path(__file__).resolve().parents[1]
SLURM_FOLDER = "slurm"
#: submitit's name for a rank's log in SLURM_FOLDER (``JobPaths.stdout``; %t: the rank).
LOG_NAME = "%j_%t_log.out"
#: One sbatch option: (long name as Slurm spells it, value; None for a flag such as --exclusive).
Option = tuple[str, str | None]
#: The options that size the allocation (what both dry-runs must agree on).
RESOURCE_KEYS = RESOURCE_OPTIONS


@dataclass(frozen=True)
class SlurmOptions:
    """What a spec asks of Slurm: sbatch options in a fixed order, then srun options."""

    sbatch: tuple[Option, ...]
    srun: tuple[str, ...]

    def get(self, key: str) -> str | None:
        return next((v for k, v in self.sbatch if k == key), None)


def slurm_options(spec: JobSpec) -> SlurmOptions:
    """The one spec -> Slurm mapping: sbatch options from :data:`jobs.slurmmap.ROWS` (then
    ``launch.sbatch_args``), srun options from ``launch``."""
    return SlurmOptions(tuple(sbatch_options(spec)), tuple(srun_args(spec)))


def array_option(size: int, max_parallel: int) -> str:
    """``--array`` for ``size`` tasks, at most ``max_parallel`` at once (submitit's spelling)."""
    return f"0-{size - 1}%{min(size, max_parallel)}"


def submitit_folder(run_dir: Path) -> Path:
    """Where submitit keeps pickles and the per-rank logs (``%j_%t_log.out``)."""
    return (run_dir / SLURM_FOLDER).absolute()


def setup_lines(spec: JobSpec) -> list[str]:
    """Lines before srun: our exports (quoted) then the spec's own setup lines."""
    root = shlex.quote(str(PROJECT_ROOT))
    lines = [f'export PYTHONPATH={root}"${{PYTHONPATH:+:$PYTHONPATH}}"']
    for key, value in spec.environment.variables.items():
        lines.append(f"export {key}={shlex.quote(env_text(value))}")
    lines.extend(spec.environment.setup)
    return lines


def env_text(value: str | int | float | bool) -> str:
    """An ``environment.variables`` value as the shell sees it (booleans as true/false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def srun_args(spec: JobSpec) -> list[str]:
    """srun options (submitit joins them with shlex.quote)."""
    launch = spec.launch
    args = [f"--kill-on-bad-exit={1 if launch.kill_on_bad_exit else 0}"]
    res = spec.resources
    if res.min_nodes != res.max_nodes:  # a node range: the tasks per node are srun's (above)
        args.append(f"--ntasks-per-node={spec.ntasks_per_node}")
        args.append(f"--cpus-per-task={res.cpus_per_task or 1}")
    elif spec.resources.cpus_per_task is not None:
        # Slurm 22.05 srun does not inherit --cpus-per-task from sbatch.
        args.append(f"--cpus-per-task={spec.resources.cpus_per_task}")
    if launch.mpi:
        args.append(f"--mpi={launch.mpi}")
    if launch.cpu_bind:
        args.append(f"--cpu-bind={launch.cpu_bind}")
    args.extend(launch.srun_args)
    return args


def submitted_pickle(folder: Path, job_id: str) -> Path:
    """Where submitit's runtime looks for task ``job_id``'s pickle (``JobPaths.submitted_pickle``;
    ``JOBID`` or ``ARRAYID_INDEX``)."""
    return folder / f"{job_id}_submitted.pkl"


def task_run_dir(run_dir: Path, array: bool = False) -> str:
    """The task's run directory as a word of the batch script (an array task's names its
    ``$SLURM_ARRAY_TASK_ID``): where ``jobs.launch --after-step`` reads the run's records after
    a step, without loading the task's pickle (:func:`jobs.executor.in_place_loop`)."""
    base = Path(run_dir).absolute()
    if not array:
        return shlex.quote(str(base))
    return shlex.quote(str(base / TASKS_DIR)) + '/"$SLURM_ARRAY_TASK_ID"'


def rank_note(spec: JobSpec, run_dir: Path, array: bool = False) -> list[str]:
    """What each rank runs, as comment lines (``--dry-run`` and the script itself say it):
    ``submitit.core._submit`` only loads the task's pickle, a :class:`jobs.launch.TrainLaunch`
    that runs ``python -m train`` on the task's resolved spec in the task's process."""
    task_dir = run_dir / TASKS_DIR / "$SLURM_ARRAY_TASK_ID" if array else run_dir
    argv = ["python", "-m", "train", "--config", str(task_dir / "resolved.yaml")]
    argv += ["--run-dir", str(task_dir)]
    lines = [
        "# each rank: submitit.core._submit (through jobs.taskstart, which first starts a",
        "# command that can start first) loads its pickle (slurm/JOBID_submitted.pkl, a",
        "# jobs.launch.TrainLaunch) and runs, in that process:",
        f"#   {shlex.join(argv)}",
    ]
    entry = spec.entrypoint
    if entry is not None and entry.function:
        lines.append(f"#   which calls entrypoint.function {entry.function}")
    return [_comment(ln) for ln in [*lines, *command_note(spec).splitlines()]]


def _comment(line: str) -> str:
    """A comment line that stays one line whatever a path holds (control characters escaped)."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", line)


def command_note(spec: JobSpec) -> str:
    """What an ``entrypoint.command`` will run as, as comment lines.

    A bare ``python`` (or another name found beside it, e.g. ``torchrun``) means the interpreter
    of the environment ``jobs`` runs in, the one submitit starts the tasks with
    (:func:`train.command.processes.resolve_argv` applies the same rule inside the allocation).
    """
    entry = spec.entrypoint
    if entry is None or not entry.command:
        return ""
    from train.command import resolve_argv

    argv = resolve_argv(entry.command)
    lines = [f"# entrypoint.command runs as: {shlex.join(argv)}"]
    if argv[0] != entry.command[0]:
        lines.append(
            f"#   ({entry.command[0]!r} is the interpreter of the environment jobs runs in, "
            f"{sys.executable}; write a path in the spec to use another)"
        )
    return "\n".join(lines) + "\n"


def asks_expedite(spec: JobSpec, cluster: ClusterLimits | None) -> bool:
    """Whether the job's script asks for ``--requeue=expedite``: it asks to be requeued and
    the cluster allows an expedited requeue (25.11+, ``enable_expedited_requeue``)."""
    if cluster is None or not cluster.expedited_requeue:
        return False
    return any(key == "requeue" for key, _ in slurm_options(spec).sbatch)


def sbatch_script(
    spec: JobSpec,
    run_dir: Path,
    array_size: int | None = None,
    cluster: ClusterLimits | None = None,
) -> str:
    """The exact script sbatch gets for this spec and run directory (``array_size``: a sweep).

    Rendered by submitit itself (:class:`jobs.executor.TrainExecutor`, a ``SlurmExecutor``):
    the options of :func:`slurm_options` as its parameters (``update_parameters``: its own
    where it has one, ``additional_parameters`` for the rest), :func:`setup_lines` as its
    ``setup``, :func:`srun_args` as its ``srun_args``, per-rank logs appended to
    (``%j_%t_log.out``, stderr with stdout), ``-P`` interpreters. The one part that is ours is
    the loop around submitit's srun line (:func:`jobs.executor.in_place_loop`): submitit has no
    way to say it. ``cluster``: what the preflight read from the cluster
    (:func:`jobs.preflight.cluster_limits`): its release is exported to the ranks
    (:data:`train.env.SLURM_RELEASE_ENV`: the stop path leaves a preemption's requeue to a
    release that requeues preempted jobs itself) and, where it allows it, the job asks for
    ``--requeue=expedite``.
    Imports submitit (asyncio, ...): ``--dry-run`` pays it (bench/README: the CLI figures).
    """
    from jobs.executor import TrainExecutor

    folder = submitit_folder(run_dir)
    options = list(slurm_options(spec).sbatch)
    setup = setup_lines(spec)
    if asks_expedite(spec, cluster):
        options = [("requeue", "expedite") if k == "requeue" else (k, v) for k, v in options]
    if cluster is not None and cluster.slurm_version:
        setup.insert(1, f"export {SLURM_RELEASE_ENV}={shlex.quote(cluster.slurm_version)}")
    named, extra = submitit_parameters(options)
    params: dict[str, object] = {
        **named,
        "setup": setup,
        "srun_args": srun_args(spec),
        "stderr_to_stdout": True,
        "additional_parameters": extra,
    }
    if array_size is not None and spec.sweep is not None:
        params["array_parallelism"] = spec.sweep.max_parallel
    note = rank_note(spec, run_dir, array_size is not None)
    if spec.requeue.mode == "chain":  # a link of a chain of jobs (jobs.chain)
        note = [*chain_lines(run_dir), *note]
    executor = TrainExecutor(folder, note, task_run_dir(run_dir, array_size is not None))
    executor.update_parameters(**params)
    return executor.script(array_size)


def chain_lines(run_dir: Path, python: str | None = None) -> list[str]:
    """The hooks of a link of a chain (:mod:`jobs.chain`), before the step: the done-check and
    the next links queued (``run`` for the first link, ``resume N`` for a later one: the run
    resumes, ``SLURM_TRAIN_LINK=N`` tells train so; ``exit N`` when the chain is over); when
    the script exits, the chain's end (the links still queued cancelled)."""
    from jobs.executor import safe_python
    from train.stop import REQUEUE_EXIT_CODE

    exe = safe_python(python)
    run = shlex.quote(str(Path(run_dir).absolute()))
    return [
        "# a link of a chain (jobs.chain): the done-check and the next links queued first",
        f'link=$({exe} -m jobs.chain link-start {run} --job-id "$SLURM_JOB_ID") || link=resume',
        'case "$link" in',
        "  run) ;;",
        '  resume*) n="${link#resume}"; n="${n# }"; export SLURM_TRAIN_LINK="${n:-1}" ;;',
        '  *) exit "${link#exit }" ;;',
        "esac",
        # the step's exit code that stops this link for the next one (jobs.executor's loop
        # ends the script with it at once, no after-step interpreter: the successor resumes)
        f"link_exit={REQUEUE_EXIT_CODE}",
        "link_end() {",
        "  link_rc=$?",
        # 75: stopped for the next link, which resumes (link-end would do nothing): the link
        # leaves its nodes without one more interpreter's start (issue 46)
        f'  [ "$link_rc" = {REQUEUE_EXIT_CODE} ] || {exe} -m jobs.chain link-end {run} '
        '--job-id "$SLURM_JOB_ID" --exit-code "$link_rc"',
        "}",
        "trap link_end EXIT",
    ]
