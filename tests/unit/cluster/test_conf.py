"""Which slurm.conf the client uses: SLURM_CONF, the system's, or a registered finder."""

from __future__ import annotations

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


def test_the_local_cluster_is_registered_not_imported(no_system_conf: Path) -> None:
    """cluster.local registers its finder (pyproject entry point); cluster.client names none."""
    names = {f"{f.__module__}:{f.__name__}" for f in conf.registered_finders()}
    assert "cluster.local.paths:find_local_conf" in names
    state = no_system_conf / "cluster"
    (state / "etc").mkdir(parents=True)
    (state / "etc" / "slurm.conf").write_text("ClusterName=dev\n")
    env = {"SLURM_TRAIN_CLUSTER_DIR": str(state), "PATH": "/usr/bin"}
    assert SlurmClient(environ=env).conf == str(state / "etc" / "slurm.conf")
    assert SlurmClient(environ=env).env()["SLURM_CONF"] == str(state / "etc" / "slurm.conf")


def test_conf_stamp_changes_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "slurm.conf"
    assert conf.conf_stamp(str(path)).endswith(":missing")
    path.write_text("MaxArraySize=1001\n")
    first = conf.conf_stamp(str(path))
    path.write_text("MaxArraySize=20001\n")
    assert conf.conf_stamp(str(path)) != first
