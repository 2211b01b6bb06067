"""examples/reshard_train.py: an FSDP2 + torch.distributed.checkpoint function entrypoint
stopped on 2 ranks resumes on 1 (DCP reshards), told the size it was written at, and ends with
the weights of the same run on 1 rank throughout (up to the float reduction order)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from train.history import read_jsonl

sys.path.insert(0, str(Path(__file__).parent))
from _reshape_helpers import run_entry_attempt

REPO = Path(__file__).resolve().parents[3]
STEPS = 12
SPEC = {
    "entrypoint": {"function": "_reshape_helpers:stopping_reshard_main"},
    "train": {
        "batch_size": 32,
        "max_steps": STEPS,
        "num_threads": 1,
        "log_interval": 4,
        "stop_check_s": 0.0,
        "deterministic": True,
    },
}


def _weights(run_dir: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    # imported here, not at collection: it costs about as much as `import torch` again, in every
    # test worker, for the one worker that runs this test
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{run_dir.name}.pt"
    dcp_to_torch_save(run_dir / "dcp" / f"step-{STEPS}", out)
    return dict(torch.load(out, weights_only=True)["model"])


@pytest.fixture(autouse=True)
def _importable_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))


def test_stopped_on_two_ranks_resumes_on_one_with_dcp(tmp_path: Path) -> None:
    assert run_entry_attempt(SPEC, tmp_path / "ref", 1, 0) == [0]
    run = tmp_path / "run"
    first = run_entry_attempt(SPEC, run, 2, 0, stop_at=4)
    assert first[0] != 0  # stopped and asked for a requeue
    second = run_entry_attempt(SPEC, run, 1, 1, resume=True)
    assert second == [0]
    resume = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "resume"]
    assert [(e["world_size"], e["was_world_size"]) for e in resume] == [(1, 2)]
    saved = [e["step"] for e in read_jsonl(run / "events.jsonl") if e["event"] == "checkpoint"]
    assert len(saved) == 1 and 0 < saved[0] < STEPS
    assert resume[0]["path"].endswith(f"step-{saved[0]}")
    ref, got = _weights(tmp_path / "ref", tmp_path), _weights(run, tmp_path)
    assert ref.keys() == got.keys()
    assert max(float((ref[k] - got[k]).abs().max()) for k in ref) < 1e-5
    # the stopped step's DCP directory was what the resume read; pruned ones are gone
    assert {p.name for p in (run / "dcp").iterdir()} <= {
        p.name for p in (run / "checkpoints").iterdir()
    }
