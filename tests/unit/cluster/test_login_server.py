"""The local cluster's login node (cluster/local/sshd.py): the 2FA alias of issue 47, its PAM
service and its password check, written without starting anything (no root, no /etc needed:
the PAM folder is a temporary one)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cluster.local import sshd


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> sshd.LoginServer:
    pam = tmp_path / "pam.d"
    pam.mkdir()
    monkeypatch.setattr(sshd, "PAM_DIR", pam)
    monkeypatch.setattr(sshd.LoginServer, "two_fa_possible", lambda self: True)
    return sshd.LoginServer(tmp_path / "state", 12422, tmp_path, tmp_path)


def test_the_2fa_alias_is_keyboard_interactive_on_a_port_of_its_own(
    server: sshd.LoginServer,
) -> None:
    server.write("trainee")
    conf = (server.dir / "sshd_config").read_text()
    assert "Port 12422\nPort 12423\n" in conf
    assert "AuthenticationMethods publickey\n" in conf  # the key port: the key only
    head, _, match = conf.partition("Match LocalPort 12423\n")
    assert match.strip() == "AuthenticationMethods keyboard-interactive"
    assert "KbdInteractiveAuthentication yes" in head
    client = server.client_config.read_text()
    block = client.split(f"Host {sshd.TWO_FA_ALIAS}\n", 1)[1]
    assert "Port 12423" in block and "PubkeyAuthentication no" in block
    assert "IdentityFile" not in block
    assert "[127.0.0.1]:12423 " in (server.dir / "known_hosts").read_text()
    # the PAM service is the server's program name: a link to sshd named after it
    assert server.program.name == server.service and os.readlink(server.program) == sshd.SSHD
    pam = (sshd.PAM_DIR / server.service).read_text()
    assert f"pam_exec.so quiet expose_authtok {server.dir / 'check-password'}" in pam
    assert "account include sshd" in pam and "session include sshd" in pam
    for name in (sshd.PASSWORD_FILE, "check-password"):  # secrets: root's only
        assert (server.dir / name).stat().st_mode & 0o077 == 0


def test_the_password_check_takes_the_password_and_only_for_the_user(
    server: sshd.LoginServer,
) -> None:
    server.write("trainee")
    password = (server.dir / sshd.PASSWORD_FILE).read_text().strip()
    check = server.dir / "check-password"

    def run(user: str, given: bytes) -> int:
        env = {**os.environ, "PAM_USER": user}
        done = subprocess.run([str(check)], input=given, env=env, timeout=30, check=False)
        return done.returncode

    assert run("trainee", password.encode() + b"\0") == 0  # as pam_exec gives it
    assert run("trainee", b"wrong\0") != 0
    assert run("someone", password.encode() + b"\0") != 0
    server.write("trainee")  # every `up`: a new password
    assert (server.dir / sshd.PASSWORD_FILE).read_text().strip() != password


def test_no_2fa_alias_where_it_cannot_be_made_safely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sshd, "PAM_DIR", tmp_path / "pam.d")
    monkeypatch.setattr(sshd.LoginServer, "two_fa_possible", lambda self: False)
    server = sshd.LoginServer(tmp_path / "state", 12422, tmp_path, tmp_path)
    server.write("trainee")
    assert sshd.TWO_FA_ALIAS not in server.client_config.read_text()
    conf = (server.dir / "sshd_config").read_text()
    assert "Match" not in conf and "Port 12423" not in conf
    assert "KbdInteractiveAuthentication no" in conf


@pytest.mark.parametrize("slurm", ["24.11", "22.05"])
def test_a_login_session_has_the_clusters_release_first_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm: str
) -> None:
    """A cluster of another release than the host's: every session of its login node has that
    release's commands first on PATH (a remote user's ``scontrol`` there is 24.11's, not the
    host's 22.05, which its controller refuses); the host's release: sshd's own PATH."""
    from cluster.local.manager import LocalCluster

    monkeypatch.setattr(sshd, "PAM_DIR", tmp_path / "pam.d")
    monkeypatch.setattr(sshd.LoginServer, "two_fa_possible", lambda self: False)
    monkeypatch.setattr(sshd, "installed", lambda: True)
    monkeypatch.setattr(sshd, "login_user", lambda: "trainee")
    monkeypatch.setenv("SLURM_TRAIN_SLURM_ROOTS", str(tmp_path / "roots"))
    lc = LocalCluster(tmp_path / "state", port_offset=0, slurm=slurm)
    server = lc.login_server()
    assert server is not None
    server.write("trainee")
    lines = [x for x in (server.dir / "sshd_config").read_text().splitlines() if "SetEnv" in x]
    conf = f'"SLURM_CONF={lc.conf}"'  # every release: plain sinfo in a session reaches it
    if lc.slurm.bin_dir is None:
        assert lines == [f"SetEnv {conf}"]
    else:
        assert lines == [f'SetEnv "PATH={lc.slurm.bin_dir}:{sshd.SESSION_PATH}" {conf}']


def test_a_changed_server_configuration_makes_a_running_sshd_stale(
    server: sshd.LoginServer, tmp_path: Path
) -> None:
    """`up` starts a running sshd again when its configuration changed (a cluster brought up
    before the 2FA port existed gets it), not when only the secrets are new."""
    from cluster.local import config as cfg
    from cluster.local.files import config_files, is_stale, stamp

    assert server.write("trainee") is True  # the first time: written
    assert server.write("trainee") is False  # fresh secrets, the same server configuration
    layout = cfg.Layout(tmp_path / "state")
    assert config_files(layout, "sshd") == [server.dir / "sshd_config"]
    layout.run.mkdir(parents=True, exist_ok=True)
    stamp(layout, "sshd")
    assert not is_stale(layout, "sshd", set())
    assert server.write("someone") is True  # AllowUsers, User: another server configuration
    assert is_stale(layout, "sshd", set())


def test_down_forgets_the_pam_service(
    server: sshd.LoginServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.write("trainee")
    monkeypatch.setattr(sshd.os, "geteuid", lambda: 0)
    server.forget_pam()
    assert not (sshd.PAM_DIR / server.service).exists()
    server.forget_pam()  # nothing there: nothing to do
