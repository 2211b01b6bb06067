"""A process SIGKILLed while writing a checkpoint: the previous one stays intact and loadable.

A real process (forked from the test worker's fork server, which has torch imported: see
``_train_helpers``) saves step 1, then saves step 2 with a save-phase hook
(``train.checkpoint.manager.SAVE_PHASE_HOOKS``) that holds the save once the file the test kills
at exists (the test kills it there: no race, no sleep to wait out); the test kills it at each
phase of the save and checks that ``latest_valid`` returns step 1 unchanged and that a restarted
manager completes step 2.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from train.checkpoint import (
    CheckpointManager,
    load_model_state,
    model_digest,
    verify_checkpoint,
)

sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import save_then_hold_worker, start_process


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize(
    ("async_save", "kill_when"),
    [
        (False, "rank-0.pt"),  # rank file written, marker not yet
        (False, "shared.pt"),  # shared state written, manifest not yet
        (False, "manifest.json"),  # manifest written, directory not yet renamed
        (True, "shared.pt"),  # the background thread dies with the process
    ],
)
def test_sigkill_during_save_keeps_previous_checkpoint(
    tmp_path: Path, async_save: bool, kill_when: str
) -> None:
    root = tmp_path / "checkpoints"
    target = root / ".step-2.tmp" / kill_when
    digest_file = tmp_path / "digest1"
    proc = start_process(
        save_then_hold_worker, str(root), async_save, str(target), str(digest_file)
    )
    try:
        deadline = time.monotonic() + 60
        while not target.exists():
            assert proc.is_alive(), f"the saving process exited early ({proc.exitcode})"
            assert time.monotonic() < deadline, f"{target} never appeared"
            time.sleep(0.02)
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    digest1 = digest_file.read_text()
    assert not Path(f"{digest_file}.unexpected").exists()

    assert not (root / "step-2").exists()
    cm = CheckpointManager(root, rank=1, world_size=1)  # rank != 0: does not clean up
    assert (root / ".step-2.tmp").exists()
    assert cm.latest_valid() == root / "step-1"
    assert verify_checkpoint(root / "step-1")["digest"] == digest1

    # the resumed run: loads step 1, trains, saves step 2 over the leftover
    cm = CheckpointManager(root, rank=0, world_size=1)
    assert not (root / ".step-2.tmp").exists()
    model = _model()
    load_model_state(model, cm.load(root / "step-1").shared["model"])
    assert model_digest(model) == digest1
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    cm.save(2, {}, {}, epoch=0, epoch_step=2, model=model)
    assert cm.latest_valid() == root / "step-2"
    assert verify_checkpoint(root / "step-2")["digest"] == model_digest(model)
