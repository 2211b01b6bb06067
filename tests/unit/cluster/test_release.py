"""Releases of the local cluster: names, state dirs and ports, the wrappers, mount points."""

from __future__ import annotations

import os
import shutil
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
    bind,
    merge_accounts,
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


def _mount_problem() -> str | None:
    if os.geteuid() != 0:
        return "bind mounts need root"
    try:
        proc = subprocess.run(["mount", "--bind", "/", "/nonexistent-probe"], capture_output=True,
                              timeout=30, check=False)  # fmt: skip
    except OSError as e:
        return f"mount: {e}"
    # refused for the missing target (exit 32), not for a lack of privilege (exit 1)
    return None if proc.returncode == 32 else f"mount --bind refused here (exit {proc.returncode})"


@pytest.mark.skipif(_mount_problem() is not None, reason=str(_mount_problem()))
def test_a_bind_whose_source_was_cloned_again_shows_the_new_one(tmp_path: Path) -> None:
    """CI clones the checkout again at the same path: the root's bind of the old one shows a
    deleted folder (a job there finds no module, sbatch no working directory). bind() keeps a
    live bind, and replaces a stale one (both layers when it was stacked)."""
    source, target = tmp_path / "checkout", tmp_path / "root" / "checkout"
    source.mkdir()
    (source / "old").write_text("")
    try:
        bind(source, target)
        bind(source, target)  # shows it already: nothing stacked on it
        assert mount_points(Path("/proc/self/mountinfo").read_text()) >= {str(target)}
        shutil.rmtree(source)
        source.mkdir()  # cloned again: another folder at the same path
        (source / "new").write_text("")
        assert not (target / "new").exists()  # the stale bind
        bind(source, target)
        assert sorted(p.name for p in target.iterdir()) == ["new"]
    finally:
        while str(target) in mount_points(Path("/proc/self/mountinfo").read_text()):
            subprocess.run(["umount", "--lazy", str(target)], check=True, timeout=30)


def test_a_mounted_python_target_is_ours_and_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target of ours that is mounted (it shows the machine's file, so it looks like one of
    the root's own) is listed again, for bind() to keep or replace; without the mount, not."""
    import cluster.local.release as rel

    _, libs, root = _fake_machine(tmp_path, monkeypatch)
    found = rel.system_python()
    assert found is not None
    binary, stdlib = found
    for source in (binary, stdlib / "os.py", libs / "libexpat.so.1"):
        target = root / source.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text() or "x")  # what a bind of it shows
    ldd = f"\tlibexpat.so.1 => {libs}/libexpat.so.1 (0x2)\n"
    assert rel.system_python_binds(root, ldd) == []
    mounted = {str(root / p.relative_to("/")) for p in (binary, stdlib, libs / "libexpat.so.1")}
    assert dict(rel.system_python_binds(root, ldd, mounted)) == {
        binary: root / binary.relative_to("/"),
        stdlib: root / stdlib.relative_to("/"),
        libs / "libexpat.so.1": root / libs.relative_to("/") / "libexpat.so.1",
    }


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


