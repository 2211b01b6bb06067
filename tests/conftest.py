"""Shared fixtures. Integration tests use ONE real local Slurm cluster per session.

- ``slurm_cluster``: brings the local cluster up once (``python -m cluster up`` does the same),
  or skips with one clear reason where Slurm is absent and cannot be installed. In CI
  (``CI=true``, root on Debian) it never skips: an unusable cluster fails the run. Under
  pytest-xdist (``make test`` runs the integration tests on several workers) each worker has a
  cluster of its own: ``gw0`` the default one, ``gwN`` its own state directory and ports
  (:func:`worker_cluster`), so a test's preemptions, dead nodes and held nodes never reach
  another test's jobs.
- ``slurm_env``: ``os.environ`` plus ``SLURM_CONF`` pointing at that cluster, for subprocesses.
- ``slurm_client``: a :class:`cluster.client.SlurmClient` for that cluster.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _skip_reason() -> str | None:
    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        return "Slurm is not installed (run `make test` as root on Debian to install it)"
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (daemons, /etc/hosts)"
    return None


@pytest.fixture(autouse=True)
def _isolated_environ() -> Iterator[None]:
    """``train.cli.main`` run in-process exports RANK/WORLD_SIZE/... into ``os.environ`` (as it
    must for libraries inside a job); no test may leak them into the next one's subprocesses."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


_STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP")
)


@pytest.fixture(autouse=True)
def _isolated_signals() -> Iterator[None]:
    """Code run in-process (jobs.launch, train.cli, guards) installs stop-signal handlers or
    ignores stop signals, as it must inside a job; no test may leak that into the next one."""
    saved = {s: signal.getsignal(s) for s in _STOP_SIGNALS}
    yield
    for s, handler in saved.items():
        if signal.getsignal(s) is not handler and handler is not None:
            signal.signal(s, handler)


def worker_cluster(worker: str | None) -> tuple[Path | None, int]:
    """The state directory and port offset of a test worker's cluster: the default cluster
    (None, 0) for a run without workers and for ``gw0``; for ``gwN`` its own directory beside
    the default one and ports shifted by N x 1000 (whose first job id is N x 10000 + 1:
    cluster.local.config.Layout.first_job_id)."""
    if not worker or worker == "gw0":
        return None, 0
    index = int(worker.removeprefix("gw"))
    return Path(f"/var/tmp/slurm-train-cluster-{worker}"), 1000 * index


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[object]:
    from cluster.local.manager import LocalCluster

    reason = _skip_reason()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"integration tests must run in CI: {reason}")
        pytest.skip(reason)
    root, offset = worker_cluster(os.environ.get("PYTEST_XDIST_WORKER"))
    if root is None:  # the default cluster, whatever the environment of this session says
        from cluster.local.paths import DEFAULT_STATE_DIR

        root = DEFAULT_STATE_DIR
    lc = LocalCluster(root, port_offset=offset)
    lc.up()
    yield lc
    # The cluster stays up after the session on purpose: `make demo` and later runs reuse it
    # (`python -m cluster down` stops it).


@pytest.fixture(scope="session")
def slurm_env(slurm_cluster: object) -> dict[str, str]:
    from cluster.local.paths import PORT_OFFSET_ENV, STATE_ENV

    env = dict(os.environ)
    env["SLURM_CONF"] = str(slurm_cluster.conf)  # type: ignore[attr-defined]
    # `python -m cluster` and `jobs` in a test's subprocess find this worker's cluster too
    layout = slurm_cluster.layout  # type: ignore[attr-defined]
    env[STATE_ENV] = str(layout.root)
    env[PORT_OFFSET_ENV] = str(layout.port_offset)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@pytest.fixture(scope="session")
def slurm_client(slurm_env: dict[str, str]) -> object:
    from cluster.client import SlurmClient

    return SlurmClient(environ=slurm_env)
