"""The ONE mapping from a spec to Slurm options, and the exact sbatch script that is submitted.

:func:`slurm_options` turns a :class:`~jobs.spec.JobSpec` into sbatch options (Slurm's long
option names, in Slurm's spelling) and srun options. Everything that asks Slurm for resources
comes from it: :func:`sbatch_script` (the script the real submission hands to sbatch and
``--dry-run`` prints, so what is shown is what is submitted; laid out as submitit lays it out,
for submitit's runtime in the allocation) and :mod:`jobs.templates` (the ``#SBATCH`` block of
``--template NAME``). GPUs are asked for one
way only, ``--gres=gpu:N`` (works with select/cons_res and cons_tres alike), and the time limit
is written as ``[D-]HH:MM:SS`` rounded up to whole minutes (Slurm's granularity).

Quoting: every ``#SBATCH`` value and srun argument is quoted (``shlex.quote``, as submitit
does), and so are the variables and paths we add to the setup block. Setup lines from the spec are
shell code on purpose (``module load``, ``source .venv/bin/activate``).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.timefmt import format_slurm_time

if TYPE_CHECKING:
    from jobs.spec import JobSpec

# Where `jobs` (and `train`) live: exported so the tasks can unpickle jobs.launch.TrainLaunch
# even when the project is used from a checkout rather than installed.
PROJECT_ROOT = Path(__file__).resolve().parents[1]
SLURM_FOLDER = "slurm"
#: submitit's name for a rank's log in SLURM_FOLDER (``JobPaths.stdout``; %t: the rank).
LOG_NAME = "%j_%t_log.out"
#: submitit's ``array_parallelism`` default, for an array without a sweep's max_parallel.
SUBMITIT_ARRAY_PARALLELISM = 256
#: One sbatch option: (long name as Slurm spells it, value; None for a flag such as --exclusive).
Option = tuple[str, str | None]
#: The options that size the allocation (what both dry-runs must agree on).
RESOURCE_KEYS = (
    "partition",
    "nodes",
    "ntasks-per-node",
    "gres",
    "cpus-per-task",
    "mem",
    "time",
    "account",
    "qos",
    "constraint",
    "exclusive",
)


@dataclass(frozen=True)
class SlurmOptions:
    """What a spec asks of Slurm: sbatch options in a fixed order, then srun options."""

    sbatch: tuple[Option, ...]
    srun: tuple[str, ...]

    def get(self, key: str) -> str | None:
        return next((v for k, v in self.sbatch if k == key), None)


def slurm_options(spec: JobSpec) -> SlurmOptions:
    """The one spec -> Slurm mapping (see the module docstring)."""
    res = spec.resources
    opts: list[Option] = [("job-name", spec.name)]
    if res.partition:
        opts.append(("partition", res.partition))
    opts.append(("nodes", str(res.nodes)))
    elastic = res.min_nodes != res.max_nodes
    if not elastic:
        opts.append(("ntasks-per-node", str(spec.ntasks_per_node)))
    # gpus_per_node joins any other gres (the spec refuses GPUs given both ways).
    gres = [g for g in (res.gres, f"gpu:{res.gpus_per_node}" if res.gpus_per_node else "") if g]
    if gres:
        opts.append(("gres", ",".join(gres)))
    if elastic:
        # A node range: with --ntasks-per-node Slurm satisfies the task count on the FEWEST
        # nodes (measured: 1 of 2 idle); without it, on as many as it can give now. So the
        # allocation holds one CPU block per node (the node's tasks x their CPUs) and srun
        # starts the tasks per node (srun_args).
        opts.append(("cpus-per-task", str(spec.ntasks_per_node * (res.cpus_per_task or 1))))
    elif res.cpus_per_task is not None:
        opts.append(("cpus-per-task", str(res.cpus_per_task)))
    if res.mem is not None:
        opts.append(("mem", res.mem))
    # Slurm counts whole minutes: rounded up so the job never gets less than asked.
    opts.append(("time", format_slurm_time(None if res.time_s is None else 60 * timeout_min(spec))))
    for key, value in (("account", res.account), ("qos", res.qos), ("constraint", res.constraint)):
        if value is not None:
            opts.append((key, value))
    if res.exclusive:
        opts.append(("exclusive", None))
    opts.append(("signal", f"{spec.requeue.signal}@{spec.requeue.signal_delay_s}"))
    opts.append(("requeue", None))
    for key, extra in spec.launch.sbatch_args.items():
        if extra is True:
            opts.append((key, None))
        elif extra is not False:
            opts.append((key, str(extra)))
    return SlurmOptions(tuple(opts), tuple(srun_args(spec)))


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


def timeout_min(spec: JobSpec) -> int:
    """The time limit in whole minutes, rounded up (Slurm's unit; submitit's pickled tasks
    carry it too, with submitit's default of 5 when there is none)."""
    seconds = spec.resources.time_s
    return 5 if seconds is None else -(-seconds // 60)


def submitted_pickle(folder: Path, job_id: str) -> Path:
    """Where submitit's runtime looks for task ``job_id``'s pickle (``JobPaths.submitted_pickle``;
    ``JOBID`` or ``ARRAYID_INDEX``)."""
    return folder / f"{job_id}_submitted.pkl"


def submit_command(folder: Path, python: str | None = None) -> str:
    """The command submitit puts after srun (``SlurmExecutor._submitit_command_str``)."""
    exe = shlex.quote(python or sys.executable)
    return " ".join([exe, "-u -m submitit.core._submit", shlex.quote(str(folder))])


def command_note(spec: JobSpec) -> str:
    """For ``--dry-run``: what an ``entrypoint.command`` will run as, as comment lines.

    A bare ``python`` (or another name found beside it, e.g. ``torchrun``) means the interpreter
    of the environment ``jobs`` runs in, the one :func:`submit_command` starts the tasks with
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


def sbatch_script(spec: JobSpec, run_dir: Path, array_size: int | None = None) -> str:
    """The exact script sbatch gets for this spec and run directory (``array_size``: a sweep).

    Laid out as submitit's ``_make_sbatch_string`` lays it out (submitit 1.5), because what
    runs in the allocation is submitit's: sorted ``#SBATCH`` lines with its defaults (its
    ``--wckey``, per-rank logs ``%j_%t_log.out`` appended to, its ``--array`` spelling), our
    setup block, then ``srun`` starting ``submitit.core._submit`` on the run's pickles. Every
    option of :func:`slurm_options` is written after submitit's defaults, so ours win.
    tests/unit/jobs/test_render.py renders the same specs with submitit's own function and
    compares; rendering here keeps submitit's import (asyncio, ssl, ...) off ``--dry-run``.
    """
    opts = slurm_options(spec)
    stdout = str(submitit_folder(run_dir) / LOG_NAME)
    params: dict[str, str | None] = {"wckey": "submitit"}
    if array_size is not None:
        parallel = spec.sweep.max_parallel if spec.sweep is not None else SUBMITIT_ARRAY_PARALLELISM
        params["array"] = array_option(array_size, parallel)
        stdout = stdout.replace("%j", "%A_%a")
    params["output"] = stdout.replace("%t", "0")
    params["open-mode"] = "append"
    # submitit's spelling of the keys (underscores; its own open-mode) decides the order.
    params.update((key.replace("-", "_"), value) for key, value in opts.sbatch)
    srun = shlex.join(["srun", "--unbuffered", "--output", stdout, *opts.srun])
    lines = ["#!/bin/bash", "", "# Parameters"]
    lines += [_sbatch_line(key, params[key]) for key in sorted(params)]
    lines += ["", "# setup", *setup_lines(spec)]
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm"]
    step = f"{srun} {submit_command(submitit_folder(run_dir))}"
    lines += [in_place_loop(step, submitit_folder(run_dir)), ""]
    return "\n".join(lines)


def in_place_loop(step: str, folder: Path, python: str | None = None) -> str:
    """The job step ``step`` (submitit's srun line) run again in the same allocation when the
    run decided to restart in place (a failure or a hang; :mod:`train.stop.step` says so after
    each step): no requeue, no trip through the queue. The only lines of the script that are
    ours rather than submitit's."""
    exe = shlex.quote(python or sys.executable)
    ask = " ".join([
        exe, "-m jobs.launch --after-step", shlex.quote(str(folder)), '--exit-code "$rc"',
        '--in-place "$SLURM_TRAIN_IN_PLACE" --job-id "$SLURM_JOB_ID"',
        '--task "${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"',
        '--restart-count "${SLURM_RESTART_COUNT:-0}"',
    ])  # fmt: skip
    return "\n".join([
        "# a failed step restarts in this allocation when the run decides so (train.stop.step)",
        "export SLURM_TRAIN_IN_PLACE=0",
        "while :; do",
        f"  {step}",
        "  rc=$?",
        f"  next=$({ask}) || next=\"exit $rc\"",
        '  if [ "$next" != restart ]; then exit "${next#exit }"; fi',
        "  SLURM_TRAIN_IN_PLACE=$((SLURM_TRAIN_IN_PLACE + 1))",
        "done",
    ])  # fmt: skip


def _sbatch_line(key: str, value: str | None) -> str:
    name = key.replace("_", "-")
    return f"#SBATCH --{name}" if value is None else f"#SBATCH --{name}={shlex.quote(value)}"
