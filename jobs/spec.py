"""The job spec: strict, frozen pydantic models for one YAML file.

    name          job name (also the run directory prefix)
    resources     sbatch options, spelled the way Slurm spells them (jobs.slurmmap: the table)
    launch        extra srun options (mpi, kill_on_bad_exit, cpu_bind, ...)
    environment   setup lines run before srun, and exported variables
    requeue       train.spec.config.RequeueConfig: signal, lead time, requeue budgets
    train         train.spec.config.TrainConfig (built-in trainer)   } exactly one
    entrypoint    train.spec.config.EntrypointConfig (user code)     }
    sweep         a grid over fields: one Slurm job array with a parallelism limit

Cross-field rules live in ``model_validator``s; they raise :class:`FieldIssue` so the error
points at the field to change (see :mod:`train.spec.messages` for ``file:line:column`` reporting).
Every pattern is ASCII (``re.ASCII``, ``[0-9]``): a Unicode digit is never read as a digit.
``launch.sbatch_args`` is checked option by option in :mod:`jobs.sbatchopts`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from cluster import parse_slurm_time
from jobs.sbatchopts import check_sbatch_arg
from jobs.slurmmap import describe
from train.spec import (
    EntrypointConfig,
    FieldIssue,
    RequeueConfig,
    StrictModel,
    TrainConfig,
    check_sections,
)

__all__ = [
    "Environment",
    "FieldIssue",
    "JobSpec",
    "Launch",
    "Resources",
    "Sweep",
]

# Names end up in paths and job names: keep them boring rather than clever at quoting.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", re.ASCII)
# Partition, account, qos: Slurm identifiers.
_IDENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", re.ASCII)
_GRES_RE = re.compile(
    r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)*(,[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)*)*$", re.ASCII
)
_GPU_GRES_RE = re.compile(r"^gpu(?::[A-Za-z0-9_.-]+)?:([0-9]{1,6})$", re.ASCII)
_MEM_RE = re.compile(r"^[0-9]{1,15}[KMGT]?$", re.IGNORECASE | re.ASCII)
_CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_&|\[\]*():,.-]+$", re.ASCII)
_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$", re.ASCII)
_NODES_RE = re.compile(r"^\s*([0-9]{1,6})\s*(?:-\s*([0-9]{1,6})\s*)?$", re.ASCII)
_SRUN_WORD_RE = re.compile(r"^[A-Za-z0-9_:,.=-]+$", re.ASCII)


def _check_ident(value: str | None, what: str, pattern: re.Pattern[str] = _IDENT_RE) -> str | None:
    if value is not None and not pattern.match(value):
        raise ValueError(f"{value!r} is not a valid {what}")
    return value


class Resources(StrictModel):
    """What to ask Slurm for (sbatch options)."""

    partition: Annotated[
        str | None,
        Field(
            description=describe(
                "resources.partition", "partition (default: the cluster's default partition)"
            )
        ),
    ] = None
    nodes: Annotated[
        int | str,
        Field(
            description=describe(
                "resources.nodes",
                'number of nodes, or a range "MIN-MAX": the job starts on what the cluster can '
                "give, and a requeued run resumes on the nodes free then (the tasks per node "
                "stay as given)",
            )
        ),
    ] = 1
    ntasks_per_node: Annotated[
        int | None,
        Field(
            description=describe(
                "resources.ntasks_per_node",
                "tasks per node (default: GPUs per node for ddp, else 1; srun's for a node range)",
            ),
            ge=1,
            le=1024,
        ),
    ] = None
    gpus_per_node: Annotated[
        int | None,
        Field(description=describe("resources.gpus_per_node", "GPUs per node"), ge=0, le=64),
    ] = None
    gres: Annotated[
        str | None,
        Field(
            description=describe(
                "resources.gres", "generic resources per node, e.g. gpu:2 or gpu:a100:4"
            )
        ),
    ] = None
    cpus_per_task: Annotated[
        int | None,
        Field(description=describe("resources.cpus_per_task", "CPUs per task"), ge=1, le=4096),
    ] = None
    mem: Annotated[
        str | None,
        Field(description=describe("resources.mem", "memory per node, e.g. 16G or 4000M")),
    ] = None
    time: Annotated[
        str | int,
        Field(
            description=describe(
                "resources.time",
                "time limit as Slurm writes it (minutes, HH:MM:SS, D-HH:MM:SS, UNLIMITED), "
                "rounded up to whole minutes",
            )
        ),
    ] = "00:30:00"
    account: Annotated[
        str | None, Field(description=describe("resources.account", "account to charge"))
    ] = None
    qos: Annotated[
        str | None, Field(description=describe("resources.qos", "quality of service"))
    ] = None
    constraint: Annotated[
        str | None,
        Field(description=describe("resources.constraint", "node features, e.g. a100&ib")),
    ] = None
    exclusive: Annotated[
        bool, Field(description=describe("resources.exclusive", "whole nodes only"))
    ] = False

    @field_validator("nodes", mode="plain")
    @classmethod
    def _nodes(cls, value: Any) -> int | str:
        """A count (an int, as before), or ``"MIN-MAX"``; a range of one count is that count.
        Errors keep pydantic's kinds for a count, so they read as every other number's."""
        if isinstance(value, int) and not isinstance(value, bool):
            if not 1 <= value <= 100_000:
                kind, bound = (
                    ("greater_than_equal", 1) if value < 1 else ("less_than_equal", 100_000)
                )
                word = "greater" if value < 1 else "less"
                raise PydanticCustomError(
                    kind, f"Input should be {word} than or equal to {bound}", {"bound": bound}
                )
            return value
        if not isinstance(value, str) or "-" not in value:
            raise PydanticCustomError("int_type", "Input should be a valid integer")
        m = _NODES_RE.match(value)
        if m is None:
            raise ValueError(f'{value!r} is not a number of nodes or a range MIN-MAX (e.g. "1-2")')
        low, high = int(m.group(1)), int(m.group(2) or m.group(1))
        if not 1 <= low <= high <= 100_000:
            raise ValueError(
                f'nodes {value!r}: give 1 <= MIN <= MAX <= 100000 (e.g. "1-2": 1 or 2 nodes)'
            )
        return low if low == high else f"{low}-{high}"

    @property
    def min_nodes(self) -> int:
        """The fewest nodes the job may run on (``nodes`` when it is a count)."""
        return int(str(self.nodes).split("-")[0])

    @property
    def max_nodes(self) -> int:
        """The most nodes the job may run on."""
        return int(str(self.nodes).split("-")[-1])

    @field_validator("partition", "account", "qos")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        return _check_ident(value, "Slurm name (letters, digits, _ . -)")

    @field_validator("gres")
    @classmethod
    def _gres(cls, value: str | None) -> str | None:
        return _check_ident(value, "gres (NAME[:TYPE]:COUNT, e.g. gpu:2)", _GRES_RE)

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str | None) -> str | None:
        return _check_ident(value, "memory size (e.g. 16G, 4000M)", _MEM_RE)

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, value: str | None) -> str | None:
        return _check_ident(value, "constraint (features joined by & | , [ ] *)", _CONSTRAINT_RE)

    @field_validator("time", mode="before")
    @classmethod
    def _slurm_time(cls, value: Any) -> Any:
        if isinstance(value, str | int) and not isinstance(value, bool):
            seconds = parse_slurm_time(value)  # raises SlurmTimeError (a ValueError) with a hint
            if seconds == 0:
                raise ValueError("a time limit of 0 lets nothing run (give e.g. 30 or 2:00:00)")
            if seconds is not None and seconds < 60:
                raise ValueError(
                    f"a time limit of {seconds}s: Slurm counts whole minutes (give at least 1)"
                )
            if seconds is not None and seconds > 365 * 86400:
                raise ValueError(
                    f"a time limit of more than a year ({value!r}); for no limit write UNLIMITED"
                )
        return value

    @model_validator(mode="after")
    def _gpus_one_way(self) -> Resources:
        if self.gpus_per_node is not None and self.gres is not None and "gpu" in self.gres:
            raise FieldIssue(
                "gres",
                "gpus given twice: gpus_per_node and gres "
                "(keep one: gpus_per_node: N or gres: gpu:N)",
            )
        return self

    @property
    def time_s(self) -> int | None:
        """The time limit in seconds (None: UNLIMITED)."""
        return parse_slurm_time(self.time)

    @property
    def gpus(self) -> int:
        """GPUs per node, from gpus_per_node or a gpu gres."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        for part in (self.gres or "").split(","):
            m = _GPU_GRES_RE.match(part)
            if m:
                return int(m.group(1))
        return 0


