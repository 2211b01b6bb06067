"""jobs/remote.py through ``python -m jobs ... --remote`` with a stand-in ``ssh`` that runs the
remote line here (tests/unit/cluster/test_ssh.py): what is missing there in one line, the local
record of remote runs, ``list`` beside local runs, a --follow that outlives a dropped
connection."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster.ssh import SshConnectionError
from jobs import remote
from jobs.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from _ssh_fake import fake_ssh


@pytest.fixture
def ssh_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = fake_ssh(tmp_path)
    for key in ("PATH", "FAKE_SSH_LOG"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("SLURM_TRAIN_SSH_CONFIG", raising=False)
    monkeypatch.setenv("SLURM_TRAIN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    remote._TARGETS.clear()
    return env


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    code = main(argv, out=out)
    return code, out.getvalue(), capsys.readouterr().err


def test_no_python_there_is_one_line(ssh_env: dict[str, str], capsys: Any) -> None:
    code, _, err = run(["status", "--remote", "login1", "--remote-python", "/no/py"], capsys)
    assert code == 1
    assert err.strip() == (
        "login1: no Python '/no/py' there (name one with --remote-python PATH, or make it "
        "with environment.setup)"
    )


def test_no_slurm_train_there_says_how_to_install(
    ssh_env: dict[str, str], capsys: Any, tmp_path: Path
) -> None:
    bare = tmp_path / "bare-python"
    bare.write_text("#!/bin/sh\nexit 1\n")  # a Python that cannot import jobs
    bare.chmod(0o755)
    code, _, err = run(["status", "--remote", "login1", "--remote-python", str(bare)], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert f"slurm-train is not installed for {bare} there: install it there" in err


def test_a_missing_folder_and_a_failing_setup_are_one_line_each(
    ssh_env: dict[str, str], capsys: Any
) -> None:
    gone = remote.Remote("login1", workdir="/no/such/folder", python=sys.executable)
    with pytest.raises(remote.JobsError, match="login1: no folder /no/such/folder there"):
        gone.run(["status"])
    bad = remote.Remote("login1", python=sys.executable, setup=("module load nothing-here",))
    with pytest.raises(remote.JobsError, match=r"login1: environment\.setup failed there"):
        bad.run(["status"])


def test_a_prompt_needed_says_run_jobs_login(
    ssh_env: dict[str, str], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SSH_FAIL", "u@login1: Permission denied (publickey,password).")
    code, _, err = run(["status", "--remote", "login1"], capsys)
    assert code == 1
    assert err.count("\n") == 1 and "run `python -m jobs login login1` once" in err


def test_hostile_host_is_bad_input(ssh_env: dict[str, str], capsys: Any) -> None:
    code, _, err = run(["status", "--remote=-oProxyCommand=id"], capsys)
    assert code == 2 and "not a host name" in err


def test_the_remote_cli_runs_there_with_the_run_quoted(
    ssh_env: dict[str, str], capsys: Any, tmp_path: Path
) -> None:
    """The remote side is this checkout's CLI (here: sh -c); the run name goes over quoted."""
    py = tmp_path / "py"
    py.write_text('#!/bin/sh\nif [ "$1" = -c ]; then exit 0; fi\nprintf "%s|" "$@"\n')
    py.chmod(0o755)
    code, out, _ = run(
        ["cancel", "--remote", "login1", "--remote-python", str(py), "a b;$(id)"], capsys
    )
    assert code == 0 and out == "-m|jobs|cancel|a b;$(id)|"


def _record(tmp_path: Path, **kw: Any) -> remote.RemoteRun:
    r = remote.RemoteRun(
        remote.Remote("login1", "code/x", sys.executable),
        "/home/u/runs/r1",
        "r1",
        "cifar",
        "1234",
        ("1234",),
        1000.0,
        2,
        **kw,
    )
    remote.record(r)
    return r


