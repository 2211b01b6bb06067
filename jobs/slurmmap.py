"""THE table from spec fields to sbatch options: one row per field, everything else derives.

Each :class:`Row` says which spec field(s) it reads, which sbatch option it writes, how that
option shows in the script (``--gres=gpu:N``), which other sbatch options would say the same
thing (refused in ``launch.sbatch_args``), and whether submitit takes it as one of its own
parameters (``SlurmExecutor.update_parameters``) or through ``additional_parameters``.
From :data:`ROWS` derive:

- the sbatch options of a spec (:func:`sbatch_options`, in the rows' order; used by
  :mod:`jobs.render` for submitit's script and by :mod:`jobs.templates` for ``#SBATCH`` blocks),
- the inverse, sbatch option -> spec field (:data:`FIELD_OF_OPTION`; :mod:`jobs.sbatchopts`
  refuses ``launch.sbatch_args`` that a field already says, naming the field),
- the options that size the allocation (:data:`RESOURCE_OPTIONS`),
- the descriptions of the spec's fields (:func:`describe`, used by :mod:`jobs.spec`): each
  names the option actually written (tests/unit/jobs/test_slurmmap.py renders every row).

Adding a spec field that maps to an sbatch option is one row here plus the field in the model.
Two rows may write one option (``resources.gres`` and ``resources.gpus_per_node`` both write
``--gres``): their values are joined by a comma, as Slurm lists generic resources.
Torch-free and pydantic-free: :mod:`jobs.spec` imports it while its models are built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cluster import format_slurm_time

#: A :class:`jobs.spec.JobSpec`: not imported, not even for types (jobs.spec imports this
#: table to describe its fields; tests/unit/test_layering.py counts typing-only imports too).
JobSpec = Any

__all__ = [
    "FIELD_OF_OPTION",
    "RESOURCE_OPTIONS",
    "ROWS",
    "Row",
    "describe",
    "sbatch_options",
    "timeout_min",
]

#: One sbatch option as written: (long name as Slurm spells it, value; None for a flag).
Option = tuple[str, str | None]
#: A row's value for a spec: text, True for a flag, None (or False) when not written.
Value = str | bool | None


@dataclass(frozen=True)
class Row:
    """One spec field (or a pair that is one value) and the sbatch option it writes."""

    fields: tuple[str, ...]
    option: str
    shown: str
    value: Callable[[JobSpec], Value]
    also: tuple[str, ...] = ()
    submitit: bool = False


def timeout_min(spec: JobSpec) -> int:
    """The time limit in whole minutes, rounded up (Slurm's unit; submitit's pickled tasks
    carry it too, with submitit's default of 5 when there is none)."""
    seconds = spec.resources.time_s
    return 5 if seconds is None else -(-seconds // 60)


def _elastic(spec: JobSpec) -> bool:
    return spec.resources.min_nodes != spec.resources.max_nodes


def _ntasks(spec: JobSpec) -> Value:
    # A node range: srun starts the tasks per node (jobs.render.srun_args), see _cpus.
    return None if _elastic(spec) else str(spec.ntasks_per_node)


def _cpus(spec: JobSpec) -> Value:
    res = spec.resources
    if _elastic(spec):
        # With --ntasks-per-node Slurm satisfies the task count on the FEWEST nodes (measured:
        # 1 of 2 idle); without it, on as many as it can give now. So the allocation holds one
        # CPU block per node (the node's tasks x their CPUs) and srun starts the tasks per node.
        return str(spec.ntasks_per_node * (res.cpus_per_task or 1))
    return None if res.cpus_per_task is None else str(res.cpus_per_task)


def _time(spec: JobSpec) -> Value:
    # Slurm counts whole minutes: rounded up so the job never gets less than asked.
    return format_slurm_time(None if spec.resources.time_s is None else 60 * timeout_min(spec))


def _gpus(spec: JobSpec) -> Value:
    n = spec.resources.gpus_per_node
    return f"gpu:{n}" if n else None


def _text(path: str) -> Callable[[JobSpec], Value]:
    section, name = path.split(".")

    def get(spec: JobSpec) -> Value:
        value = getattr(getattr(spec, section), name)
        return None if value is None else value if isinstance(value, bool) else str(value)

    return get


#: The rows, in the order the options are written (templates keep it; submitit sorts).
ROWS: tuple[Row, ...] = (
    Row(("name",), "job-name", "--job-name=NAME", lambda s: s.name, submitit=True),
    Row(
        ("resources.partition",),
        "partition",
        "--partition",
        _text("resources.partition"),
        submitit=True,
    ),
    Row(
        ("resources.nodes",),
        "nodes",
        "--nodes=N or --nodes=MIN-MAX",
        lambda s: str(s.resources.nodes),
        submitit=True,
    ),
    Row(
        ("resources.ntasks_per_node",),
        "ntasks-per-node",
        "--ntasks-per-node",
        _ntasks,
        also=("ntasks",),
        submitit=True,
    ),
    Row(("resources.gres",), "gres", "--gres", _text("resources.gres"), submitit=True),
    Row(
        ("resources.gpus_per_node",),
        "gres",
        "--gres=gpu:N",
        _gpus,
        also=("gpus", "gpus-per-node", "gpus-per-task"),
    ),
    Row(
        ("resources.cpus_per_task",),
        "cpus-per-task",
        "--cpus-per-task",
        _cpus,
        also=("cpus-per-gpu",),
        submitit=True,
    ),
    # submitit's own `mem` parameter is in GB (a number): ours is Slurm's text (16G, 4000M).
    Row(
        ("resources.mem",),
        "mem",
        "--mem",
        _text("resources.mem"),
        also=("mem-per-cpu", "mem-per-gpu"),
    ),
    # submitit's own `time` parameter is minutes: ours is Slurm's [D-]HH:MM:SS (or UNLIMITED).
    Row(("resources.time",), "time", "--time=[D-]HH:MM:SS", _time),
    Row(("resources.account",), "account", "--account", _text("resources.account"), submitit=True),
    Row(("resources.qos",), "qos", "--qos", _text("resources.qos"), submitit=True),
    Row(
        ("resources.constraint",),
        "constraint",
        "--constraint",
        _text("resources.constraint"),
        submitit=True,
    ),
    Row(
        ("resources.exclusive",),
        "exclusive",
        "--exclusive",
        lambda s: s.resources.exclusive or None,
        submitit=True,
    ),
    # submitit's own signal is always USR2: the spec's signal is ours.
    Row(
        ("requeue.signal", "requeue.signal_delay_s"),
        "signal",
        "--signal=SIGNAL@DELAY_S",
        lambda s: f"{s.requeue.signal}@{s.requeue.signal_delay_s}",
    ),
    # a chain of jobs (requeue.mode chain, jobs.chain) is never requeued: its next link resumes
    Row((), "requeue", "--requeue", lambda s: None if s.requeue.mode == "chain" else True),
    Row((), "no-requeue", "--no-requeue", lambda s: True if s.requeue.mode == "chain" else None),
    # Written by submitit from the number of tasks (its map_count) and array_parallelism.
    Row(("sweep", "sweep.max_parallel"), "array", "--array=0-N%MAX_PARALLEL", lambda s: None),
)


def _rows_of_field() -> dict[str, Row]:
    return {f: row for row in ROWS for f in row.fields}


_ROW_OF_FIELD = _rows_of_field()

#: sbatch option -> the spec field that says it (every row's option and its ``also``).
FIELD_OF_OPTION: dict[str, str] = {}
for _row in ROWS:
    for _opt in (_row.option, *_row.also):
        if _row.fields:
            FIELD_OF_OPTION.setdefault(_opt, _row.fields[0])

#: The options that size the allocation (what the script and the templates must agree on).
RESOURCE_OPTIONS: tuple[str, ...] = tuple(
    dict.fromkeys(r.option for r in ROWS if r.fields and r.fields[0].startswith("resources."))
)


def describe(field: str, text: str) -> str:
    """``text`` with the sbatch option ``field`` is written as (the spec's descriptions)."""
    return f"{text} (sbatch {_ROW_OF_FIELD[field].shown})"


def _values(spec: JobSpec) -> Iterator[tuple[Row, str | None]]:
    for row in ROWS:
        value = row.value(spec)
        if value is None or value is False:
            continue
        yield row, None if value is True else value


def sbatch_options(spec: JobSpec) -> list[Option]:
    """The sbatch options of ``spec`` from :data:`ROWS` (then ``launch.sbatch_args``)."""
    out: dict[str, str | None] = {}
    for row, value in _values(spec):
        if row.option in out and value is not None and out[row.option] is not None:
            out[row.option] = f"{out[row.option]},{value}"  # --gres: gres, then gpu:N
        else:
            out[row.option] = value
    opts = list(out.items())
    for key, extra in spec.launch.sbatch_args.items():
        if extra is True:
            opts.append((key, None))
        elif extra is not False:
            opts.append((key, str(extra)))
    return opts


def submitit_parameters(options: list[Option]) -> tuple[dict[str, object], dict[str, object]]:
    """``options`` split for submitit: (its own named parameters, ``additional_parameters``),
    both in submitit's spelling (underscores; a flag is ``True``)."""
    own = {r.option for r in ROWS if r.submitit}
    named: dict[str, object] = {}
    extra: dict[str, object] = {}
    for key, value in options:
        (named if key in own else extra)[key.replace("-", "_")] = True if value is None else value
    return named, extra