class Launch(StrictModel):
    """How srun starts the tasks."""

    mpi: Annotated[str | None, Field(description="srun --mpi type, e.g. pmix or none")] = None
    kill_on_bad_exit: Annotated[
        bool, Field(description="kill all tasks when one fails (srun --kill-on-bad-exit=1)")
    ] = True
    cpu_bind: Annotated[str | None, Field(description="srun --cpu-bind, e.g. cores")] = None
    srun_args: Annotated[
        list[str], Field(description="more srun options, each one argument (--opt=value)")
    ] = []  # noqa: RUF012 (pydantic copies mutable defaults)
    sbatch_args: Annotated[
        dict[str, str | int | bool],
        Field(description="more #SBATCH options: {mail-type: END, ...}; true = flag only"),
    ] = {}  # noqa: RUF012

    @field_validator("mpi", "cpu_bind")
    @classmethod
    def _word(cls, value: str | None) -> str | None:
        return _check_ident(value, "srun option value", _SRUN_WORD_RE)

    @field_validator("srun_args")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for arg in value:
            if not arg.startswith("-"):
                raise ValueError(f"{arg!r} is not an option; write each as --name=value")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, value: dict[str, str | int | bool]) -> dict[str, str | int | bool]:
        for key, item in value.items():
            try:
                check_sbatch_arg(key, item)
            except ValueError as exc:
                raise FieldIssue("", str(exc), key=key) from None
        return value


