"""bench/bench_gpu.py without a GPU: its training config stays valid and its summary is right.

The GPU run itself needs CUDA (skipped in the report otherwise); these keep the parts that do
not from rotting while no GPU is at hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import bench_gpu


@pytest.mark.parametrize("world", [1, 4])
def test_the_gpu_config_is_a_valid_train_config(
    world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CIFAR10_DIR", raising=False)
    cfg = bench_gpu._config(epochs=24, batch=512, world=world)
    assert cfg.precision == "bf16" and cfg.channels_last and cfg.model == "resnet"
    assert cfg.target_accuracy == bench_gpu.TARGET
    assert cfg.strategy == ("ddp" if world > 1 else "single")
    assert cfg.data.kind == "synthetic"
    monkeypatch.setenv("CIFAR10_DIR", "/data/cifar-10-batches-bin")
    assert bench_gpu._config(24, 512, world).data.kind == "cifar10"


def test_the_trainer_has_every_option_the_gpu_path_uses() -> None:
    assert bench_gpu.support_gaps() == []


def test_summary_reads_time_to_target_from_the_run(tmp_path: Path) -> None:
    events = [{"time": 100.0, "event": "start"}, {"time": 109.0, "event": "target"}]
    metrics = [
        {"time": 103.0, "kind": "eval", "test_accuracy": 0.81},
        {"time": 105.5, "kind": "train", "loss": 0.3},
        {"time": 108.0, "kind": "eval", "test_accuracy": 0.945},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    out = bench_gpu._summarise(tmp_path, 12345.0)
    assert out == {"images_per_s": 12345.0, "seconds_to_94": 8.0, "best_accuracy": 0.945}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(metrics[0]) + "\n")
    assert bench_gpu._summarise(tmp_path, None)["seconds_to_94"] is None