def test_remote_runs_are_recorded_and_found_by_name_or_job_id(
    ssh_env: dict[str, str], tmp_path: Path, capsys: Any
) -> None:
    _record(tmp_path)
    path = remote.index_path()
    path.write_bytes(path.read_bytes() + b'{"host": 3}\nnot json\n')  # damage after it
    _record(tmp_path)
    found = remote.find_remote("1234")
    assert found is not None and found.remote.host == "login1" and found.run_dir.endswith("r1")
    assert remote.find_remote("cifar") == found
    assert remote.find_remote("nope") is None
    assert "skipped 2 damaged line(s)" in capsys.readouterr().err


def test_list_shows_remote_runs_beside_local_ones(
    ssh_env: dict[str, str], tmp_path: Path, capsys: Any
) -> None:
    _record(tmp_path)
    code, out, _ = run(["list", "--no-state"], capsys)
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("r1 "))
    assert "1234" in line and "login1" in line and "login1:/home/u/runs/r1" in line


def test_follow_outlives_a_dropped_connection(
    ssh_env: dict[str, str], tmp_path: Path, capsys: Any
) -> None:
    run_ = _record(tmp_path)
    answers: list[Any] = [
        remote.Poll({"1234": "RUNNING"}, b"step 1\n"),
        SshConnectionError("login1", "Connection refused"),
        SshConnectionError("login1", "Connection refused"),
        remote.Poll({"1234": "RUNNING"}, b"step 2\n"),
        remote.Poll({"1234": "COMPLETED"}, b"done\n"),
    ]
    offsets: list[int] = []

    def poll(r: remote.RemoteRun, rank: int | None, offset: int, job: str) -> remote.Poll:
        offsets.append(offset)
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    slept: list[float] = []
    out = io.StringIO()
    code = remote.follow(run_, out, rank=0, show_states=False, sleep=slept.append, poll=poll)
    assert code == 0 and out.getvalue() == "step 1\nstep 2\ndone\n"
    assert offsets == [0, 7, 7, 7, 14]  # no byte shown twice, none lost across the drop
    assert [s for s in slept if s in (1.0, 2.0)] == [1.0, 2.0]  # backing off
    err = capsys.readouterr().err
    assert err.count("trying again") == 1 and "the run goes on" in err  # once per outage
    assert err.count("connected again") == 1


def test_follow_confirms_a_final_state_before_it_ends(
    ssh_env: dict[str, str], tmp_path: Path
) -> None:
    """A preemption shows a final-looking state for a moment: seen twice before it ends."""
    run_ = _record(tmp_path)
    answers = [
        remote.Poll({"1234": "PREEMPTED"}, b""),
        remote.Poll({"1234": "PENDING"}, b""),
        remote.Poll({"1234": "FAILED"}, b""),
        remote.Poll({"1234": "FAILED"}, b""),
    ]
    code = remote.follow(run_, io.StringIO(), sleep=lambda s: None, poll=lambda *a: answers.pop(0))
    assert code == 1 and not answers


def test_submit_refused_spec_is_the_same_line_as_here(
    ssh_env: dict[str, str], tmp_path: Path, capsys: Any
) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nresources: {nodes: 0}\n")
    local_code, _, local_err = run(["submit", str(spec), "--dry-run"], capsys)
    code, _, err = run(["submit", str(spec), "--remote", "login1"], capsys)
    assert code == local_code == 2 and err == local_err
    assert not (tmp_path / "ssh.log").exists()  # nothing went over


def test_poll_is_one_ssh_command(ssh_env: dict[str, str], tmp_path: Path) -> None:
    """The state and the log's new bytes (not UTF-8 as they may be): one round trip."""
    run_dir = tmp_path / "run"
    (run_dir / "slurm").mkdir(parents=True)
    (run_dir / "slurm" / "1234_0_log.out").write_bytes(b"0123\xc3\xa9\xff89")
    py = tmp_path / "py"
    py.write_text(
        '#!/bin/sh\nif [ "$1" = -c ]; then exit 0; fi\n'
        'echo \'{"tasks": [{"job_id": "1234", "state": "RUNNING"}]}\'\n'
    )
    py.chmod(0o755)
    r = remote.RemoteRun(
        remote.Remote("login1", "", str(py)), str(run_dir), "r1", "", "1234", ("1234",)
    )
    got = remote.poll_once(r, 0, 4, "1234")
    assert (
        got.states == {"1234": "RUNNING"} and got.log == b"\xc3\xa9\xff89"
    )  # every byte, as written
    assert (tmp_path / "ssh.log").read_text().count("BatchMode=yes") == 1


