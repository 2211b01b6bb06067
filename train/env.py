"""Where this process sits in the job: the one reader of SLURM_* / torchrun variables.

``DistEnv.from_env(os.environ)`` recognises three launchers:

- torchrun (``RANK`` and ``WORLD_SIZE`` set, also under ``srun torchrun``): used as they are;
- Slurm (``SLURM_PROCID`` set, e.g. ``srun python -m train``): rank, local rank, node, world size
  from Slurm; ``MASTER_ADDR`` = first host of the step's node list, ``MASTER_PORT`` derived from the
  job id so two jobs sharing a node do not collide;
- otherwise a single process.

Inconsistent values (tasks that do not match the node list or the allocated GPUs) raise
:class:`train.errors.EnvError` naming the sbatch option to change. ``export`` writes the torchrun
variables back so other libraries see the same answer. This module does not import torch; device
selection (:func:`train.device.resolve_device`) is in :mod:`train.device`.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

from train.errors import EnvError

__all__ = [
    "DUMMY_GPUS_ENV",
    "IN_PLACE_ENV",
    "LINK_ENV",
    "SLURM_RELEASE_ENV",
    "SUBMISSION_ENV",
    "DistEnv",
    "attempt_key",
    "master_port_for_job",
    "verify_master_port",
]

Launcher = Literal["slurm", "torchrun", "single"]

#: Ports derived from job ids live in [PORT_BASE, PORT_BASE + PORT_SPAN): below the Linux
#: ephemeral range (32768+) so an outgoing connection never squats on our port.
PORT_BASE = 20000
PORT_SPAN = 12000
#: Set to 1 in every task by the local dev cluster's TaskProlog (cluster/local/config.py): its
#: GPUs are dummy generic resources, so training on CPU there is expected, not a mistake.
DUMMY_GPUS_ENV = "SLURM_TRAIN_DUMMY_GPUS"
#: The restart-in-place count of this step (the batch script's own variable, not Slurm's).
IN_PLACE_ENV = "SLURM_TRAIN_IN_PLACE"
#: The cluster's Slurm release (``24.11.5``), exported by the batch script from what the
#: submission's preflight read (``scontrol show config``, cached): no rank asks Slurm for it.
SLURM_RELEASE_ENV = "SLURM_TRAIN_SLURM_RELEASE"
#: Set (to the link's place, 1, 2, ...) by the batch script of a chain's link that continues
#: the run of the links before it (jobs.chain): a resume, like a requeued job's.
LINK_ENV = "SLURM_TRAIN_LINK"
#: The local executor's submission (its job id, ``local-N``): events carry it, so that budgets
#: per submission hold without Slurm's job id (jobs/localrun.py sets it).
SUBMISSION_ENV = "SLURM_TRAIN_SUBMISSION"


def master_port_for_job(job_id: str | None) -> int:
    """Deterministic rendezvous port for a job: every task computes the same one, no exchange."""
    digits = re.sub(r"\D", "", job_id or "")
    if not digits:
        return 29500
    return PORT_BASE + int(digits) % PORT_SPAN


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer") from None


def _req(environ: Mapping[str, str], name: str) -> int:
    value = _int(environ, name)
    if value is None:
        raise EnvError(f"{name} is not set")
    return value


def attempt_key(restart_count: int, in_place: int) -> str:
    """An attempt's key within its job: Slurm's restart count, then ``.N`` for the N-th restart
    in place (``"2"``, ``"2.1"``)."""
    return f"{restart_count}.{in_place}" if in_place else str(restart_count)


def exported_release(environ: Mapping[str, str]) -> str | None:
    """The Slurm release the batch script exported (:data:`SLURM_RELEASE_ENV`), None where it
    exported none (a batch script written by hand)."""
    return (environ.get(SLURM_RELEASE_ENV) or "").strip() or None


def job_hosts(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The job's nodes (``SLURM_JOB_NODELIST``: the batch script's whole allocation); none
    where Slurm does not say, or says something malformed."""
    nodelist = environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return ()
    from cluster import expand_hostlist  # lazy: train has no import-time cluster dep

    try:
        return tuple(expand_hostlist(nodelist))
    except ValueError:
        return ()


