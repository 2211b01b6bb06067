"""Issue 47, for real: from "the laptop" (root's shell, no SLURM_CONF, a state folder of its
own) to the local cluster's login node (``python -m cluster up``'s sshd on loopback, the user
``trainee``) through the system's ssh: a prompt answered once by ``jobs login`` and shared
after it, BatchMode's refusal in one line, ProxyJump, then the README's example: submit,
preempt, resume, complete (followed across a dropped connection), list, status, plot.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
USER = "trainee"
LOGIN, JUMP, LOCKED = "slurm-train-login", "slurm-train-jump", "slurm-train-locked"
TWO_FA = "slurm-train-login-2fa"
PASSPHRASE = "correct horse"
REMOTE_PY = "/usr/bin/python3"


def _skip() -> str | None:
    from cluster.local import sshd

    if not sshd.installed():
        return "openssh-server is not installed (scripts/setup.sh installs it)"
    if sshd.login_user() is None:
        return f"no user {USER} (scripts/setup.sh makes it)"
    site = _site_packages()
    probe = subprocess.run(
        ["runuser", "-u", USER, "--", "env", f"PYTHONPATH={REPO}:{site}", REMOTE_PY, "-c",
         "import jobs.cli, torch"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        return f"{USER} cannot import this checkout with {REMOTE_PY} (a checkout under /root?)"
    return None


def _site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def _jobs(
    args: list[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _master_pid(env: dict[str, str], host: str) -> int | None:
    from cluster.ssh import resolve

    target = resolve(host, env)
    done = subprocess.run(
        ["ssh", *target.option_args(), "-O", "check", "--", host],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    found = re.search(r"pid=(\d+)", done.stderr)
    return int(found.group(1)) if found else None


@pytest.fixture(scope="module")
def laptop(
    slurm_env: dict[str, str], slurm_cluster: object, tmp_path_factory: pytest.TempPathFactory
):
    why = _skip()
    if why is not None:
        pytest.skip(why)
    up = subprocess.run(
        [sys.executable, "-m", "cluster", "up"], env=slurm_env, cwd=REPO,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    found = re.search(r"^export SLURM_TRAIN_SSH_CONFIG=(\S+)$", up.stdout, re.M)
    assert found is not None, up.stdout
    config = Path(found.group(1))
    tmp = tmp_path_factory.mktemp("laptop")
    # A key with a passphrase: BatchMode cannot use it; `jobs login` asks for it once.
    locked = tmp / "locked_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(locked)],
        check=True, timeout=60,
    )  # fmt: skip
    authorized = config.parent / "authorized_keys"
    authorized.write_text(authorized.read_text() + (tmp / "locked_key.pub").read_text())
    text = config.read_text()
    login_block = text.split(f"Host {LOGIN}\n", 1)[1].split("Host ", 1)[0]
    own = login_block.replace(str(config.parent / "id_ed25519"), str(locked))
    (tmp / "ssh_config").write_text(f"{text}Host {LOCKED}\n{own}")
    askpass = tmp / "askpass"
    askpass.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
    askpass.chmod(0o755)
    # the cluster user's folders (its runs, its run index)
    remote = Path(f"{slurm_cluster.layout.root}-remote")  # type: ignore[attr-defined]
    shutil.rmtree(remote, ignore_errors=True)
    remote.mkdir(mode=0o755)
    shutil.chown(remote, USER, USER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(
        SLURM_TRAIN_SSH_CONFIG=str(tmp / "ssh_config"),
        SLURM_TRAIN_STATE_DIR=str(tmp / "state"),
        SSH_ASKPASS=str(askpass),
        SSH_ASKPASS_REQUIRE="force",
        DISPLAY=":0",
    )
    for host in (LOGIN, LOCKED, TWO_FA):  # no shared connection of an earlier session (the
        _end_master(env, host)  # first two share one: same host, port and user, one %C)
    data = {
        "conf": slurm_env["SLURM_CONF"],
        "remote": remote,
        "tmp": tmp,
        "config": config,
        "env": env,
        "cluster": slurm_cluster,
    }
    yield data
    for host in (LOGIN, LOCKED, TWO_FA):
        _end_master(env, host)


def _end_master(env: dict[str, str], host: str) -> None:
    from cluster.ssh import resolve

    argv = ["ssh", *resolve(host, env).option_args(), "-O", "exit", "--", host]
    subprocess.run(argv, capture_output=True, timeout=10, check=False)


def _setup(data: dict, code: str = f"$HOME/slurm-train/code/{REPO.name}") -> list[str]:
    """The cluster user's environment (environment.setup): this cluster, its folders, this
    checkout (``code``: where it is there; by default, where rsync sends it)."""
    remote = data["remote"]
    return [
        f"export SLURM_CONF={data['conf']}",
        f"export PYTHONPATH={code}:{code}/tests/hooks:{_site_packages()}",
        f"export SLURM_TRAIN_STATE_DIR={remote}/state SLURM_TRAIN_RUNS_DIR={remote}/runs",
        "export TRAIN_TEST_STEP_S=0.4",
    ]


def _spec(data: dict, steps: int) -> Path:
    text = (REPO / "examples" / "cifar.yaml").read_text()
    setup = "\n".join(f"    - {line!r}".replace("'", '"') for line in _setup(data))
    text = text.replace("environment:\n", f"environment:\n  setup:\n{setup}\n", 1)
    spec = data["tmp"] / "remote.yaml"
    spec.write_text(text)
    return spec


def test_a_prompt_is_refused_in_one_line_then_login_answers_it_once(laptop: dict) -> None:
    env = laptop["env"]
    refused = _jobs(["status", "--remote", LOCKED], env, timeout=60)
    assert refused.returncode == 1, refused
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and f"python -m jobs login {LOCKED}" in lines[0], refused.stderr
    login = _jobs(["login", LOCKED], env, timeout=60)
    assert login.returncode == 0, login.stderr
    assert _master_pid(env, LOCKED) is not None
    # BatchMode again: through the shared master; the remote Python has no slurm-train in a
    # plain environment: one line that says how to install it
    shared = _jobs(["status", "--remote", LOCKED, "--remote-python", REMOTE_PY], env, timeout=60)
    assert shared.returncode == 1, shared
    assert f"slurm-train is not installed for {REMOTE_PY}" in shared.stderr, shared.stderr
    missing = _jobs(["status", "--remote", LOCKED, "--remote-python", "/nope/python"], env)
    assert missing.returncode == 1 and "no Python '/nope/python'" in missing.stderr


def _port(config: Path) -> int:
    """The key port of the login node, as the client configuration names it."""
    block = config.read_text().split(f"Host {LOGIN}\n", 1)[1]
    found = re.search(r"^\s*Port (\d+)$", block, re.M)
    assert found is not None, block
    return int(found.group(1))


def _totp(key_hex: str, at: float) -> str:
    """RFC 6238's code (SHA-1, 30 s, 6 digits), as an authenticator app computes it."""
    import hashlib
    import hmac
    import struct

    mac = hmac.new(bytes.fromhex(key_hex), struct.pack(">Q", int(at) // 30), hashlib.sha1)
    digest = mac.digest()
    start = digest[-1] & 15
    return f"{(struct.unpack('>I', digest[start : start + 4])[0] & 0x7FFFFFFF) % 10**6:06d}"


def _login_on_a_terminal(
    env: dict[str, str], host: str, answers: dict[bytes, str]
) -> tuple[int, str]:
    """``jobs login HOST`` on a real terminal (a pty, its controlling one): each prompt that
    appears is answered as a user types it (``answers``: a word of the prompt -> the reply; the
    first that matches). Returns (exit status, what the terminal showed)."""
    import pty
    import select

    env = {
        k: v for k, v in env.items() if k not in ("SSH_ASKPASS", "SSH_ASKPASS_REQUIRE", "DISPLAY")
    }
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own, the pty its terminal (ssh reads /dev/tty)
        try:
            os.chdir(REPO)
            os.execve(sys.executable, [sys.executable, "-m", "jobs", "login", host], env)
        finally:
            os._exit(127)
    shown, answered, status = b"", 0, None
    deadline = time.monotonic() + 90
    try:
        while status is None and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # the terminal's other side is closed
                    chunk = b""
                shown += chunk
                prompt = shown[answered:].rstrip()
                if prompt.endswith(b":"):  # a prompt waits for its answer
                    answered = len(shown)
                    reply = next((a for w, a in answers.items() if w in prompt), None)
                    assert reply is not None, f"an unexpected prompt: {prompt!r}"
                    os.write(fd, reply.encode() + b"\n")
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(code)
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert status is not None, f"jobs login did not end: {shown!r}"
    return status, shown.decode(errors="replace")


def test_login_answers_a_password_and_a_one_time_code_through_pam(
    laptop: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 2FA alias (keyboard-interactive through PAM: a password, then a TOTP code where
    libpam-oath is installed): refused in one line in BatchMode, `jobs login` on a terminal
    answers the prompts once, later commands share that connection without a prompt, and
    once the shared connection is gone the one line again."""
    from cluster.local import sshd
    from jobs import remote

    env, config = laptop["env"], laptop["config"]
    if os.geteuid() != 0 or not sshd.pam_module("pam_exec.so"):
        pytest.skip("no 2FA alias: cluster up writes its PAM service as root, with pam_exec")
    assert TWO_FA in config.read_text(), config.read_text()
    assert (sshd.PAM_DIR / f"slurm-train-sshd-{_port(config)}").is_file()
    folder = config.parent
    password = (folder / sshd.PASSWORD_FILE).read_text().strip()
    key_file = folder / sshd.OATH_KEY_FILE
    key = key_file.read_text().strip() if key_file.exists() else None
    # how the cluster user's commands run there (as a run submitted from here records it)
    monkeypatch.setenv("SLURM_TRAIN_STATE_DIR", env["SLURM_TRAIN_STATE_DIR"])
    there = remote.Remote(TWO_FA, "", REMOTE_PY, tuple(_setup(laptop, code=str(REPO))))
    remote.record(remote.RemoteRun(there, f"{laptop['remote']}/runs/none", "none"))

    def refused_in_one_line(args: list[str]) -> None:
        started = time.monotonic()
        done = _jobs([*args, "--remote", TWO_FA], env, timeout=60)
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"python -m jobs login {TWO_FA}" in lines[0], done.stderr
        assert time.monotonic() - started < 60  # BatchMode: no prompt waited on

    refused_in_one_line(["status"])
    answers = {b"OATH": "", b"assword": password} if key else {b"assword": password}
    if key is not None:  # the code of the moment it is asked for
        answers[b"OATH"] = _totp(key, time.time())
        if time.time() % 30 > 25:  # too near the end of its 30 s: the next one
            time.sleep(30 - time.time() % 30 + 1)
            answers[b"OATH"] = _totp(key, time.time())
    code, shown = _login_on_a_terminal(env, TWO_FA, answers)
    assert code == 0, shown
    assert (b"OATH" in answers) == ("One-time password" in shown)
    assert _master_pid(env, TWO_FA) is not None
    for args in (["status"], ["list"]):  # BatchMode, through the shared connection
        done = _jobs([*args, "--remote", TWO_FA], env, timeout=120)
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    _end_master(env, TWO_FA)
    assert _master_pid(env, TWO_FA) is None
    refused_in_one_line(["list"])


def test_proxyjump_reaches_the_cluster_without_multiplexing(laptop: dict) -> None:
    from cluster import slurm_client
    from cluster.ssh import resolve

    env = laptop["env"]
    assert not resolve(JUMP, env).multiplexed
    client = slurm_client(environ=env, remote=JUMP, conf=laptop["conf"])
    assert {n.name for n in client.nodes()} == {"n1", "n2", "n3"}
    assert client.cluster_name()


def readme_commands() -> list[list[str]]:
    """The commands of the README's "From your laptop" block, in order."""
    section = (REPO / "README.md").read_text().split("## From your laptop", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "README: no ```bash block under ## From your laptop"
    return [w for w in (shlex.split(ln, comments=True) for ln in block.group(1).splitlines()) if w]


def _as_here(cmd: list[str], spec: Path) -> list[str]:
    """A README command as this test runs it: the cluster's alias for ``mycluster``, the test's
    spec (the example plus the environment of the cluster user) and remote Python."""
    assert cmd[:3] == ["python", "-m", "jobs"], cmd
    swap = {"mycluster": LOGIN, "examples/cifar.yaml": str(spec), ".venv/bin/python": REMOTE_PY}
    return [swap.get(word, word) for word in cmd[3:]]


def test_readme_example_from_the_laptop(laptop: dict) -> None:
    """README: From your laptop, command by command, from root's shell to the cluster user:
    login, submit, list, a preemption, the log followed to the end across a dropped
    connection, status (COMPLETED after a resume), plot."""
    env, tmp = laptop["env"], laptop["tmp"]
    spec = _spec(laptop, steps=60)
    commands = [_as_here(c, spec) for c in readme_commands()]
    assert [c[0] for c in commands] == [
        "login", "submit", "list", "drill", "logs", "status", "plot",
    ]  # fmt: skip
    name = commands[3][1]
    seen: dict[str, subprocess.CompletedProcess[str]] = {}
    for args in commands:
        if args[0] == "submit":
            args = [*args, "--set", "train.max_steps=60"]
        if args[0] in ("drill", "logs"):  # each across a dropped connection
            seen[args[0]] = _across_a_drop(laptop, args)
            continue
        if args[0] == "plot":
            args = [a if a != "life.png" else str(tmp / "life.png") for a in args]
        seen[args[0]] = done = _jobs(args, env, timeout=450)
        assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-2000:]}"

    job = seen["submit"].stdout.strip()
    assert job.isdigit() and f"on {LOGIN}" in seen["submit"].stderr, seen["submit"].stderr
    # the drill waited here (its loop local, each remote command short) and saw the resume
    assert "back: resumed" in seen["drill"].stdout, seen["drill"].stdout
    drill = seen["drill"].stderr  # the drill went on across the drop: one line each way
    assert drill.count("trying again with back-off") == 1, drill
    assert drill.count("connected again") == 1, drill
    listed = seen["list"].stdout
    assert name in listed and LOGIN in listed and job in listed, listed
    follow = seen["logs"]
    assert "trying again" in follow.stderr and "connected again" in follow.stderr, follow.stderr
    assert "done: 60 steps" in follow.stdout, follow.stdout[-2000:]
    status = _jobs(["status", name, "--json"], env, timeout=120)
    task = json.loads(status.stdout)["tasks"][0]
    assert task["state"] == "COMPLETED", task
    assert "preempted" in task["history"] and task["attempts"] >= 2, task
    assert "COMPLETED" in seen["status"].stdout, seen["status"].stdout
    assert (tmp / "life.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _across_a_drop(laptop: dict, args: list[str]) -> subprocess.CompletedProcess[str]:
    """``jobs logs RUN -f`` or ``jobs drill RUN`` while the connection drops: the shared master
    killed and the server down for a while (each tries again; the run goes on)."""
    env = laptop["env"]
    follow = subprocess.Popen(
        [sys.executable, "-m", "jobs", *args], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(5)
        login = laptop["cluster"].login_server()
        master = _master_pid(env, LOGIN)
        assert master is not None
        os.kill(int(login.pid_file.read_text()), signal.SIGTERM)
        os.kill(master, signal.SIGKILL)
        time.sleep(8)
        login.start()
        out, err = follow.communicate(timeout=400)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err[-2000:]
    return subprocess.CompletedProcess(args, 0, out, err)