def test_follow_shows_the_whole_log_before_it_ends(ssh_env: dict[str, str], tmp_path: Path) -> None:
    """A completed run whose log is longer than one piece: the rest comes before the end, and
    a character split between two pieces is shown whole."""
    run_ = _record(tmp_path)
    big = b"x" * (remote.LOG_PIECE - 1) + "\u00e9".encode()  # the piece ends inside the char
    answers = [
        remote.Poll({"1234": "COMPLETED"}, big[: remote.LOG_PIECE]),
        remote.Poll({"1234": "COMPLETED"}, big[remote.LOG_PIECE :] + b"end\n"),
    ]
    out = io.StringIO()
    code = remote.follow(
        run_, out, rank=0, show_states=False, sleep=lambda s: None, poll=lambda *a: answers.pop(0)
    )
    assert code == 0 and not answers
    assert out.getvalue().endswith("x\u00e9end\n")


@pytest.mark.parametrize(
    ("given", "line"),
    [("~", "cd ~ "), ("~/my code", "cd ~/'my code' "), ("/a b/$(id)", "cd '/a b/$(id)' ")],
)
def test_remote_dir_is_quoted_and_keeps_the_remote_home(given: str, line: str) -> None:
    prelude = remote.Remote("h", workdir=given).shell(["status"])
    assert prelude.startswith(line)


def test_the_code_goes_over_as_its_tracked_files(ssh_env: dict[str, str], tmp_path: Path) -> None:
    """rsync (through the stand-in ssh): tracked and untracked-not-ignored files, not ignored
    ones, not a tracked file deleted here; an ignored spec is sent all the same."""
    import subprocess

    repo = tmp_path / "proj"
    (repo / "pkg").mkdir(parents=True)
    for name, text in [
        ("pkg/train.py", "x"),
        ("gone.py", "y"),
        (".gitignore", "*.log\nspec*.yaml\n"),
    ]:
        (repo / name).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    (repo / "gone.py").unlink()
    (repo / "new.py").write_text("n")
    (repo / "out.log").write_text("ignored")
    spec = repo / "spec.yaml"
    spec.write_text("name: x\n")
    workdir, rel = remote.push_code("login1", spec)
    there = tmp_path / workdir
    assert (workdir, rel) == ("slurm-train/code/proj", "spec.yaml")
    sent = sorted(str(p.relative_to(there)) for p in there.rglob("*") if p.is_file())
    assert sent == [".gitignore", "new.py", "pkg/train.py", "spec.yaml"]


def test_the_remote_line_runs_ours_in_a_folder_holding_the_users_train_and_jobs(
    tmp_path: Path,
) -> None:
    """The user's code folder goes over as it is: a `train.py` or a `jobs/` of theirs there
    must not stand in for our packages on the login node (issue 42: -P, the remote side)."""
    import subprocess
    import sys

    from jobs.remote import Remote

    work = tmp_path / "code"
    (work / "jobs").mkdir(parents=True)
    (work / "jobs" / "__init__.py").write_text("print('HOSTILE jobs'); raise SystemExit(7)\n")
    (work / "jobs" / "__main__.py").write_text("print('HOSTILE main'); raise SystemExit(7)\n")
    (work / "train.py").write_text("print('HOSTILE train'); raise SystemExit(7)\n")
    line = Remote("h", workdir=str(work), python=sys.executable).shell(["--help"])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, env=env, timeout=120)
    assert "HOSTILE" not in done.stdout + done.stderr
    assert done.returncode == 0 and "usage:" in done.stdout
