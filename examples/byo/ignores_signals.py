"""A training script that handles no signal at all and saves every few steps.

Under ``entrypoint: {command: [python, examples/byo/ignores_signals.py]}`` (examples/byo/plain.yaml)
a preemption or time limit stops it (it catches nothing, so it is stopped at once), the job is
requeued, and the next start resumes from its last periodic save in ``$RUN_DIR``: at most
``--save-every`` steps are trained again. Nothing from this project is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.0)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    run_dir = Path(os.environ.get("RUN_DIR", "runs/ignores-signals"))
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = run_dir / "model.pt"
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    restart = int(os.environ.get("TRAIN_RESTART_COUNT", "0"))
    with (run_dir / "progress.jsonl").open("a") as log:
        log.write(
            json.dumps({"time": time.time(), "event": "start", "step": step, "restart": restart})
            + "\n"
        )
        log.flush()
        while step < args.steps:
            x = torch.randn(16, 4)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            time.sleep(args.step_time)
            log.write(json.dumps({"time": time.time(), "step": step, "restart": restart}) + "\n")
            log.flush()
            if step % args.save_every == 0 or step == args.steps:
                tmp = ckpt.with_suffix(".tmp")
                torch.save(
                    {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp
                )
                os.replace(tmp, ckpt)
        log.write(
            json.dumps({"time": time.time(), "event": "done", "step": step, "restart": restart})
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