def _user_problem() -> str | None:
    import pwd
    import shutil

    if os.geteuid() != 0:
        return "runs a command as another user: needs root"
    try:
        pwd.getpwnam("trainee")
    except KeyError:
        return "no user trainee (scripts/setup.sh adds it)"
    if shutil.which("runuser") is None:
        return "runuser is not installed"
    probe = subprocess.run(
        ["runuser", "-u", "trainee", "--", "/usr/bin/unshare", "--user", "--map-current-user",
         "true"], capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    return None if probe.returncode == 0 else "this machine refuses unprivileged user namespaces"


@pytest.mark.skipif(_user_problem() is not None, reason=str(_user_problem()))
def test_a_user_other_than_root_runs_the_wrapper_as_itself() -> None:
    """Issue 43: ``trainee`` runs another release's commands too (an unprivileged user
    namespace mapped to itself, the root's chroot made there): its own uid and gid inside, the
    working directory and every argument as they were."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="slurm-train-wrapper-", dir="/tmp"))
    try:
        base.chmod(0o755)
        bin_dir, work = base / "bin", base / "a dir; $(touch x)"
        bin_dir.mkdir()
        work.mkdir()
        shutil.chown(work, "trainee", "trainee")
        for command in ("printf", "pwd", "id"):
            (bin_dir / command).write_text(render_wrapper(Path("/"), command, "24.11"))
            (bin_dir / command).chmod(0o755)

        def as_user(*argv: str) -> str:
            return subprocess.run(
                ["runuser", "-u", "trainee", "--", *argv], cwd=work, capture_output=True,
                text=True, check=True, timeout=30,
            ).stdout  # fmt: skip

        args = ["%s|", "two words", "$HOME", "';touch y'", "*", ""]
        assert as_user(str(bin_dir / "printf"), *args) == "two words|$HOME|';touch y'|*||"
        assert as_user(str(bin_dir / "pwd")).strip() == str(work)
        assert as_user(str(bin_dir / "id"), "-un").strip() == "trainee"
        assert as_user(str(bin_dir / "id"), "-u").strip() == as_user("id", "-u").strip()
        assert sorted(p.name for p in work.iterdir()) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_roots_accounts_gain_the_machines_users_and_keep_their_own() -> None:
    """The root's slurmd starts a job as its user, and its commands name the user: the
    machine's accounts it lacks are added; one whose name or id the root has already (its own
    munge, a system account numbered differently) is left out; junk lines are skipped."""
    root = "root:x:0:0:root:/root:/bin/bash\nmunge:x:100:101::/nonexistent:/usr/sbin/nologin\n"
    host = (
        "root:x:0:0:root:/root:/bin/bash\n"
        "munge:x:105:107::/var/lib/munge:/usr/sbin/nologin\n"  # the root's own is kept
        "mysql:x:100:108::/nonexistent:/bin/false\n"  # its id is the root's munge's
        "# a comment\nbroken\nodd:x:notanumber:1::/:/bin/sh\n"
        "trainee:x:1001:1001::/home/trainee:/bin/bash\n"
    )
    merged = merge_accounts(host, root)
    assert merged == root + "trainee:x:1001:1001::/home/trainee:/bin/bash\n"
    assert merge_accounts(host, merged) == merged  # nothing twice
    assert merge_accounts("", root) == root
    assert merge_accounts("trainee:x:1001:\n", "root:x:0:") == "root:x:0:\ntrainee:x:1001:\n"


def test_prepare_merges_the_accounts_into_the_roots_etc(tmp_path: Path) -> None:
    etc, root = tmp_path / "etc", tmp_path / "cache" / "slurm-24.11" / "root"
    etc.mkdir()
    (root / "etc").mkdir(parents=True)
    (etc / "passwd").write_text("trainee:x:1001:1001::/home/trainee:/bin/bash\n")
    (etc / "group").write_text("trainee:x:1001:\n")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "etc" / "passwd").chmod(0o644)
    Root(RELEASES["24.11"], tmp_path / "cache").merge_accounts(etc)
    assert (root / "etc" / "passwd").read_text().splitlines()[-1].startswith("trainee:x:1001:")
    assert (root / "etc" / "group").read_text() == "root:x:0:\ntrainee:x:1001:\n"
    assert (root / "etc" / "passwd").stat().st_mode & 0o777 == 0o644


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


def test_state_dir_and_port_offset_also_after_the_command(tmp_path: Path) -> None:
    before = cli._cluster(cli._parser().parse_args(["--state-dir", str(tmp_path), "status"]))
    after = cli._cluster(cli._parser().parse_args(["status", "--state-dir", str(tmp_path)]))
    assert before.layout.root == after.layout.root == tmp_path
    lc = cli._cluster(
        cli._parser().parse_args(["down", "--state-dir", str(tmp_path), "--port-offset", "700"])
    )
    assert (lc.layout.root, lc.layout.port_offset) == (tmp_path, 700)


@pytest.mark.parametrize(
    "argv",
    [[], ["bogus"], ["up", "--hosts", "bogus"], ["--port-offset", "abc", "status"],
     ["status", "--nope"], ["down", "--", "ls"]],
)  # fmt: skip
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m cluster") and "usage" not in err[0]


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


class _Prepared(Exception):
    """Ends a stubbed ``cluster up`` where it would start building the release's root."""