def _parse_tasks_per_node(text: str) -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1] (Slurm's SLURM_TASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE)."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise EnvError(f"cannot parse tasks per node {text!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def _parse_gpu_count(text: str | None) -> int | None:
    """``2``, ``gpu:2``, ``a100:2``, ``gpu:a100:2`` or ``2(x2)`` -> 2; None when absent."""
    if text is None or not text.strip():
        return None
    first = text.split(",")[0].split("(")[0].strip()
    tail = first.rsplit(":", 1)[-1]
    try:
        return int(tail)
    except ValueError:
        raise EnvError(f"cannot parse GPU count {text!r}") from None


@dataclass(frozen=True)
class DistEnv:
    """Rank, world and rendezvous of this process, read once from the environment."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    job_id: str | None = None
    restart_count: int = 0
    #: Restarts inside the same allocation (new steps of the same job; ``SLURM_TRAIN_IN_PLACE``,
    #: set by the batch script that restarts a failed step: jobs.render, the requeue template).
    in_place: int = 0
    #: A batch script restarts this job's failed steps in place (``SLURM_TRAIN_IN_PLACE`` set).
    in_place_supervised: bool = False
    #: This run's SLUID where the release gives one (``SLURM_JOB_SLUID``, 24.11+): recorded in
    #: the start and resume events, the goodput ledger keys Slurm's attempts by it.
    sluid: str = ""
    #: A link of a chain that continues the run of the links before it (``SLURM_TRAIN_LINK``,
    #: jobs.chain): each link is a new Slurm job, its restart count 0.
    link: int = 0
    #: The local executor's submission id (``SLURM_TRAIN_SUBMISSION``: ``local-N``), None under
    #: Slurm (the job id is the submission there): the events carry it as ``submission``.
    submission: str | None = None
    launcher: Launcher = "single"
    #: GPUs Slurm allocated on this node (SLURM_GPUS_ON_NODE / _PER_NODE), None if none asked.
    gpus_on_node: int | None = None
    #: CUDA_VISIBLE_DEVICES split on commas, None when unset.
    visible_devices: tuple[str, ...] | None = None
    cpus_per_task: int | None = None
    hosts: tuple[str, ...] = field(default=())
    #: The cluster's Slurm release the batch script exported (:data:`SLURM_RELEASE_ENV`, from
    #: the submission's preflight); None for a batch script written by hand.
    slurm_release: str | None = None
    #: True when MASTER_PORT came from the environment rather than from the job id.
    port_from_env: bool = False
    #: The cluster says its GPUs are dummies (``SLURM_TRAIN_DUMMY_GPUS=1``): CPU is expected.
    dummy_gpus: bool = False

    @property
    def attempt(self) -> str:
        """This attempt's key within the job: Slurm's restart count, then ``.N`` for the N-th
        restart in place (``"2"``, ``"2.1"``): claims and markers of one attempt use it."""
        return attempt_key(self.restart_count, self.in_place)

    @property
    def resumed(self) -> bool:
        """Whether this process continues an earlier attempt (requeued, restarted in place, or
        a later link of a chain)."""
        return self.restart_count > 0 or self.in_place > 0 or self.link > 0

    @property
    def is_main(self) -> bool:
        """The one process that logs, writes metrics and manifests (global rank 0)."""
        return self.rank == 0

    @property
    def node_name(self) -> str | None:
        """This task's Slurm node name (the step's node list at ``node_rank``), None outside
        Slurm. Not the hostname: the nodes of the local dev cluster share one host."""
        return self.hosts[self.node_rank] if 0 <= self.node_rank < len(self.hosts) else None

    @property
    def distributed(self) -> bool:
        """More than one process: a process group is needed."""
        return self.world_size > 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DistEnv:
        """Read the launcher's variables; raise :class:`EnvError` for inconsistent ones."""
        job_id = environ.get("SLURM_JOB_ID") or None
        restart = _int(environ, "SLURM_RESTART_COUNT", 0) or 0
        gpus = _parse_gpu_count(environ.get("SLURM_GPUS_ON_NODE")) or _parse_gpu_count(
            environ.get("SLURM_GPUS_PER_NODE")
        )
        cvd = environ.get("CUDA_VISIBLE_DEVICES")
        visible = tuple(d for d in cvd.split(",") if d.strip()) if cvd is not None else None
        cpus = _int(environ, "SLURM_CPUS_PER_TASK")
        common: dict[str, Any] = dict(
            job_id=job_id,
            gpus_on_node=gpus,
            visible_devices=visible,
            cpus_per_task=cpus,
            dummy_gpus=environ.get(DUMMY_GPUS_ENV, "").strip() == "1",
            in_place=_int(environ, IN_PLACE_ENV, 0) or 0,
            in_place_supervised=IN_PLACE_ENV in environ,
            sluid=(environ.get("SLURM_JOB_SLUID") or "").strip(),
            link=_int(environ, LINK_ENV, 0) or 0,
            submission=environ.get(SUBMISSION_ENV) or None,
            slurm_release=exported_release(environ),
        )
        in_step = "SLURM_PROCID" in environ and "SLURM_STEP_ID" in environ
        torchrun_vars = "RANK" in environ and "WORLD_SIZE" in environ
        # Inside an srun step, RANK/WORLD_SIZE count only when torchrun set them (`srun
        # torchrun ...`): ones inherited from the submitting shell (a notebook, a previous run)
        # would make every task rank 0 of a world of 1.
        if torchrun_vars and (not in_step or "TORCHELASTIC_RUN_ID" in environ):
            env = cls._from_torchrun(environ, restart, common)
        elif in_step:
            env = cls._from_slurm(environ, restart, common)
        elif "SLURM_PROCID" in environ and (_int(environ, "SLURM_NTASKS", 1) or 1) > 1:
            raise EnvError(
                f"SLURM_NTASKS={environ['SLURM_NTASKS']} but this process was not started by srun "
                "(no SLURM_STEP_ID): launch it with `srun python -m train ...` in the batch "
                "script, or set --ntasks=1"
            )
        else:
            port = _int(environ, "MASTER_PORT")
            env = cls(
                restart_count=restart,
                master_port=port if port is not None else master_port_for_job(job_id),
                port_from_env=port is not None,
                **common,
            )
        env._check()
        return env

    @classmethod
    def _from_torchrun(
        cls, environ: Mapping[str, str], restart: int, common: dict[str, Any]
    ) -> DistEnv:
        world = _req(environ, "WORLD_SIZE")
        local_world = _int(environ, "LOCAL_WORLD_SIZE", None)
        if local_world is None:
            local_world = world
        elastic = _int(environ, "TORCHELASTIC_RESTART_COUNT", 0) or 0
        return cls(
            rank=_req(environ, "RANK"),
            local_rank=_int(environ, "LOCAL_RANK", 0) or 0,
            world_size=world,
            local_world_size=local_world,
            node_rank=_int(environ, "GROUP_RANK", None) or _int(environ, "NODE_RANK", 0) or 0,
            num_nodes=max(1, world // max(1, local_world)),
            master_addr=environ.get("MASTER_ADDR") or "127.0.0.1",
            master_port=_int(environ, "MASTER_PORT", 29500) or 29500,
            restart_count=max(restart, elastic),
            launcher="torchrun",
            port_from_env=True,
            **common,
        )

    @classmethod
    def _from_slurm(
        cls, environ: Mapping[str, str], restart: int, common: dict[str, Any]
    ) -> DistEnv:
        from cluster import expand_hostlist  # lazy: train has no import-time cluster dep

        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
        try:
            hosts = tuple(expand_hostlist(nodelist))
        except ValueError as exc:
            raise EnvError(f"SLURM_STEP_NODELIST={nodelist!r}: {exc}") from exc
        if not hosts:
            raise EnvError("neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set")
        world = _int(environ, "SLURM_STEP_NUM_TASKS") or _req(environ, "SLURM_NTASKS")
        node_rank = _req(environ, "SLURM_NODEID")
        tpn_text = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
        per_node = _parse_tasks_per_node(tpn_text) if tpn_text else []
        ntpn = _int(environ, "SLURM_NTASKS_PER_NODE")
        nnodes = _int(environ, "SLURM_STEP_NUM_NODES") or _int(environ, "SLURM_NNODES")
        if nnodes is not None and nnodes != len(hosts):
            raise EnvError(
                f"the node list {nodelist!r} has {len(hosts)} host(s) but the step has "
                f"{nnodes} node(s): check --nodes / --nodelist"
            )
        # Job level: --ntasks must equal --nodes x --ntasks-per-node when both are given.
        job_tasks, job_nodes = _int(environ, "SLURM_NTASKS"), _int(environ, "SLURM_NNODES")
        if (
            ntpn is not None
            and job_tasks is not None
            and job_nodes is not None
            and job_tasks != ntpn * job_nodes
        ):
            raise EnvError(
                f"world size SLURM_NTASKS={job_tasks} does not match {job_nodes} node(s) x "
                f"--ntasks-per-node={ntpn}: set --ntasks={ntpn * job_nodes} or drop --ntasks "
                "and keep --nodes with --ntasks-per-node"
            )
        if per_node and sum(per_node) != world:
            raise EnvError(
                f"tasks per node {tpn_text!r} add up to {sum(per_node)}, not SLURM_NTASKS={world}: "
                "set --ntasks-per-node instead of --ntasks"
            )
        if per_node and node_rank < len(per_node):
            local_world = per_node[node_rank]
        elif ntpn is not None:
            local_world = ntpn
        else:
            local_world = max(1, world // len(hosts))
        port = _int(environ, "MASTER_PORT")
        addr = environ.get("MASTER_ADDR") or hosts[0]
        if len(hosts) > 1 and (addr == "localhost" or addr.startswith("127.")):
            # A loopback address inherited from the submitting shell cannot reach other nodes.
            addr = hosts[0]
        return cls(
            rank=_req(environ, "SLURM_PROCID"),
            local_rank=_req(environ, "SLURM_LOCALID"),
            world_size=world,
            local_world_size=local_world,
            node_rank=node_rank,
            num_nodes=len(hosts),
            master_addr=addr,
            master_port=port if port is not None else master_port_for_job(common["job_id"]),
            restart_count=restart,
            launcher="slurm",
            hosts=hosts,
            port_from_env=port is not None,
            **common,
        )

    def _check(self) -> None:
        if self.world_size < 1:
            raise EnvError(f"world size {self.world_size} must be at least 1")
        if not 0 <= self.rank < self.world_size:
            raise EnvError(f"rank {self.rank} is outside the world size {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise EnvError(
                f"local rank {self.local_rank} is outside the {self.local_world_size} task(s) "
                "on this node: check --ntasks-per-node"
            )
        if self.world_size < self.num_nodes:
            raise EnvError(
                f"{self.world_size} task(s) on {self.num_nodes} nodes leaves nodes idle: set "
                f"--ntasks-per-node=1 (or more) with --nodes={self.num_nodes}, or --nodes="
                f"{self.world_size}"
            )
        visible = len(self.visible_devices or ())
        if not self.gpus_on_node and visible > 1 and self.local_world_size > visible:
            # Every task sees the same CUDA_VISIBLE_DEVICES (no --gpus-per-task): too few GPUs.
            raise EnvError(
                f"{self.local_world_size} tasks per node but CUDA_VISIBLE_DEVICES lists {visible} "
                f"GPU(s): set --ntasks-per-node={visible} or --gpus-per-node="
                f"{self.local_world_size} (or --gpus-per-task=1)"
            )
        gpus = self.gpus_on_node
        if gpus:
            if self.local_world_size > gpus:
                raise EnvError(
                    f"{self.local_world_size} tasks per node but only {gpus} GPU(s) allocated per "
                    f"node: set --ntasks-per-node={gpus} (one task per GPU) or "
                    f"--gpus-per-node={self.local_world_size}"
                )
            if 1 < self.local_world_size < gpus:
                raise EnvError(
                    f"{self.local_world_size} tasks per node share {gpus} GPU(s) per node: set "
                    f"--ntasks-per-node={gpus} (one task per GPU, strategy ddp) or "
                    "--ntasks-per-node=1 (strategy dp/pipeline)"
                )

    def check_strategy(self, strategy: str) -> None:
        """Raise :class:`EnvError` when the task layout cannot run ``strategy``."""
        if strategy in ("dp", "pipeline", "single") and self.world_size > 1:
            raise EnvError(
                f"strategy {strategy!r} runs in one task that drives all local devices, but "
                f"{self.world_size} tasks were started: set --nodes=1 --ntasks-per-node=1 "
                "(or use train.strategy: ddp)"
            )
        gpus = self.gpus_on_node or 0
        if strategy == "ddp" and gpus > 1 and self.local_world_size == 1:
            raise EnvError(
                f"strategy 'ddp' uses one task per GPU but 1 task runs on a node with {gpus} "
                f"GPUs: set --ntasks-per-node={gpus} (or use train.strategy: dp)"
            )

    def export(self, environ: MutableMapping[str, str]) -> None:
        """Write the torchrun-style variables so libraries that read them agree with us."""
        environ.update(
            RANK=str(self.rank),
            LOCAL_RANK=str(self.local_rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_WORLD_SIZE=str(self.local_world_size),
            GROUP_RANK=str(self.node_rank),
            NODE_RANK=str(self.node_rank),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
        )


def verify_master_port(env: DistEnv) -> None:
    """On rank 0 (the master host), test-bind MASTER_PORT before the store binds it.

    The port is derived from the job id; another job on the node (or a stale process) holding it
    gives a clear error instead of a rendezvous that hangs or joins the wrong job.
    """
    if not env.is_main or not env.distributed or env.launcher == "torchrun":
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # TCPStore sets SO_REUSEADDR too; without it a requeued job would trip on TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", env.master_port))
        except OSError as exc:
            raise EnvError(
                f"MASTER_PORT {env.master_port} (derived from job {env.job_id}) is already in use "
                f"on {env.master_addr}: {exc.strerror}; another job shares this node. Export a "
                "free MASTER_PORT in the batch script (e.g. MASTER_PORT=$((20000 + RANDOM)))"
            ) from exc
