"""Who stops: the one environment interface every stopper implements (torch-free).

The stop path (:mod:`train.stop.act`: who decides, the facts, the events) reads these fields of
the process that stops, and nothing else. Two kinds of process implement it:

- a rank: :class:`train.env.DistEnv` (the run session, the command supervisor, a failing rank);
- a process that decides for the job without being a rank: :class:`Decider` (the node's hang
  watcher, the batch script's after-step, :mod:`train.stop.step`). It acts as rank 0 for the
  attempt it decides (one claimant per attempt), and carries the same in-place facts a rank
  has: a hang or a failure it decides restarts in place when the budget allows, exactly as one
  decided by a rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from train.env import attempt_key

__all__ = ["Decider", "StopEnv"]


class StopEnv(Protocol):
    """What the stop path knows of the process that stops (all of it: no field is optional)."""

    @property
    def is_main(self) -> bool:
        """Whether it decides for the attempt (global rank 0, or a decider standing in)."""
        ...

    @property
    def job_id(self) -> str | None: ...
    @property
    def restart_count(self) -> int:
        """Slurm's restart count of the job (a requeue starts the next)."""
        ...

    @property
    def in_place(self) -> int:
        """Restarts in place within this allocation so far (the N of ``2.N``)."""
        ...

    @property
    def in_place_supervised(self) -> bool:
        """A batch script restarts this job's failed or hung steps in place."""
        ...

    @property
    def submission(self) -> str | None:
        """The local executor's submission id (``local-N``; None under Slurm, whose job id is
        the submission): events carry it, budgets per submission count by it."""
        ...

    @property
    def attempt(self) -> str:
        """The attempt's key (``2``, ``2.1``): claims and markers of one attempt use it."""
        ...

    @property
    def world_size(self) -> int: ...
    @property
    def hosts(self) -> tuple[str, ...]:
        """The nodes of the job (one of them down makes a failure a node failure)."""
        ...

    @property
    def node_name(self) -> str | None:
        """This process's Slurm node (a device fault excludes it), None when not known."""
        ...

    @property
    def slurm_release(self) -> str | None:
        """The cluster's Slurm release as the submission's preflight read it (exported by the
        batch script: :data:`train.env.SLURM_RELEASE_ENV`); None for a batch script written by
        hand, which exports none (the stop then asks the job's own ``scontrol --version``)."""
        ...


@dataclass(frozen=True)
class Decider:
    """A process that decides the stop of an attempt without being one of its ranks (the hang
    watcher of a node, the batch script after a step): it acts as rank 0."""

    job_id: str | None
    restart_count: int
    in_place: int = 0
    in_place_supervised: bool = False
    submission: str | None = None
    world_size: int = 1
    hosts: tuple[str, ...] = ()
    node_name: str | None = None
    is_main: bool = True
    slurm_release: str | None = None

    @property
    def attempt(self) -> str:
        """As :attr:`train.env.DistEnv.attempt`."""
        return attempt_key(self.restart_count, self.in_place)
