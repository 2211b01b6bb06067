"""Shared fixtures. Integration tests use ONE real local Slurm cluster per session.

- ``slurm_cluster``: brings the local cluster up once (``python -m cluster up`` does the same),
  or skips with one clear reason where Slurm is absent and cannot be installed. In CI
  (``CI=true``, root on Debian) it never skips: an unusable cluster fails the run. Each test
  worker (``make test`` runs the integration tests on several, pytest-xdist) has a cluster of
  its own, started afresh for the session (:func:`worker_cluster`), so a test's preemptions,
  dead nodes and held nodes never reach another test's jobs, and no test touches the default
  cluster that ``make demo`` uses.
  ``SLURM_TRAIN_TEST_SLURM=24.11`` (``make test SLURM=24.11``) brings them up on that Slurm
  release (cluster.local.release; 22.05, the host's, by default).
  Each node is a host of its own (``--hosts net``, cluster.local.hosts), sharing the
  session's temporary folder with every host (run directories there), wherever network
  namespaces can be made for the release under test; elsewhere every node runs on this
  machine (``shared``) and the run's header says why, once. ``SLURM_TRAIN_TEST_HOSTS=shared``
  (or ``net``) asks for one: ``net`` where it cannot be made skips, saying why.
- ``slurm_env``: ``os.environ`` plus ``SLURM_CONF`` pointing at that cluster, and ``PATH`` with
  the release's commands first, for subprocesses.
- ``slurm_client``: a :class:`cluster.client.SlurmClient` for that cluster.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
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
    ignores stop signals, as it must inside a job; no test may leak that into the next one,
    nor a signal its handlers remembered (``train.stop.signals``' process-wide records: a
    process is one attempt in a job, a test is not)."""
    saved = {s: signal.getsignal(s) for s in _STOP_SIGNALS}
    yield
    for s, handler in saved.items():
        if signal.getsignal(s) is not handler and handler is not None:
            signal.signal(s, handler)
    records = sys.modules.get("train.stop.signals")
    if records is not None:
        records._EARLY.clear()
        records._TERM_AT.clear()


@pytest.fixture(params=["file", "under_a_file"])
def unmakeable_run_dir(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    """(a user's file that must stay as it is, a run directory that cannot be made: that file
    itself, or a folder under it)."""
    taken = tmp_path / "taken"
    taken.write_text("keep")
    return taken, taken if request.param == "file" else taken / "run"


def worker_cluster(worker: str | None) -> tuple[Path, int]:
    """The state directory and port offset of a test worker's own cluster (``gwN``, or ``gw0``
    for a run without workers): ``/var/tmp/slurm-train-test-N`` on ports shifted by
    (N + 2) x 100 (100 is the life-cycle test's cluster). Every port stays below the
    rendezvous ports train derives from job ids (20000 and up: train.env.master_port_for_job),
    and each cluster's job ids start 500 apart (cluster.local.config.Layout.first_job_id:
    1001, 1501, ...; distinct rendezvous ports for up to 22 workers). The tests never touch the
    default cluster (``make demo``'s)."""
    index = int(worker.removeprefix("gw")) if worker else 0
    # Several checkouts testing on one machine at once (git worktrees) keep their clusters
    # apart by shifting their workers' indexes: SLURM_TRAIN_TEST_WORKER_BASE=8 -> gw0 is 8.
    index += int(os.environ.get("SLURM_TRAIN_TEST_WORKER_BASE", "0") or 0)
    return Path(f"/var/tmp/slurm-train-test-{index}"), 100 * (index + 2)


#: The Slurm release the test workers' clusters run (`make test SLURM=24.11`); 22.05 by default.
SLURM_RELEASE_ENV = "SLURM_TRAIN_TEST_SLURM"


#: The hosts layout of the test workers' clusters (cluster.local.hosts): shared or net.
HOSTS_LAYOUT_ENV = "SLURM_TRAIN_TEST_HOSTS"


def hosts_layout_under_test() -> str:
    """The layout asked for (``$SLURM_TRAIN_TEST_HOSTS``; the run's first process sets it,
    :func:`pytest_configure`), else the default."""
    return os.environ.get(HOSTS_LAYOUT_ENV) or default_hosts_layout()[0]


def default_hosts_layout() -> tuple[str, str | None]:
    """``net`` where its namespaces can be made for the release under test, else ``shared``
    and why not."""
    from cluster.local.hosts import netns_problem

    problem = netns_problem()
    return ("net", None) if problem is None else ("shared", problem)


_FALLBACK = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Pick the test clusters' hosts layout once, in the run's first process (pytest-xdist's
    workers inherit it through the environment): ``net`` by default, ``shared`` where it
    cannot be made (said once in the header, :func:`pytest_report_header`). Not for a run
    that selects no integration test (``make unit``) nor where no cluster can run at all."""
    if hasattr(config, "workerinput") or os.environ.get(HOSTS_LAYOUT_ENV):
        return
    if "not integration" in (config.getoption("markexpr") or "") or _skip_reason():
        return
    layout, why = default_hosts_layout()
    os.environ[HOSTS_LAYOUT_ENV] = layout
    if why is not None:
        config.stash[_FALLBACK] = why


def pytest_report_header(config: pytest.Config) -> list[str]:
    why = config.stash.get(_FALLBACK, None)
    if why is None:
        return []
    return [f"integration clusters: every node on this machine (--hosts shared), not net: {why}"]


def slurm_release_under_test() -> str:
    from cluster.local.release import HOST_RELEASE

    return os.environ.get(SLURM_RELEASE_ENV) or HOST_RELEASE


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from cluster.local.hosts import netns_problem
    from cluster.local.manager import LocalCluster

    reason = _skip_reason()
    hosts = hosts_layout_under_test()
    if reason is None and hosts == "net":
        reason = netns_problem()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"integration tests must run in CI: {reason}")
        pytest.skip(reason)
    root, offset = worker_cluster(os.environ.get("PYTEST_XDIST_WORKER"))
    # A fresh cluster for every session (a few seconds): no job of an earlier session left
    # on it, and job ids from its first again, so that the clusters of the workers, which run
    # at once, never derive one rendezvous port (jobs share the machine's ports). The one
    # there is brought down with the release it runs, the new one up with the release asked.
    LocalCluster(root, port_offset=offset).down()
    lc = LocalCluster(
        root,
        port_offset=offset,
        slurm=slurm_release_under_test(),
        hosts=hosts,
        # the tests' run directories (tmp_path) are under it: every host sees the machine's
        shared=[str(tmp_path_factory.getbasetemp())],
    )
    shutil.rmtree(root, ignore_errors=True)
    lc.up()
    yield lc
    # Left up after the session (`make cluster-down` stops it): the next session starts afresh.


@pytest.fixture(scope="session")
def slurm_env(slurm_cluster: object) -> dict[str, str]:
    from cluster.local.paths import PORT_OFFSET_ENV, STATE_ENV

    env = dict(os.environ)
    env["SLURM_CONF"] = str(slurm_cluster.conf)  # type: ignore[attr-defined]
    # a release other than the host's: its wrappers (its own sbatch, squeue, ...) come first
    env["PATH"] = slurm_cluster.client_environ()["PATH"]  # type: ignore[attr-defined]
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
