"""The worst inputs, through real processes: exit 2, one line on stderr, no traceback, nothing
written, quickly, and in bounded memory (RLIMIT_AS) whatever the file holds."""

from __future__ import annotations

import contextlib
import io
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jobs.cli import main

REPO = Path(__file__).resolve().parents[3]
MEMORY_LIMIT = 1 << 30  # far below the 2 GiB the alias bomb once took; a bare interpreter fits

BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def _bomb(d: Path) -> Path:
    (d / "bomb.yaml").write_text(BOMB)
    return d / "bomb.yaml"


def _deep(d: Path) -> Path:
    (d / "deep.yaml").write_text("name: demo\ntrain: " + "[" * 100_000 + "]" * 100_000 + "\n")
    return d / "deep.yaml"


def _recursive(d: Path) -> Path:
    (d / "rec.yaml").write_text("name: demo\ntrain: &a\n  data: *a\n")
    return d / "rec.yaml"


def _big(d: Path) -> Path:
    (d / "big.yaml").write_text("name: demo\ntrain: {}\n" + "# padding\n" * 200_000)
    return d / "big.yaml"


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "fifo.yaml")  # no writer: a blocking open would hang forever
    return d / "fifo.yaml"


def _socket(d: Path) -> Path:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock.yaml"))
    sock.close()
    return d / "sock.yaml"


def _directory(d: Path) -> Path:
    (d / "dir.yaml").mkdir()
    return d / "dir.yaml"


def _dev_zero(_: Path) -> Path:
    return Path("/dev/zero")


def _nul(d: Path) -> Path:
    (d / "nul.yaml").write_bytes(b"name: demo\ntrain: {}\nx: a\x00b\n")
    return d / "nul.yaml"


def _latin1(d: Path) -> Path:
    (d / "latin1.yaml").write_bytes(b"name: demo\ntrain:\n  model: r\xe9snet\n")
    return d / "latin1.yaml"


WORST: dict[str, tuple[Callable[[Path], Path], str]] = {
    "alias_bomb": (_bomb, "more than 20000 values once aliases are expanded"),
    # 100,000 levels: the words are PyYAML's (6.0.4 stops at its own flow depth limit, at
    # 2:1007, before our "nested deeper than 32 levels (flatten it)" counts); the line is ours.
    "deep_nesting": (_deep, "deep.yaml:2:"),
    "recursive_alias": (_recursive, "refers to itself"),
    "big_file": (_big, "the spec is larger than 1 MiB"),
    "fifo": (_fifo, "a FIFO, not a regular file"),
    "socket": (_socket, "a socket, not a regular file"),
    "directory": (_directory, "a directory, not a regular file"),
    "dev_zero": (_dev_zero, "a character device, not a regular file"),
    "nul_byte": (_nul, ":3:5: a NUL byte is not allowed in YAML"),
    "not_utf8": (_latin1, ":3:11: not UTF-8: byte 0xe9"),
}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(
        SLURM_TRAIN_STATE_DIR=str(tmp_path / "state"),
        SLURM_TRAIN_RUNS_DIR=str(tmp_path / "runs"),
        PYTHONPATH=str(REPO),
    )
    return subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,  # only setrlimit, between fork and exec
        check=False,
    )


@pytest.mark.parametrize("case", sorted(WORST))
def test_jobs_refuses_in_one_line_in_bounded_memory(tmp_path: Path, case: str) -> None:
    make, expected = WORST[case]
    spec = make(tmp_path)
    proc = _run(["-m", "jobs", "submit", str(spec), "--dry-run"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert lines[0].startswith(str(spec))
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "runs").exists() and not (tmp_path / "state").exists()


@pytest.mark.parametrize("case", ["alias_bomb", "deep_nesting", "fifo", "not_utf8"])
def test_train_refuses_the_same_way(tmp_path: Path, case: str) -> None:
    make, expected = WORST[case]
    spec = make(tmp_path)
    proc = _run(["-m", "train", "--config", str(spec), "--run-dir", "run"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_set_values_refused_in_a_process(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text("name: demo\ntrain: {}\n")
    args = ["-m", "jobs", "submit", "ok.yaml", "--dry-run", "--set", "train.max_steps=010"]
    proc = _run(args, tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "--set train.max_steps=010: train.max_steps: ambiguous number 010 (YAML 1.1 reads a "
        "leading 0 as octal): write 10, or quote it: '010'\n"
    )


@pytest.mark.parametrize("case", ["alias_bomb", "deep_nesting", "big_file", "dev_zero"])
def test_refusing_is_fast(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process (no interpreter start): the refusal itself takes milliseconds, not seconds."""
    monkeypatch.setenv("SLURM_TRAIN_STATE_DIR", str(tmp_path / "state"))
    spec = WORST[case][0](tmp_path)
    main(["submit", str(spec), "--dry-run"], out=io.StringIO())  # warm imports
    start = time.perf_counter()
    code = main(["submit", str(spec), "--dry-run"], out=io.StringIO())
    assert code == 2
    assert time.perf_counter() - start < 1.0


def test_many_problems_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten thousand bad list items give 20 lines and a count, not ten thousand lines."""
    monkeypatch.setenv("SLURM_TRAIN_STATE_DIR", str(tmp_path / "state"))
    spec = tmp_path / "many.yaml"
    spec.write_text(
        "name: demo\ntrain: {}\nlaunch: {srun_args: [" + ",".join(["1"] * 10_000) + "]}\n"
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["submit", str(spec), "--dry-run"], out=io.StringIO()) == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 21
    assert lines[0] == f"{spec}:3:22: launch.srun_args[0]: Input should be a valid string (got 1)"
    assert lines[-1] == f"{spec}: ... and 9980 more problems like these"
