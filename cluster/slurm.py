"""What ``train/`` and ``jobs/`` ask of Slurm (:class:`Slurm`, a typed protocol) and the one
factory that builds it (:func:`slurm_client`).

Nothing outside this package builds a client by hand (tests/unit/test_layering.py): every caller
asks :func:`slurm_client`, so the transport is chosen in one place. Two transports: the
Slurm commands of this machine (:class:`cluster.client.SlurmClient`: argument lists, timeouts,
parsing in :mod:`cluster.parse`), and the same commands over SSH on a login node
(:class:`cluster.ssh.SshSlurmClient`, ``remote=HOST``), behind the same protocol. Importing
this module is cheap (no subprocess, no parser): the client's module is imported when one is
built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cluster.models import ClusterLimits, ClusterState, JobAttempt, JobInfo, Node, Partition

__all__ = ["JobQueries", "Slurm", "SlurmFactory", "slurm_client"]


class JobQueries(Protocol):
    """The part of :class:`Slurm` a stop asks (``train.stop``): one job's fields, its
    partition, the nodes' states, the release of the commands it runs. A stop's cache
    (:class:`train.stop.facts.AskedOnce`) is one, and so is every :class:`Slurm`."""

    def show_job(self, job_id: str) -> dict[str, str]: ...
    def partition(self, name: str) -> Partition | None: ...
    def nodes(self) -> list[Node]: ...
    def installed_release(self) -> str | None:
        """The release of the ``scontrol`` the client runs (the program's own answer, no daemon
        asked); None when it cannot say."""
        ...


class Slurm(JobQueries, Protocol):
    """One Slurm cluster, as ``train/`` and ``jobs/`` use it (every method one command, or one
    per batch of ids; errors: :class:`cluster.errors.SlurmCommandError` and its kin)."""

    # -- the cluster ---------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment Slurm commands (and submitit) run with (``SLURM_CONF`` set)."""
        ...

    def installed(self) -> bool: ...
    def ping(self) -> bool: ...
    def prefetch_cluster_state(self) -> None:
        """Start the ``sinfo`` that :meth:`cluster_state` will read, without waiting for it."""
        ...

    def discard_prefetch(self) -> None: ...
    def nodes(self) -> list[Node]: ...
    def partitions(self) -> list[Partition]: ...
    def partition(self, name: str) -> Partition | None: ...
    def cluster_state(self) -> ClusterState: ...
    def limits(self) -> ClusterLimits: ...
    def conf_stamp(self) -> str: ...
    def requeue_settings(self, partition: str) -> tuple[str, str]:
        """(``JobRequeue``, the partition's ``PreemptMode``): whether a job can be requeued."""

    def sbatch_options(self) -> frozenset[str]:
        """The long options ``sbatch --help`` lists (its release's)."""
        ...

    def cluster_name(self) -> str: ...
    def may_raise_time_limits(self) -> bool: ...

    # -- jobs ----------------------------------------------------------------------------------
    def submit(
        self,
        script: str | os.PathLike[str],
        args: Sequence[str] = (),
        *,
        script_args: Sequence[str] = (),
        cwd: str | os.PathLike[str] | None = None,
    ) -> str: ...
    def job_states(self, job_ids: Iterable[str]) -> dict[str, JobInfo]: ...
    def poll_states(self, job_ids: Iterable[str]) -> dict[str, JobInfo]: ...
    def attempts(self, job_id: str) -> list[JobInfo]: ...
    def attempt_times(self, job_id: str, sluid: bool = False) -> list[JobAttempt]: ...
    def queue(self, user: str | None = None) -> dict[str, JobInfo]: ...
    def show_job(self, job_id: str) -> dict[str, str]: ...
    def cancel(
        self, job_ids: Iterable[str], signal: str | None = None, *, no_requeue: bool = False
    ) -> None: ...
    def requeue(self, job_id: str) -> None: ...

    def forbid_requeue(self, job_id: str) -> None: ...
    def set_dependency(self, job_id: str, dependency: str) -> None: ...
    def exclude_nodes(self, job_id: str, nodes: Iterable[str]) -> list[str]: ...
    def set_time_limit(self, job_id: str, limit: str) -> None: ...
    def release(self, job_id: str, settle_s: float = ...) -> None: ...
    def wait_for(
        self,
        job_id: str,
        until: Callable[[JobInfo], bool] = ...,
        *,
        timeout: float = 300.0,
        poll: float = 1.0,
    ) -> JobInfo: ...


#: A caller that builds its client only when it needs one (``lambda: slurm_client()``).
SlurmFactory = Callable[[], Slurm]


def slurm_client(
    *,
    environ: Mapping[str, str] | None = None,
    conf: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    shielded: bool = False,
    remote: str | None = None,
    remote_setup: str = "",
) -> Slurm:
    """The client of the cluster ``environ`` (default ``os.environ``) points at.

    ``conf``: the slurm.conf (default: :func:`cluster.conf.find_slurm_conf` of ``environ``);
    ``timeout``: seconds per command (default :data:`cluster.client.DEFAULT_TIMEOUT_S`);
    ``shielded``: the commands ignore the signals Slurm sends a
    job's processes (a stop's own ``scontrol requeue`` runs while Slurm ends its step);
    ``remote``: an alias of the user's OpenSSH configuration: the commands run on that host
    through ssh (:mod:`cluster.ssh`; ``conf`` is then the remote slurm.conf, None: the remote
    host's own); ``remote_setup``: shell text that opens every remote command line there (a
    spec's ``environment.setup`` exporting ``SLURM_CONF``, say; the caller quotes it)."""
    from cluster.client import DEFAULT_TIMEOUT_S

    if remote is not None:
        from cluster.ssh import SshSlurmClient, resolve  # the transport: ssh to a login node

        return SshSlurmClient(
            resolve(remote, environ),
            conf=conf,
            timeout=DEFAULT_TIMEOUT_S if timeout is None else timeout,
            environ=environ,
            setup=remote_setup,
        )
    from cluster.client import SlurmClient  # the transport: local commands

    return SlurmClient(
        conf=conf,
        timeout=DEFAULT_TIMEOUT_S if timeout is None else timeout,
        environ=environ,
        shielded=shielded,
    )