@pytest.mark.parametrize("slurm", ["24.11", "22.05"])
def test_up_names_the_releases_commands_beside_its_slurm_conf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm: str
) -> None:
    """``cluster up`` writes ``etc/slurm-bin`` (the release's wrappers) beside slurm.conf, so a
    client given only SLURM_CONF (a remote user's environment.setup) runs that release's
    commands, never the host's 22.05 (Incompatible versions of client and server code); the
    host's release: no such file (a stale one removed)."""
    from cluster.local.manager import LocalCluster

    monkeypatch.setenv("SLURM_TRAIN_SLURM_ROOTS", str(tmp_path / "roots"))
    lc = LocalCluster(tmp_path / "state", port_offset=0, slurm=slurm)
    lc.layout.etc.mkdir(parents=True)
    (lc.layout.etc / "slurm-bin").write_text("/stale\n")
    monkeypatch.setattr(lc, "check_installed", lambda: None)
    monkeypatch.setattr(lc, "_ensure_hosts", lambda: None)
    monkeypatch.setattr("cluster.local.manager.write_config", lambda *a, **k: set())

    def prepared() -> None:
        raise _Prepared

    monkeypatch.setattr(lc.slurm, "prepare", prepared)
    with pytest.raises(_Prepared):
        lc.up()
    named = lc.layout.etc / "slurm-bin"
    if lc.slurm.bin_dir is None:
        assert not named.exists()
    else:
        assert named.read_text().strip() == str(lc.slurm.bin_dir)


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


_LDD = """\tlinux-vdso.so.1 (0x00007ffd)
\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f1d)
\tlibexpat.so.1 => /lib/x86_64-linux-gnu/libexpat.so.1 (0x00007f1e)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f1d)
"""


def test_the_libraries_ldd_names_with_a_path() -> None:
    import cluster.local.release as rel

    assert rel.linked_libraries(_LDD) == [
        Path("/lib/x86_64-linux-gnu/libm.so.6"),
        Path("/lib/x86_64-linux-gnu/libexpat.so.1"),
    ]
    assert rel.linked_libraries("not a dynamic executable\n") == []


def _fake_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """A machine's python3.X and its libraries under tmp_path/machine; a root beside it."""
    import cluster.local.release as rel

    machine = tmp_path / "machine"
    binary = machine / "usr/bin/python3.11"
    stdlib = machine / "usr/lib/python3.11"
    libs = machine / "usr/lib/x86_64-linux-gnu"
    for folder in (binary.parent, stdlib, libs):
        folder.mkdir(parents=True)
    binary.write_text("elf")
    (stdlib / "os.py").write_text("# os")
    for name in ("libm.so.6", "libexpat.so.1"):
        (libs / name).write_text("so")
    monkeypatch.setattr(rel, "system_python", lambda: (binary, stdlib))
    root = tmp_path / "root"
    (root / libs.relative_to("/")).mkdir(parents=True)  # the same folder as on the machine
    (root / libs.relative_to("/") / "libm.so.6").write_text("the root's own")
    return machine, libs, root


def test_a_root_without_python_shows_the_machines_and_only_the_libraries_it_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's venv of the login node's /usr/bin/python3 runs on the nodes (one image on a
    real cluster): the root shows the machine's interpreter, its standard library and the
    libraries the interpreter links that the root lacks; never one of the root's own."""
    import cluster.local.release as rel

    _, libs, root = _fake_machine(tmp_path, monkeypatch)
    ldd = f"\tlibm.so.6 => {libs}/libm.so.6 (0x1)\n\tlibexpat.so.1 => {libs}/libexpat.so.1 (0x2)\n"
    binds = dict(rel.system_python_binds(root, ldd))
    found = rel.system_python()
    assert found is not None
    binary, stdlib = found
    assert binds[binary] == root / binary.relative_to("/")
    assert binds[stdlib] == root / stdlib.relative_to("/")
    assert binds[libs / "libexpat.so.1"] == root / libs.relative_to("/") / "libexpat.so.1"
    assert libs / "libm.so.6" not in binds  # the root's own is kept


def test_a_root_with_a_python_of_its_own_shows_none_of_the_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cluster.local.release as rel

    _, _, root = _fake_machine(tmp_path, monkeypatch)
    found = rel.system_python()
    assert found is not None
    binary = found[0]
    own = root / binary.relative_to("/")
    own.parent.mkdir(parents=True)
    own.write_text("the root's own python3.11")
    assert rel.system_python_binds(root, "") == []
    own.write_text("")  # an empty placeholder of ours (a bind that is gone): bound again
    assert rel.system_python_binds(root, "")


def test_no_debian_style_system_python_binds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import cluster.local.release as rel

    monkeypatch.setattr(rel, "system_python", lambda: None)
    assert rel.system_python_binds(Path("/nonexistent-root"), _LDD) == []
