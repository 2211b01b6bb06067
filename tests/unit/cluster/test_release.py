"""Releases of the local cluster: names, state dirs and ports, the wrappers, mount points."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cluster import cli
from cluster.errors import LocalClusterError
from cluster.local import config as cfg
from cluster.local.release import (
    HOST_RELEASE,
    RELEASES,
    Root,
    mount_points,
    release,
    render_wrapper,
)


def test_unknown_release_is_one_line_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(LocalClusterError, match=r"^Slurm release '25\.11': choose one of 22\.05, "):
        release("25.11")
    assert cli.main(["--slurm", "25.11", "status"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Slurm release '25.11'") and err.count("\n") == 1


def test_each_release_has_its_own_state_dir_and_ports() -> None:
    base = Path("/var/tmp/slurm-train-cluster")
    dirs = {r.default_state_dir(base) for r in RELEASES.values()}
    assert release(HOST_RELEASE).default_state_dir(base) == base and len(dirs) == len(RELEASES)
    # three slurmd ports each from the offset: no two clusters (the default, the life-cycle
    # test's 100, the test workers' 200, 300, ...) share one
    offsets = (
        [r.port_offset for r in RELEASES.values()] + [100] + [100 * (n + 2) for n in range(24)]
    )
    ports = [cfg.Layout(base, o).slurmd_port(i) for o in offsets for i in range(3)]
    assert len(set(ports)) == len(ports) and max(ports) < 20000


def test_host_release_runs_programs_as_they_are() -> None:
    root = Root(release(HOST_RELEASE), Path("/nonexistent"))
    assert root.command(["slurmd", "-N", "n1"]) == ["slurmd", "-N", "n1"]
    assert root.path is None and root.bin_dir is None
    other = Root(release("24.11"), Path("/c"))
    assert other.command(["slurmd", "-N", "n1"]) == ["chroot", "/c/slurm-24.11/root", "slurmd",
                                                     "-N", "n1"]  # fmt: skip


def test_cgroup_plugin_disabled_beyond_the_host_release() -> None:
    assert "CgroupPlugin=autodetect" in cfg.render_cgroup_conf(HOST_RELEASE)
    assert "CgroupPlugin=disabled" in cfg.render_cgroup_conf("24.11")


def test_mount_points_unescaped() -> None:
    text = (
        "36 35 98:0 / /proc rw - proc proc rw\n"
        "37 35 98:0 /x /var/cache/a\\040b/root/tmp rw - ext4 /dev/x rw\n"
    )
    assert mount_points(text) == {"/proc", "/var/cache/a b/root/tmp"}


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_wrapper_keeps_cwd_and_arguments_exactly(tmp_path: Path) -> None:
    """The wrapper of a command runs it in the root (here ``/``) with the caller's working
    directory and every argument as it was: nothing is re-parsed by a shell."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("printf", "pwd"):
        (bin_dir / command).write_text(render_wrapper(Path("/"), command, "24.11"))
        (bin_dir / command).chmod(0o755)
    work = tmp_path / "a dir; $(touch x)"
    work.mkdir()
    args = ["%s|", "two words", "$HOME", "';touch y'", "*", ""]
    out = subprocess.run([str(bin_dir / "printf"), *args], cwd=work, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert out == "two words|$HOME|';touch y'|*||"
    cwd = subprocess.run([str(bin_dir / "pwd")], cwd=work, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert cwd.strip() == str(work) and sorted(p.name for p in work.iterdir()) == []


def test_slurm_flag_picks_the_release_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``up --slurm 24.11`` (the flag before or after the command) is 24.11's own cluster: its
    state dir and port offset; a state dir or offset given explicitly wins."""
    from cluster.local.paths import PORT_OFFSET_ENV, STATE_ENV

    monkeypatch.delenv(STATE_ENV, raising=False)
    monkeypatch.delenv(PORT_OFFSET_ENV, raising=False)
    for argv in (["up", "--slurm", "24.11"], ["--slurm", "24.11", "status"]):
        lc = cli._cluster(cli._parser().parse_args(argv))
        assert lc.layout.root == Path("/var/tmp/slurm-train-cluster-24.11")
        assert (lc.layout.port_offset, lc.release.name) == (130, "24.11")
    lc = cli._cluster(
        cli._parser().parse_args(["--state-dir", str(tmp_path), "up", "--slurm", "26.05"])
    )
    assert (lc.layout.root, lc.layout.port_offset, lc.release.name) == (tmp_path, 0, "26.05")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "slurm-release").write_text("24.11\n")  # what `up` recorded there
    lc = cli._cluster(cli._parser().parse_args(["--state-dir", str(tmp_path), "down"]))
    assert lc.release.name == "24.11"


def test_a_missing_mmdebstrap_is_one_line_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import cluster.local.release as rel

    monkeypatch.setattr(rel.shutil, "which", lambda name, path=None: None)
    with pytest.raises(LocalClusterError, match=r"apt-get install -y mmdebstrap") as exc:
        Root(release("26.05"), tmp_path).prepare()
    assert "\n" not in str(exc.value) and not (tmp_path / "slurm-26.05" / "root").exists()


def test_a_state_dir_keeps_its_release(tmp_path: Path) -> None:
    """Its database and controller state are that release's: another release is refused in
    one line that says what to do; the same release (or none recorded) is fine."""
    from cluster.local.manager import LocalCluster

    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "slurm-release").write_text("26.05\n")
    with pytest.raises(LocalClusterError, match=r"holds a cluster of Slurm 26\.05, not 22\.05"):
        LocalCluster(tmp_path, port_offset=0, slurm="22.05")._check_release()
    LocalCluster(tmp_path, port_offset=0)._check_release()  # the recorded one
    LocalCluster(tmp_path / "new", port_offset=0, slurm="24.11")._check_release()


def test_binds_never_cover_the_roots_own_system(monkeypatch: pytest.MonkeyPatch) -> None:
    """A venv of Debian's own python has the prefix /usr: binding it would replace the root's
    Slurm and libraries with the host's. Such a prefix is left out; pyenv's or uv's is bound."""
    import cluster.local.release as rel

    monkeypatch.setattr(rel.sys, "base_prefix", "/usr")
    sources = [str(p) for p in rel.bind_sources()]
    assert "/usr" not in sources and "/proc" in sources and "/dev/shm" in sources
    assert sources.index("/dev") < sources.index("/dev/shm")
    assert str(rel.checkout()) in sources or any(
        str(rel.checkout()).startswith(s + "/") for s in sources
    )
