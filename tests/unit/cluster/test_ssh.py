"""cluster/ssh.py: the options ssh gets, the quoting of a remote command, ssh's failures as
ours, and the client over a stand-in ``ssh`` (runs the remote line with ``sh -c`` here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ssh_fake import fake_ssh

from cluster.errors import BadInputError, SlurmTimeoutError
from cluster.ssh import (
    SshConnectionError,
    SshLoginRequiredError,
    SshTarget,
    check_host,
    classify,
    parse_ssh_g,
    remote_command,
)


def target(**options: str) -> SshTarget:
    base = {"hostname": "h", "controlmaster": "false", "controlpersist": "no"}
    return SshTarget("h", None, {**base, "connecttimeout": "none", **options})


def test_ssh_g_lines_first_value_wins() -> None:
    assert parse_ssh_g("User a\nuser b\nport 22\n\n") == {"user": "a", "port": "22"}


def test_multiplexing_added_where_the_user_set_none() -> None:
    args = target().option_args()
    assert args[:2] == ["-o", "BatchMode=yes"]
    joined = " ".join(args)
    assert "ControlMaster=auto" in joined and "ControlPersist=4h" in joined
    assert "ControlPath=" in joined and joined.count("ControlPath") == 1
    assert "ConnectTimeout=15" in joined


def test_the_users_own_multiplexing_and_timeout_are_left_alone() -> None:
    own = target(
        controlpath="/x/%C", controlmaster="auto", controlpersist="10m", connecttimeout="3"
    )
    args = own.option_args()
    assert args == ["-o", "BatchMode=yes"]
    assert own.multiplexed


def test_no_multiplexing_under_proxyjump() -> None:
    jump = target(proxyjump="bastion")
    joined = " ".join(jump.option_args())
    assert "ControlMaster=no" in joined and "ControlPath=none" in joined
    assert "ControlPersist" not in joined and not jump.multiplexed


def test_login_is_the_one_connection_without_batchmode() -> None:
    args = target().option_args(batch=False)
    assert "BatchMode=yes" not in args and "ControlMaster=auto" in args


def test_config_file_is_passed_with_dash_f() -> None:
    t = SshTarget("h", "/my/config", {"connecttimeout": "5", "controlpath": "/c"})
    assert t.option_args()[:2] == ["-F", "/my/config"]


@pytest.mark.parametrize("host", ["-oProxyCommand=touch /tmp/x", "", "a b", "a\nb"])
def test_a_host_that_ssh_would_read_as_an_option_is_refused(host: str) -> None:
    with pytest.raises(BadInputError, match="not a host name"):
        check_host(host)


def test_remote_command_quotes_every_word(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    words = ["a b", f"$(touch {planted})", f"`touch {planted}`", "'q'", ";", "x&&y", "$HOME"]
    line = remote_command(["printf", "%s\\n", *words], cwd=str(tmp_path), env={"K": "v w"})
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == words
    assert not planted.exists()


def test_ssh_failures_become_ours() -> None:
    need = classify("h", 255, "trainee@h: Permission denied (publickey,keyboard-interactive).")
    assert isinstance(need, SshLoginRequiredError)
    assert "run `python -m jobs login h`" in str(need) and "\n" not in str(need)
    assert isinstance(classify("h", 255, "Host key verification failed."), SshLoginRequiredError)
    lost = classify("h", 255, "ssh: connect to host h port 22: Connection refused")
    assert isinstance(lost, SshConnectionError)
    assert classify("h", 1, "Permission denied") is None  # the remote command's own status


def test_client_runs_slurm_commands_quoted_in_batchmode(tmp_path: Path) -> None:
    from cluster import slurm_client

    env = fake_ssh(tmp_path)
    client = slurm_client(environ=env, remote="login1", conf="/remote/slurm.conf")
    done = client.run(["printf", "%s|", "a b", "$SLURM_CONF"])
    assert done.stdout == "a b|$SLURM_CONF|"
    assert client.run(["sh", "-c", 'echo "$SLURM_CONF"']).stdout == "/remote/slurm.conf\n"
    logged = (tmp_path / "ssh.log").read_text()
    assert "BatchMode=yes" in logged and "ControlMaster=auto" in logged and "login1" in logged


def test_client_command_that_hangs_is_ended_by_its_timeout(tmp_path: Path) -> None:
    from cluster import slurm_client

    env = fake_ssh(tmp_path, FAKE_SSH_SLEEP="30")
    client = slurm_client(environ=env, remote="login1", timeout=0.5)
    with pytest.raises(SlurmTimeoutError):
        client.run(["true"])


def test_client_prompt_needed_is_one_error(tmp_path: Path) -> None:
    from cluster import slurm_client

    env = fake_ssh(tmp_path, FAKE_SSH_FAIL="u@login1: Permission denied (publickey).")
    with pytest.raises(SshLoginRequiredError, match="jobs login login1"):
        slurm_client(environ=env, remote="login1").job_states(["12"])