class Environment(StrictModel):
    """What runs before srun in the batch script, and the variables the tasks see."""

    setup: Annotated[
        list[str],
        Field(description="shell lines run before srun (module load, source venv/bin/activate)"),
    ] = []  # noqa: RUF012
    variables: Annotated[
        dict[str, str | int | float | bool],
        Field(description="environment variables exported for the tasks (values are quoted)"),
    ] = {}  # noqa: RUF012

    @field_validator("variables")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _VAR_RE.match(key):
                raise FieldIssue(
                    "", f"{key!r} is not a variable name (letters, digits, _)", key=key
                )
        return value


class Sweep(StrictModel):
    """A grid: every combination of the listed values becomes one task of one job array."""

    grid: Annotated[
        dict[str, list[Any]],
        Field(description="field path -> values, e.g. {train.optimizer.lr: [0.1, 0.05]}"),
    ]
    max_parallel: Annotated[
        int, Field(description=describe("sweep.max_parallel", "array tasks running at once"), ge=1)
    ] = 4

    @field_validator("grid")
    @classmethod
    def _non_empty(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if not value:
            raise ValueError("sweep.grid is empty; list at least one field and its values")
        for key, values in value.items():
            if not values:
                raise ValueError(f"sweep.grid.{key} has no values")
        return value

    @property
    def size(self) -> int:
        n = 1
        for values in self.grid.values():
            n *= len(values)
        return n


class JobSpec(StrictModel):
    """One job: what to run, with which resources, and how it comes back after preemption."""

    name: Annotated[
        str, Field(description=describe("name", "job name (letters, digits, . _ -; up to 64)"))
    ]
    resources: Annotated[Resources, Field(description="sbatch resources")] = Resources()
    launch: Annotated[Launch, Field(description="srun options")] = Launch()
    environment: Annotated[Environment, Field(description="setup lines and variables")] = (
        Environment()
    )
    requeue: Annotated[RequeueConfig, Field(description="signal and requeue budgets")] = (
        RequeueConfig()
    )
    train: Annotated[
        TrainConfig | None,
        Field(
            description="built-in trainer settings; beside entrypoint: the settings your code "
            "and its session read (checkpoints, run dir, ctx.config.train)"
        ),
    ] = None
    entrypoint: Annotated[
        EntrypointConfig | None, Field(description="your function or command, run instead")
    ] = None
    sweep: Annotated[
        Sweep | None, Field(description=describe("sweep", "grid over fields -> one job array"))
    ] = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(
                f"{value!r} is not a job name (1-64 of letters, digits, '.', '_', '-'; "
                "starts with a letter or digit)"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        check_sections(self.train is not None, self.entrypoint is not None)
        res = self.resources
        gpus = res.gpus
        builtin = self.builtin_train
        strategy = builtin.strategy if builtin is not None else None
        tasks = self.ntasks_per_node
        if strategy == "ddp" and gpus and tasks > gpus:
            raise FieldIssue(
                "resources.ntasks_per_node",
                f"{tasks} tasks per node but {gpus} GPUs per node: DDP runs one task per GPU "
                f"(set ntasks_per_node: {gpus}, or gpus_per_node: {tasks})",
            )
        if self.entrypoint is not None and self.entrypoint.torchrun and tasks != 1:
            raise FieldIssue(
                "resources.ntasks_per_node",
                f"{tasks} tasks per node, but entrypoint.command is torchrun, which starts the "
                "node's processes itself (set ntasks_per_node: 1 and torchrun's "
                "--nproc-per-node)",
            )
        if strategy in ("dp", "pipeline", "single") and tasks != 1:
            raise FieldIssue(
                "resources.ntasks_per_node",
                f"strategy {strategy} runs one task per node that uses all its devices "
                "(set ntasks_per_node: 1, or train.strategy: ddp)",
            )
        if strategy in ("dp", "single") and res.max_nodes != 1:
            raise FieldIssue(
                "resources.nodes",
                f"strategy {strategy} runs in one process on one node "
                "(set nodes: 1, or train.strategy: ddp for several nodes)",
            )
        if strategy == "dp" and gpus == 0 and not self.train_allows_cpu:
            raise FieldIssue(
                "resources.gpus_per_node",
                "strategy dp spreads one process over the node's GPUs but none are requested "
                "(set gpus_per_node, or train.allow_cpu_fallback: true)",
            )
        if builtin is not None and builtin.batch_size % (self.world_size * builtin.grad_accum):
            raise FieldIssue(
                "train.batch_size",
                f"global batch {builtin.batch_size} does not split evenly over "
                f"{self.world_size} ranks x {builtin.grad_accum} micro-steps "
                f"(use a multiple of {self.world_size * builtin.grad_accum})",
            )
        if builtin is not None:
            # fewer nodes: the same global batch, more micro-steps (train.loop.order)
            odd = [w for w in self.world_sizes if builtin.batch_size % w]
            if odd:
                raise FieldIssue(
                    "train.batch_size",
                    f"global batch {builtin.batch_size} does not split over {odd[0]} ranks, "
                    f"one of the shapes resources.nodes {res.nodes!r} allows (use a multiple "
                    f"of every world size in {list(self.world_sizes)})",
                )
        time_s = res.time_s
        if time_s is not None and self.requeue.signal_delay_s >= time_s:
            raise FieldIssue(
                "requeue.signal_delay_s",
                f"signal {self.requeue.signal_delay_s}s before the end of a {time_s}s job would "
                "arrive at the start (lower it or raise resources.time)",
            )
        return self

    @property
    def builtin_train(self) -> TrainConfig | None:
        """The built-in trainer's settings when it runs (no ``entrypoint:``); None for user
        code, whose ``train:`` (if any) only holds settings the code reads
        (:func:`train.spec.config.check_sections`): the trainer's strategy and batch rules
        do not apply to it."""
        return self.train if self.entrypoint is None else None

    @property
    def train_allows_cpu(self) -> bool:
        return self.builtin_train is not None and self.builtin_train.allow_cpu_fallback

    @property
    def ntasks_per_node(self) -> int:
        """Tasks per node: as given, else one per GPU for ddp, else 1 (also for a torchrun
        command: it starts the node's processes itself)."""
        res = self.resources
        if res.ntasks_per_node is not None:
            return res.ntasks_per_node
        if self.entrypoint is not None and self.entrypoint.torchrun:
            return 1
        builtin = self.builtin_train
        strategy = builtin.strategy if builtin is not None else "ddp"
        return max(1, res.gpus) if strategy == "ddp" else 1

    @property
    def world_size(self) -> int:
        """Ranks at the most nodes the spec allows (the batch must split over it x
        ``train.grad_accum``; at fewer ranks the trainer keeps the global batch)."""
        return self.resources.max_nodes * self.ntasks_per_node

    @property
    def world_sizes(self) -> tuple[int, ...]:
        """Every world size the job may run at: each node count of ``resources.nodes`` times
        the tasks per node (fixed: Slurm gives every node the same number)."""
        res = self.resources
        return tuple(n * self.ntasks_per_node for n in range(res.min_nodes, res.max_nodes + 1))
