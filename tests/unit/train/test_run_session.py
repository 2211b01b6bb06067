"""RunSession: a run directory belongs to its run; a resume compares configs (issue 14, 2 and 3).

- a second run in a run directory that holds checkpoints is refused (exit 2, one line) unless
  it resumes; nothing the earlier run wrote is replaced or pruned;
- a resume whose config changed in fields that alter training is refused, naming them, unless
  allowed; then the new values take effect (lr schedule, a new optimizer) and the resume event
  says it is no longer exact; fields that do not alter training resume freely.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from train.cli import main
from train.env import DistEnv
from train.errors import ConfigError
from train.loop.optim import lr_factor
from train.loop.trainer import run_training
from train.resume import changed_fields
from train.spec.config import TrainConfig

BASE: dict[str, Any] = {
    "model": "tinycnn",
    "width": 4,
    "data": {"train_size": 320, "test_size": 64},
    "batch_size": 32,
    "epochs": 2,  # 10 steps per epoch, 20 planned
    "num_threads": 1,
    "log_interval": 2,
    "optimizer": {"lr": 0.05, "schedule": "cosine"},
    "checkpoint": {"interval_steps": 4, "keep_last": 2},
}


def _cfg(**changes: Any) -> TrainConfig:
    data = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        *head, last = dotted.split("__")
        node = data
        for key in head:
            node = node.setdefault(key, {})
        node[last] = value
    return TrainConfig.model_validate(data)


@pytest.fixture(autouse=True)
def _restore_torch_globals() -> Iterator[None]:
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.parent.name: p.read_bytes() for p in (run / "checkpoints").glob("step-*/*.json")}


def _events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_second_run_in_a_used_run_dir_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    run_training(_cfg(), DistEnv(), tmp_path, max_steps=8)
    before = _snapshot(tmp_path)
    assert sorted(before) == ["step-4", "step-8"]
    with pytest.raises(ConfigError, match=r"already holds checkpoints .*step-8.*--resume"):
        run_training(_cfg(), DistEnv(), tmp_path, max_steps=4)
    # resuming from a checkpoint of another directory into this one is refused too
    other = tmp_path / "other"
    run_training(_cfg(), DistEnv(), other, max_steps=4)
    with pytest.raises(ConfigError, match="holds checkpoints of another run"):
        run_training(_cfg(), DistEnv(), tmp_path, resume=other / "checkpoints" / "step-4")
    assert _snapshot(tmp_path) == before  # nothing replaced, nothing pruned
    # resuming it (same config) is what works
    result = run_training(_cfg(), DistEnv(), tmp_path, max_steps=12, resume=True)
    assert result.resumed_from == tmp_path / "checkpoints" / "step-8" and result.steps == 12


def test_cli_refusal_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    spec = tmp_path / "spec.yaml"
    train = {**BASE, "max_steps": 4}
    spec.write_text(yaml.safe_dump({"name": "t", "train": train}))
    run = tmp_path / "run"
    assert main(["--config", str(spec), "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["--config", str(spec), "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: run directory") and "step-4" in err[0]
    argv = ["--config", str(spec), "--run-dir", str(run), "--resume"]
    assert main([*argv, "--set", "train.seed=3"]) == 2
    assert "train.seed (0 -> 3)" in capsys.readouterr().err
    # a field that does not alter training resumes freely
    assert main([*argv, "--set", "train.log_interval=1"]) == 0
    # the spec field allows a change too (as --allow-config-change does)
    allow = ["--set", "train.seed=3", "--set", "train.allow_config_change=true"]
    assert main([*argv, *allow, "--set", "train.max_steps=6"]) == 0
    resume = [e for e in _events(run) if e["event"] == "resume"][-1]
    assert resume["exact"] is False and "train.seed (0 -> 3)" in resume["config_changed"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"optimizer__lr": 0.01}, "train.optimizer.lr (0.05 -> 0.01)"),
        ({"optimizer__name": "adamw"}, "train.optimizer.name ('sgd' -> 'adamw')"),
        ({"optimizer__schedule": "constant"}, "train.optimizer.schedule"),
        ({"batch_size": 64}, "train.batch_size (32 -> 64)"),
        ({"seed": 1}, "train.seed (0 -> 1)"),
        ({"epochs": 3}, "train.epochs (2 -> 3)"),
        ({"model": "resnet"}, "train.model ('tinycnn' -> 'resnet')"),
        ({"data__train_size": 640}, "train.data.train_size (320 -> 640)"),
    ],
)
def test_a_change_that_alters_training_is_refused_naming_it(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    run_training(_cfg(), DistEnv(), tmp_path, max_steps=4)
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError, match="--allow-config-change") as info:
        run_training(_cfg(**change), DistEnv(), tmp_path, resume=True)
    assert field in str(info.value)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "change",
    [
        {"log_interval": 1},
        {"checkpoint__interval_steps": 2, "checkpoint__keep_last": 5},
        {"eval_every_epochs": 2},
        {"stop_check_s": 0.0},
    ],
)
def test_fields_that_do_not_alter_training_resume_freely(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    run_training(_cfg(), DistEnv(), tmp_path, max_steps=4)
    result = run_training(_cfg(**change), DistEnv(), tmp_path, max_steps=6, resume=True)
    assert result.exit_code == 0 and result.resumed_from is not None
    resume = [e for e in _events(tmp_path) if e["event"] == "resume"]
    assert len(resume) == 1 and "config_changed" not in resume[0]


def test_an_allowed_lr_change_takes_effect_and_is_recorded(tmp_path: Path) -> None:
    run_training(_cfg(), DistEnv(), tmp_path, max_steps=4)
    new = _cfg(optimizer__lr=0.01)
    result = run_training(
        new, DistEnv(), tmp_path, max_steps=8, resume=True, allow_config_change=True
    )
    assert result.exit_code == 0 and result.steps == 8
    lrs = {
        r["step"]: r["lr"]
        for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    }
    for step in (6, 8):  # the new peak lr on the new config's schedule, not the old one's
        assert lrs[step] == pytest.approx(0.01 * lr_factor(new.optimizer, step, 20))
    resume = [e for e in _events(tmp_path) if e["event"] == "resume"][-1]
    assert resume["exact"] is False
    assert resume["config_changed"] == ["train.optimizer.lr (0.05 -> 0.01)"]
    # the checkpoints written after the change carry the new config: a plain resume works
    again = run_training(new, DistEnv(), tmp_path, max_steps=10, resume=True)
    assert again.steps == 10


def test_an_allowed_switch_to_adamw_rebuilds_the_optimizer(tmp_path: Path) -> None:
    run_training(_cfg(), DistEnv(), tmp_path, max_steps=4)
    new = _cfg(optimizer__name="adamw", optimizer__lr=0.001)
    result = run_training(
        new, DistEnv(), tmp_path, max_steps=8, resume=True, allow_config_change=True
    )
    assert result.exit_code == 0 and result.steps == 8 and result.checkpoint is not None
    shared = torch.load(result.checkpoint / "shared.pt", weights_only=True)
    state = shared["optimizer"]["state"]
    assert state and all("exp_avg" in s for s in state.values())  # AdamW's moments, not SGD's
    assert "betas" in shared["optimizer"]["param_groups"][0]


def test_an_allowed_model_change_that_cannot_load_is_one_line(tmp_path: Path) -> None:
    run_training(_cfg(), DistEnv(), tmp_path, max_steps=4)
    with pytest.raises(ConfigError, match=r"do not fit train\.model"):
        run_training(_cfg(width=8), DistEnv(), tmp_path, resume=True, allow_config_change=True)


def test_changed_fields_ignores_free_fields() -> None:
    old = _cfg().model_dump(mode="json")
    new = _cfg(log_interval=7, run_dir="/x", optimizer__momentum=0.5).model_dump(mode="json")
    assert changed_fields(old, new) == ["train.optimizer.momentum (0.9 -> 0.5)"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
