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

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
USER = "trainee"
LOGIN, JUMP, LOCKED = "slurm-train-login", "slurm-train-jump", "slurm-train-locked"
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
    for host in (LOGIN, LOCKED):  # no shared connection of an earlier session (the two
        _end_master(env, host)  # aliases share one: same host, port and user, one %C)
    data = {
        "conf": slurm_env["SLURM_CONF"],
        "remote": remote,
        "tmp": tmp,
        "config": config,
        "env": env,
        "cluster": slurm_cluster,
    }
    yield data
    for host in (LOGIN, LOCKED):
        _end_master(env, host)


def _end_master(env: dict[str, str], host: str) -> None:
    from cluster.ssh import resolve

    argv = ["ssh", *resolve(host, env).option_args(), "-O", "exit", "--", host]
    subprocess.run(argv, capture_output=True, timeout=10, check=False)


def _spec(data: dict, steps: int) -> Path:
    code = f"$HOME/slurm-train/code/{REPO.name}"
    remote = data["remote"]
    text = (REPO / "examples" / "cifar.yaml").read_text()
    setup = "\n".join(
        f"    - {line!r}".replace("'", '"')
        for line in [
            f"export SLURM_CONF={data['conf']}",
            f"export PYTHONPATH={code}:{code}/tests/hooks:{_site_packages()}",
            f"export SLURM_TRAIN_STATE_DIR={remote}/state SLURM_TRAIN_RUNS_DIR={remote}/runs",
            "export TRAIN_TEST_STEP_S=0.4",
        ]
    )
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
        if args[0] == "logs":
            seen["logs"] = _follow_across_a_drop(laptop, args)
            continue
        if args[0] == "plot":
            args = [a if a != "life.png" else str(tmp / "life.png") for a in args]
        seen[args[0]] = done = _jobs(args, env, timeout=450)
        assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-2000:]}"

    job = seen["submit"].stdout.strip()
    assert job.isdigit() and f"on {LOGIN}" in seen["submit"].stderr, seen["submit"].stderr
    # the drill waited here (its loop local, each remote command short) and saw the resume
    assert "back: resumed" in seen["drill"].stdout, seen["drill"].stdout
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


def _follow_across_a_drop(laptop: dict, args: list[str]) -> subprocess.CompletedProcess[str]:
    """``jobs logs RUN -f`` while the connection drops: the shared master killed and the
    server down for a while (the follow tries again; the run goes on)."""
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
