"""train.spec.config: strict sections, defaults, --set overrides, file:line messages, torch-free."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from train.errors import ConfigError
from train.spec.config import (
    EntrypointConfig,
    RequeueConfig,
    RunConfig,
    TrainConfig,
    load_run_config,
)
from train.spec.confighash import config_hash
from train.spec.load import parse_override

REPO = Path(__file__).resolve().parents[3]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return p


def test_empty_train_section_gives_defaults(tmp_path: Path) -> None:
    cfg = load_run_config(_write(tmp_path, "name: x\nresources: {nodes: 2}\ntrain: {}\n"))
    assert cfg.train == TrainConfig()
    assert cfg.requeue == RequeueConfig()
    assert cfg.entrypoint is None
    assert cfg.train.strategy == "ddp" and cfg.train.checkpoint.interval_steps > 0


def test_other_sections_are_ignored_but_ours_are_strict(tmp_path: Path) -> None:
    p = _write(tmp_path, "whatever: {a: 1}\ntrain:\n  model: tinycnn\n  modle: resnet\n")
    # One loader (train.spec.load) for jobs and train: the message is the jobs one, with the column.
    with pytest.raises(ConfigError, match=r"spec.yaml:4:3: train.modle: unknown field"):
        load_run_config(p)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.optimizer.lr=abc"], r"train.optimizer.lr: Input should be a valid number"),
        (["train.model=vgg"], r"train.model: Input should be 'resnet' or 'tinycnn'"),
        (["train.grad_accum=3"], r"not divisible by grad_accum 3"),
        (["train.data.kind=cifar10"], r"needs data.path"),
        (["requeue.signal=KILL"], r"uncatchable signal 'KILL'"),
        (["train.batch_size"], r"expected KEY.PATH=VALUE"),
        (["train.batch_size=0"], r"greater than or equal to 1"),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_run_config(_write(tmp_path, "train: {}\n"), overrides)


def test_overrides_are_yaml_typed(tmp_path: Path) -> None:
    cfg = load_run_config(
        _write(tmp_path, "train: {}\n"),
        [
            "train.batch_size=64",
            "train.optimizer.lr=0.5",
            "train.deterministic=true",
            "train.checkpoint.async=true",
            "requeue.signal=SIGUSR1",
        ],
    )
    assert cfg.train.batch_size == 64 and cfg.train.optimizer.lr == 0.5
    assert cfg.train.deterministic is True and cfg.train.checkpoint.async_save is True
    assert cfg.requeue.signal == "USR1"
    parsed = parse_override("a.b=[1, 2]")
    assert (parsed.path, parsed.value) == (("a", "b"), [1, 2])


def test_no_file_means_defaults_plus_overrides() -> None:
    cfg = load_run_config(None, ["train.model=tinycnn"])
    assert cfg.train.model == "tinycnn"


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"spec.yaml:\d+:\d+: yaml: "):
        load_run_config(_write(tmp_path, "train:\n  model: [tinycnn\n"))
    with pytest.raises(ConfigError, match="cannot read the spec"):
        load_run_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_run_config(_write(tmp_path, "- a\n- b\n"))


def test_entrypoint_exactly_one() -> None:
    assert EntrypointConfig(function="pkg.mod:fn").function == "pkg.mod:fn"
    assert EntrypointConfig(command=["python", "x.py"]).command == ["python", "x.py"]
    with pytest.raises(ValueError, match="exactly one"):
        EntrypointConfig()
    with pytest.raises(ValueError, match="exactly one"):
        EntrypointConfig(function="a:b", command=["x"])
    with pytest.raises(ValueError, match=r"pkg\.module:function"):
        EntrypointConfig(function="a.b")
    with pytest.raises(ValueError, match="newlines"):
        EntrypointConfig(command=["echo", "a\nb"])


def test_models_are_frozen() -> None:
    cfg = RunConfig()
    with pytest.raises(ValueError):
        cfg.train.batch_size = 3  # type: ignore[misc]


def test_config_hash_tracks_trajectory_fields_only() -> None:
    base = TrainConfig()
    assert config_hash(base) == config_hash(TrainConfig(run_dir="/elsewhere", log_interval=7))
    assert config_hash(base) != config_hash(TrainConfig(batch_size=128))
    assert config_hash(base) == config_hash(TrainConfig(allow_config_change=True))


def test_config_is_torch_free() -> None:
    code = "import sys, train, train.spec.config, train.errors; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
