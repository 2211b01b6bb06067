"""python -m train / train.cli.main: one-line errors and exit codes, runs, resume, entrypoints."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from train.cli import main

REPO = Path(__file__).resolve().parents[3]

TINY = {
    "model": "tinycnn",
    "width": 4,
    "data": {"train_size": 256, "test_size": 64},
    "batch_size": 32,
    "max_steps": 6,
    "num_threads": 1,
    "log_interval": 2,
    "checkpoint": {"interval_steps": 4, "keep_last": 2},
}


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The CLI reads os.environ: make sure no Slurm/torchrun variables leak in from outside.
    import os

    for key in list(os.environ):
        if key.startswith("SLURM_") or key in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}:
            monkeypatch.delenv(key)
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


def spec(tmp_path: Path, **sections: object) -> Path:
    p = tmp_path / "spec.yaml"
    doc = {"name": "t", "resources": {"nodes": 1}, "train": TINY, **sections}
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], r"^error: the following arguments are required: --config"),
        # The one spec loader (train.spec.load): the same lines as python -m jobs.
        (["--config", "/nonexistent.yaml"], r"^error: /nonexistent.yaml: cannot read the spec"),
        (["--config", "SPEC", "--set", "train.nope=1"], r"^error: --set train.nope=1: train.nope"),
        (["--config", "SPEC", "--bogus"], r"^error: unrecognized arguments: --bogus"),
        (["--config", "SPEC", "--set", "train.batch_size=1000"], r"larger than the training"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    argv = [str(spec(tmp_path)) if a == "SPEC" else a for a in argv]
    assert main([*argv, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("error:")]) == 1
    assert "Traceback" not in "\n".join(err)
    import re

    assert re.search(message, err[-1]), err[-1]


def test_a_run_dir_that_cannot_be_made_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], unmakeable_run_dir: tuple[Path, Path]
) -> None:
    taken, run_dir = unmakeable_run_dir
    assert main(["--config", str(spec(tmp_path)), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {run_dir}: cannot make the run directory: {err[0].split(': ')[-1]}"]
    assert "Errno" not in err[0] and "Error:" not in err[0]  # the user's words, no class name
    assert taken.read_text() == "keep"


def test_inconsistent_slurm_env_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for k, v in {"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}.items():
        monkeypatch.setenv(k, v)
    assert main(["--config", str(spec(tmp_path)), "--run-dir", str(tmp_path / "r")]) == 2
    assert "srun python -m train" in capsys.readouterr().err


def test_run_then_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    assert main(["--config", str(spec(tmp_path)), "--run-dir", str(run)]) == 0
    # main runs in-process too (jobs.launch): the caller's signal handlers are restored.
    assert {s: signal.getsignal(s) for s in before} == before
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [2, 4, 6]
    assert records[-1]["kind"] == "eval" and 0.0 <= records[-1]["test_accuracy"] <= 1.0
    assert {"loss", "accuracy", "lr", "images_per_s"} <= records[0].keys()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-4", "step-6"]
    assert (run / "logs" / "rank-0.log").read_text().count("[rank 0]") > 3
    # --resume PATH from step 4 with a longer run (a change of the schedule: allowed
    # explicitly); --resume (newest) afterwards finds step 10.
    argv = ["--config", str(spec(tmp_path)), "--run-dir", str(run), "--set", "train.max_steps=10"]
    assert main([*argv, "--resume", str(run / "checkpoints" / "step-4")]) == 2  # not allowed
    assert (
        main([*argv, "--allow-config-change", "--resume", str(run / "checkpoints" / "step-4")]) == 0
    )
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert events == ["start", "complete", "resume", "complete"]
    assert main([*argv, "--resume"]) == 0  # nothing left to do: resumes at 10, evaluates, saves


def test_runtime_failure_exits_1_traceback_only_with_debug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "r" / "checkpoints" / "step-3"
    argv = [
        "--config",
        str(spec(tmp_path)),
        "--run-dir",
        str(tmp_path / "r"),
        "--resume",
        str(missing),
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(missing) in err and "Traceback" not in err
    assert "no such checkpoint" in err  # it names nothing: not "an incomplete save"
    assert main([*argv, "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err
    events = (tmp_path / "r" / "events.jsonl").read_text()
    assert '"event": "failure"' in events


def test_entrypoint_function_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    run = tmp_path / "custom"
    argv = [
        "--config",
        "examples/custom.yaml",
        "--run-dir",
        str(run),
        "--set",
        "train.max_steps=300",
    ]
    assert main(argv) == 0
    acc = float((run / "result.txt").read_text().split()[1])
    assert acc > 0.6  # 3 classes: chance is 1/3
    assert (run / "checkpoints" / "step-300" / "manifest.json").is_file()
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert events == ["start", "complete"]


def test_entrypoint_function_import_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = spec(tmp_path, entrypoint={"function": "no_such_module_xyz:main"})
    assert main(["--config", str(p), "--run-dir", str(tmp_path / "r")]) == 2
    assert "cannot import 'no_such_module_xyz'" in capsys.readouterr().err


def test_entrypoint_function_failure_is_recorded_and_requeued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """User code that raises is a failure like the trainer's: recorded with the real error and,
    in a Slurm job, requeued while requeue.max_failures allows."""
    from functools import partial

    import train.session
    from train.stop import BUDGET_EXHAUSTED_EXIT_CODE, request_requeue

    (tmp_path / "failing_user_train.py").write_text(
        "def main(ctx):\n    raise RuntimeError('user code exploded')\n"
    )
    monkeypatch.chdir(tmp_path)
    requeued: list[str] = []

    class Client:
        def requeue(self, job_id: str) -> None:
            requeued.append(job_id)

    monkeypatch.setattr(train.session, "request_requeue", partial(request_requeue, client=Client()))
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    p = spec(
        tmp_path,
        entrypoint={"function": "failing_user_train:main"},
        requeue={"max_failures": 1},
    )
    run = tmp_path / "r"
    assert main(["--config", str(p), "--run-dir", str(run)]) == 1
    assert requeued == ["777"]
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the requeued run fails again: over budget
    assert main(["--config", str(p), "--run-dir", str(run)]) == BUDGET_EXHAUSTED_EXIT_CODE
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == [
        "start",
        "failure",
        "requeue",
        "start",
        "failure",
        "budget_exhausted",
    ]
    assert events[1]["error"] == "RuntimeError: user code exploded"
    assert requeued == ["777"]


def test_entrypoint_command_gets_torchrun_variables(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    code = (
        "import json, os, sys; keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', "
        "'MASTER_PORT', 'RUN_DIR']; json.dump({k: os.environ.get(k) for k in keys}, "
        f"open({str(out)!r}, 'w')); sys.exit(7)"
    )
    p = spec(tmp_path, entrypoint={"command": [sys.executable, "-c", code]})
    assert main(["--config", str(p), "--run-dir", str(tmp_path / "r")]) == 7
    seen = json.loads(out.read_text())
    assert seen["RANK"] == "0" and seen["WORLD_SIZE"] == "1" and seen["LOCAL_RANK"] == "0"
    assert seen["MASTER_ADDR"] == "127.0.0.1" and seen["RUN_DIR"] == str(tmp_path / "r")


def test_python_dash_m_train(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "train", "--config", str(spec(tmp_path)), "--set", "train.bad=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error: ")
