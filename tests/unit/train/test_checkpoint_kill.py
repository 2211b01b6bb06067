"""A process SIGKILLed while writing a checkpoint: the previous one stays intact and loadable.

A real subprocess saves step 1, then saves step 2 with a save-phase hook
(``train.checkpoint.manager.SAVE_PHASE_HOOKS``) that holds the save once the file the test kills
at exists (the test kills it there: no race, no sleep to wait out); the test kills it at each
phase of the save and checks that ``latest_valid`` returns step 1 unchanged and that a restarted
manager completes step 2.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from train.checkpoint.manager import (
    CheckpointManager,
    load_model_state,
    model_digest,
    verify_checkpoint,
)

REPO = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent(
    """
    import os, sys, torch
    from torch import nn
    from train.checkpoint.manager import CheckpointManager, capture_rng_state, model_digest
    root, async_save, kill_at = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cm = CheckpointManager(root, rank=0, world_size=1, async_save=async_save)
    def step(n):
        opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()
        cm.save(n, {"optimizer": opt.state_dict()}, {"rng": capture_rng_state()},
                epoch=0, epoch_step=n, model=model)
    step(1); cm.wait()
    print("digest1", model_digest(model), flush=True)
    import time, train.checkpoint.manager as manager
    def hold(phase):  # the test kills us once kill_at exists: hold the save there
        if os.path.exists(kill_at):
            time.sleep(120)
    manager.SAVE_PHASE_HOOKS.append(hold)
    step(2)
    print("saving2", flush=True)
    cm.wait()
    print("unexpected: save finished", flush=True)
    """
)


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
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), "1" if async_save else "0", str(target)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[0] == "digest1", line
        digest1 = line[1]
        deadline = time.monotonic() + 60
        while not target.exists():
            assert proc.poll() is None, "child exited early"
            assert time.monotonic() < deadline, f"{target} never appeared"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()

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
