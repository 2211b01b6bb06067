"""TrainLaunch: picklable, torch-free, takes the signals back from submitit, passes train's code."""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.launch import TrainLaunch

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def _fake_train(monkeypatch: pytest.MonkeyPatch, code: int) -> list[object]:
    calls: list[object] = []

    def main(argv: list[str]) -> int:
        calls.append(list(argv))
        calls.append(
            {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
        )
        return code

    module = types.ModuleType("train.cli")
    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "train.cli", module)
    return calls


def test_pickles_by_reference_and_round_trips() -> None:
    launch = TrainLaunch("/r/resolved.yaml", "/r", "USR1")
    data = pickle.dumps(launch)
    assert b"jobs.launch" in data
    assert pickle.loads(data) == launch


def test_calls_train_main_with_config_and_run_dir(
    monkeypatch: pytest.MonkeyPatch, restore_signals: None
) -> None:
    calls = _fake_train(monkeypatch, 0)
    # What submitit installs before calling us: a requeueing USR2 handler.
    signal.signal(signal.SIGUSR2, lambda *_: None)
    assert TrainLaunch("/r/resolved.yaml", "/r", "USR1")() == 0
    assert calls[0] == ["--config", "/r/resolved.yaml", "--run-dir", "/r"]
    handlers = calls[1]
    assert isinstance(handlers, dict)
    from train.stop.signals import early_handler

    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        # submitit's handlers are gone before train starts: train's early-signal store has them
        assert handlers[sig] is early_handler


def test_nonzero_train_exit_becomes_the_task_exit_code(
    monkeypatch: pytest.MonkeyPatch, restore_signals: None
) -> None:
    _fake_train(monkeypatch, 75)
    with pytest.raises(SystemExit) as info:
        TrainLaunch("/r/c.yaml", "/r")()
    assert info.value.code == 75


def test_signal_before_train_starts_is_delivered_to_its_guard(
    monkeypatch: pytest.MonkeyPatch, restore_signals: None
) -> None:
    from train.stop.signals import PreemptionGuard

    got: list[str | None] = []

    def main(argv: list[str]) -> int:
        signal.raise_signal(signal.SIGUSR2)  # preempted while torch is still importing
        guard = PreemptionGuard(("USR2", "TERM")).install()  # train's guard, installed later
        got.append(guard.signal_name if guard.requested else None)
        guard.uninstall()
        return 0

    module = types.ModuleType("train.cli")
    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "train.cli", module)
    assert TrainLaunch("/r/c.yaml", "/r")() == 0
    assert got == ["SIGUSR2"]  # the same early-signal store: the guard takes it over


def test_importing_launch_does_not_import_torch_or_train() -> None:
    code = (
        "import sys, jobs.launch; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'train')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("job_id", "array"), [("77", {}), ("76_3", {"76": "3"})])
def test_submitits_own_runtime_runs_our_envelope(
    job_id: str, array: dict[str, str], tmp_path: Path
) -> None:
    # What happens in the allocation: `srun python -m submitit.core._submit FOLDER` finds the
    # task's pickle by job id (an array task's by ARRAYID_INDEX), loads the DelayedSubmission
    # jobs submit wrote (submitit's own) and calls it, then writes submitit's result pickle.
    from submitit.helpers import DelayedSubmission

    from jobs.render import submitted_pickle

    folder = tmp_path / "slurm"
    folder.mkdir()
    target = tmp_path / "ran"
    delayed = DelayedSubmission(Path.write_text, target, "called")
    delayed.set_timeout(5, 0)
    delayed.dump(submitted_pickle(folder, job_id))
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "80" if array else job_id,
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
    }
    for array_job, index in array.items():
        env.update(SLURM_ARRAY_JOB_ID=array_job, SLURM_ARRAY_TASK_ID=index)
    proc = subprocess.run(
        [sys.executable, "-m", "submitit.core._submit", str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert target.read_text() == "called"
    with (folder / f"{job_id}_0_result.pkl").open("rb") as f:
        assert pickle.load(f) == ("success", len("called"))


def test_each_submitit_line_once_in_the_rank_log() -> None:
    # Issue 45: the rank log (stdout and stderr joined by the script) had every submitit line
    # twice: its own stdout + stderr handlers for a warning, its handler + train's root one
    # (train.logsetup) for the rest. TrainLaunch calls quiet_submitit_logging first.
    code = (
        "import logging, sys\n"
        "from submitit.core import logger\n"  # submitit's own configuration, as in _submit
        "logging.getLogger().addHandler(logging.StreamHandler(sys.stderr))\n"  # train's root
        "logging.getLogger().setLevel(logging.INFO)\n"
        "from jobs.launch import quiet_submitit_logging\n"
        "quiet_submitit_logging()\n"
        "logger.get_logger().info('AN-INFO-LINE')\n"
        "logger.get_logger().warning('A-WARNING-LINE')\n"
        "logging.getLogger('train').info('A-TRAIN-LINE')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for line in ("AN-INFO-LINE", "A-WARNING-LINE", "A-TRAIN-LINE"):
        assert out.count(line) == 1, out
