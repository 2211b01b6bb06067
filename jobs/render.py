"""Spec -> submitit parameters -> the exact sbatch script.

One function builds the parameters; the real submission hands them to
``submitit.SlurmExecutor.update_parameters`` and ``--dry-run`` hands the same ones to submitit's
own ``_make_sbatch_string``, so what is shown is what is submitted.

Quoting: submitit quotes every ``#SBATCH`` value and srun argument (``shlex.quote``); the
variables and paths we add to the setup block are quoted here. Setup lines from the spec are
shell code on purpose (``module load``, ``source .venv/bin/activate``).
"""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobs.spec import JobSpec

# Where `jobs` (and `train`) live: exported so the tasks can unpickle jobs.launch.TrainLaunch
# even when the project is used from a checkout rather than installed.
PROJECT_ROOT = Path(__file__).resolve().parents[1]
SLURM_FOLDER = "slurm"


def submitit_folder(run_dir: Path) -> Path:
    """Where submitit keeps pickles and the per-rank logs (``%j_%t_log.out``)."""
    return (run_dir / SLURM_FOLDER).absolute()


def setup_lines(spec: JobSpec) -> list[str]:
    """Lines before srun: our exports (quoted) then the spec's own setup lines."""
    root = shlex.quote(str(PROJECT_ROOT))
    lines = [f'export PYTHONPATH={root}"${{PYTHONPATH:+:$PYTHONPATH}}"']
    for key, value in spec.environment.variables.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(f"export {key}={shlex.quote(text)}")
    lines.extend(spec.environment.setup)
    return lines


def srun_args(spec: JobSpec) -> list[str]:
    """srun options: submitit joins them with shlex.quote."""
    launch = spec.launch
    args = [f"--kill-on-bad-exit={1 if launch.kill_on_bad_exit else 0}"]
    if spec.resources.cpus_per_task is not None:
        # Slurm 22.05 srun does not inherit --cpus-per-task from sbatch.
        args.append(f"--cpus-per-task={spec.resources.cpus_per_task}")
    if launch.mpi:
        args.append(f"--mpi={launch.mpi}")
    if launch.cpu_bind:
        args.append(f"--cpu-bind={launch.cpu_bind}")
    args.extend(launch.srun_args)
    return args


def slurm_parameters(spec: JobSpec) -> dict[str, Any]:
    """Keyword arguments for ``SlurmExecutor.update_parameters`` (and ``_make_sbatch_string``).

    Independent of the run directory (that only enters as submitit's folder), so
    :mod:`jobs.drycache` can keep them.
    """
    res = spec.resources
    seconds = res.time_s
    extra: dict[str, Any] = {
        "signal": f"{spec.requeue.signal}@{spec.requeue.signal_delay_s}",
        "requeue": True,
    }
    extra.update({k: v for k, v in spec.launch.sbatch_args.items() if v is not False})
    params: dict[str, Any] = {
        "job_name": spec.name,
        "partition": res.partition,
        # submitit takes minutes; Slurm rounds a limit up to whole minutes anyway.
        "time": math.ceil(seconds / 60) if seconds is not None else None,
        "nodes": res.nodes,
        "ntasks_per_node": spec.ntasks_per_node,
        "cpus_per_task": res.cpus_per_task,
        "gpus_per_node": res.gpus_per_node or None,
        "gres": res.gres,
        "mem": res.mem,
        "account": res.account,
        "qos": res.qos,
        "constraint": res.constraint,
        "exclusive": True if res.exclusive else None,
        "signal_delay_s": spec.requeue.signal_delay_s,
        "setup": setup_lines(spec),
        "srun_args": srun_args(spec),
        "stderr_to_stdout": True,
        "additional_parameters": extra,
    }
    if spec.sweep is not None:
        params["array_parallelism"] = spec.sweep.max_parallel
    if seconds is None:
        params["additional_parameters"]["time"] = "UNLIMITED"
    return {k: v for k, v in params.items() if v is not None}


def submit_command(folder: Path, python: str | None = None) -> str:
    """The command submitit puts after srun (``SlurmExecutor._submitit_command_str``)."""
    exe = shlex.quote(python or sys.executable)
    return " ".join([exe, "-u -m submitit.core._submit", shlex.quote(str(folder))])


def sbatch_script(spec: JobSpec, run_dir: Path, array_size: int | None = None) -> str:
    """The exact script submitit would pass to sbatch for this spec and run directory."""
    return script_from_parameters(slurm_parameters(spec), run_dir, array_size)


def script_from_parameters(
    params: dict[str, Any], run_dir: Path, array_size: int | None = None
) -> str:
    """Render with submitit's own function, as ``SlurmExecutor`` does (``map_count`` for arrays)."""
    from submitit.slurm.slurm import _make_sbatch_string

    folder = submitit_folder(run_dir)
    kwargs = dict(params)
    if array_size is not None:
        kwargs["map_count"] = array_size
    text: str = _make_sbatch_string(command=submit_command(folder), folder=folder, **kwargs)
    return text
