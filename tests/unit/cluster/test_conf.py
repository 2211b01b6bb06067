"""Which slurm.conf the client uses: SLURM_CONF, the system's, or a registered finder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import conf
from cluster.client import SlurmClient


@pytest.fixture
def no_system_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(conf, "SYSTEM_CONF", tmp_path / "etc-slurm.conf")
    return tmp_path


def test_slurm_conf_wins(no_system_conf: Path) -> None:
    finders = [lambda env: "/from/finder"]
    assert conf.find_slurm_conf({"SLURM_CONF": "/mine"}, finders) == "/mine"  # type: ignore[list-item]


def test_system_conf_means_slurms_default(no_system_conf: Path) -> None:
    conf.SYSTEM_CONF.write_text("ClusterName=x\n")
    assert conf.find_slurm_conf({}, [lambda env: "/from/finder"]) is None  # type: ignore[list-item]


def test_first_finder_that_finds(no_system_conf: Path) -> None:
    finders = [lambda env: None, lambda env: env.get("HERE"), lambda env: "/last"]
    assert conf.find_slurm_conf({"HERE": "/here"}, finders) == "/here"  # type: ignore[arg-type]
    assert conf.find_slurm_conf({}, [lambda env: None]) is None  # type: ignore[list-item]


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[int]:
    """A process whose name is slurmctld (as the kernel reports it), stopped at the end."""
    code = "open('/proc/self/comm', 'w').write('slurmctld'); import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "slurmctld":
        assert time.monotonic() < deadline, "the stand-in never took its name"
        time.sleep(0.01)
    yield proc.pid
    proc.kill()
    proc.wait()


def test_the_local_cluster_is_registered_not_imported(
    no_system_conf: Path, controller: int
) -> None:
    """cluster.local registers its finder (pyproject entry point); cluster.client names none.
    It offers the dev cluster's config only while its controller runs: a cluster that is down
    leaves its config behind, and Slurm commands would wait on it (18 s each) instead of
    failing at once."""
    names = {f"{f.__module__}:{f.__name__}" for f in conf.registered_finders()}
    assert "cluster.local.paths:find_local_conf" in names
    state = no_system_conf / "cluster"
    (state / "etc").mkdir(parents=True)
    (state / "run").mkdir()
    (state / "etc" / "slurm.conf").write_text("ClusterName=dev\n")
    env = {"SLURM_TRAIN_CLUSTER_DIR": str(state), "PATH": "/usr/bin"}
    assert SlurmClient(environ=env).conf is None  # down: no pid file
    pid_file = state / "run" / "slurmctld.pid"
    pid_file.write_text(f"{os.getpid()}\n")  # a live process, but not a controller
    assert SlurmClient(environ=env).conf is None
    pid_file.write_text(f"{controller}\n")
    assert SlurmClient(environ=env).conf == str(state / "etc" / "slurm.conf")
    assert SlurmClient(environ=env).env()["SLURM_CONF"] == str(state / "etc" / "slurm.conf")


def test_conf_stamp_changes_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "slurm.conf"
    assert conf.conf_stamp(str(path)).endswith(":missing")
    path.write_text("MaxArraySize=1001\n")
    first = conf.conf_stamp(str(path))
    path.write_text("MaxArraySize=20001\n")
    assert conf.conf_stamp(str(path)) != first


def test_release_commands_found_from_the_conf_alone(tmp_path: Path) -> None:
    """A local cluster of another release writes ``slurm-bin`` beside its slurm.conf: the client
    given only SLURM_CONF runs that release's commands (the host's would fail to talk to it);
    $SLURM_TRAIN_SLURM_BIN wins; a folder that is not there (inside a job) changes nothing."""
    wrappers, other = tmp_path / "bin", tmp_path / "other"
    wrappers.mkdir()
    other.mkdir()
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    (tmp_path / conf.BIN_FILE).write_text(f"{wrappers}\n")
    cfg = str(tmp_path / "slurm.conf")
    assert conf.with_slurm_bin({"PATH": "/usr/bin"}, cfg)["PATH"] == f"{wrappers}:/usr/bin"
    env = {"PATH": "/usr/bin", conf.BIN_ENV: str(other)}
    assert conf.with_slurm_bin(env, cfg)["PATH"] == f"{other}:/usr/bin"
    env = {"PATH": "/usr/bin", conf.BIN_ENV: str(tmp_path / "gone")}
    assert conf.with_slurm_bin(env, cfg)["PATH"] == "/usr/bin"
    assert conf.with_slurm_bin({"PATH": "/usr/bin"}, str(tmp_path / "none" / "slurm.conf")) == {
        "PATH": "/usr/bin"
    }
    from cluster.client import SlurmClient

    assert SlurmClient(cfg, environ={"PATH": "/usr/bin"}).env()["PATH"] == f"{wrappers}:/usr/bin"
