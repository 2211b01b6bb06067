"""Several local clusters side by side (the integration tests run one per test worker): each
gets its own ports and its own range of job ids, from a state directory and a port offset that
the environment can give (SLURM_TRAIN_CLUSTER_DIR, SLURM_TRAIN_CLUSTER_PORT_OFFSET)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.errors import LocalClusterError
from cluster.local import config as cfg
from cluster.local.manager import LocalCluster
from cluster.local.paths import PORT_OFFSET_ENV, STATE_ENV, port_offset
from tests import conftest
from tests.conftest import worker_cluster
from train.env import PORT_BASE, master_port_for_job


def _ports(layout: cfg.Layout) -> set[int]:
    return {
        layout.slurmctld_port,
        layout.slurmdbd_port,
        layout.mariadb_port,
        *(layout.slurmd_port(i) for i in range(len(cfg.NODES))),
    }


def test_the_default_cluster_renders_as_before() -> None:
    text = cfg.render_slurm_conf(cfg.Layout(Path("/s")), "host")
    assert "FirstJobId" not in text and "SlurmctldPort=16817" in text


def test_shifted_clusters_share_no_port_and_start_their_job_ids_apart() -> None:
    # the default cluster, the life-cycle test's (100) and test workers gw0..gw21
    layouts = [cfg.Layout(Path("/s")), *(cfg.Layout(Path(f"/s{k}"), 100 * k) for k in range(1, 24))]
    ports = [_ports(layout) for layout in layouts]
    assert all(a.isdisjoint(b) for i, a in enumerate(ports) for b in ports[i + 1 :])
    # no Slurm daemon listens where a job's rendezvous port may be (seen: a worker cluster's
    # slurmd on 20001, job 1's MASTER_PORT, when the offsets were 1000 apart)
    assert all(p < PORT_BASE for layout_ports in ports for p in layout_ports)
    text = cfg.render_slurm_conf(layouts[3], "host")
    assert "FirstJobId=1501\n" in text and "SlurmctldPort=17117" in text
    # jobs running at once on two clusters (each fresh: fewer than 500 jobs a session) derive
    # different rendezvous ports from their ids
    firsts = [layout.first_job_id for layout in layouts[2:]]
    for n in range(0, 500, 7):
        assert len({master_port_for_job(str(first + n)) for first in firsts}) == len(firsts)


@pytest.mark.parametrize(
    ("worker", "root", "offset"),
    [
        (None, Path("/var/tmp/slurm-train-test-0"), 200),
        ("gw0", Path("/var/tmp/slurm-train-test-0"), 200),
        ("gw2", Path("/var/tmp/slurm-train-test-2"), 400),
    ],
)
def test_each_test_worker_has_its_own_cluster(
    worker: str | None, root: Path, offset: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_TRAIN_TEST_WORKER_BASE", raising=False)  # a worktree's shift
    assert worker_cluster(worker) == (root, offset)
    monkeypatch.setenv("SLURM_TRAIN_TEST_WORKER_BASE", "8")
    shifted = worker_cluster(worker)
    assert shifted[0].name == f"slurm-train-test-{int(root.name.rsplit('-', 1)[1]) + 8}"


def test_the_environment_names_the_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    monkeypatch.setenv(PORT_OFFSET_ENV, "300")
    lc = LocalCluster()
    assert lc.layout.root == tmp_path.resolve() and lc.layout.port_offset == 300
    assert LocalCluster(port_offset=0).layout.port_offset == 0  # an explicit offset wins


@pytest.mark.parametrize("raw", ["x", "-1", "1e3", "99999"])
def test_a_bad_port_offset_is_one_clear_error(raw: str) -> None:
    with pytest.raises(LocalClusterError, match=PORT_OFFSET_ENV):
        port_offset({PORT_OFFSET_ENV: raw})


@pytest.mark.parametrize(
    ("release", "problem", "layout", "says"),
    [
        ("", None, "net", None),
        ("22.05", None, "net", None),
        ("", "network namespaces cannot be made here: denied", "shared", "cannot be made here"),
        ("24.11", None, "net", None),
        ("26.05", "no ip", "shared", "no ip"),
    ],
)
def test_the_test_clusters_are_net_hosts_wherever_they_can_be(
    monkeypatch: pytest.MonkeyPatch,
    release: str,
    problem: str | None,
    layout: str,
    says: str | None,
) -> None:
    """The harness's default (tests/conftest.py): net hosts, else the shared layout and why,
    said once in the run's header; the layout asked for wins."""
    import cluster.local.hosts as hosts

    monkeypatch.setattr(hosts, "netns_problem", lambda: problem)
    monkeypatch.setattr(conftest, "_skip_reason", lambda: None)
    monkeypatch.setenv(conftest.SLURM_RELEASE_ENV, release)
    monkeypatch.delenv(conftest.HOSTS_LAYOUT_ENV, raising=False)

    class Config:
        stash = pytest.Stash()

        @staticmethod
        def getoption(name: str) -> str:
            return "integration"

    config = Config()
    conftest.pytest_configure(config)  # type: ignore[arg-type]
    assert os.environ[conftest.HOSTS_LAYOUT_ENV] == layout
    assert conftest.hosts_layout_under_test() == layout
    header = conftest.pytest_report_header(config)  # type: ignore[arg-type]
    if says is None:
        assert header == []
    else:
        assert len(header) == 1 and "(--hosts shared)" in header[0] and says in header[0]
    monkeypatch.setenv(conftest.HOSTS_LAYOUT_ENV, "shared")  # asked for: kept, nothing said
    config.stash = pytest.Stash()
    conftest.pytest_configure(config)  # type: ignore[arg-type]
    assert os.environ[conftest.HOSTS_LAYOUT_ENV] == "shared" and not conftest.pytest_report_header(
        config
    )  # type: ignore[arg-type]
