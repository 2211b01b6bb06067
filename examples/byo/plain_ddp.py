"""A plain torchrun-style DDP script that survives Slurm stops: one optional import of ours.

Run it under ``entrypoint: {command: [python, examples/byo/plain_ddp.py]}`` (examples/byo/ddp.yaml),
under ``torchrun --nproc-per-node=2 examples/byo/plain_ddp.py``, or alone. What makes it resumable:

1. ``init_process_group("gloo" or "nccl", init_method="env://")``: RANK, WORLD_SIZE, MASTER_ADDR
   and MASTER_PORT are set by the job (or by torchrun);
2. a handler for SIGUSR1 only sets a flag (the job sends it once, ``entrypoint.stop_signal:
   auto`` finds the handler); the ranks agree on it without a blocking collective per step:
   after each step an asynchronous all_reduce (MAX) of the flag starts, and its result is read
   after the next step (one step late; it overlaps the step, so it costs nothing measurable);
   when it says stop, rank 0 saves and every rank exits 0: the job then requeues and the next
   start resumes;
3. the checkpoint lives in ``$RUN_DIR`` (written to a temporary name, then renamed: never a
   half-written file), and the next start loads it when it exists;
4. optional, for a faster start: ``eager_ddp`` and ``eager`` from this project build the same
   DDP and optimizer without importing torch's compiler (about 2 s of every rank's every start
   here); where the project is not installed the script uses torch's own.

``--step-time`` adds a pause per step, standing in for a real model on this 2-core machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:  # DDP and optimizers without importing torch's compiler: the same training, a faster start
    from train.loop.optim import eager
    from train.loop.strategies import eager_ddp
except ImportError:  # anywhere else: torch's own
    eager_ddp, eager = nn.parallel.DistributedDataParallel, lambda cls: cls

STOP = False


def _on_stop(signum: int, frame: object) -> None:
    global STOP
    STOP = True  # only a flag: the training loop saves at the next step boundary


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args()

    signal.signal(signal.SIGUSR1, _on_stop)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo", init_method="env://")
    run_dir = Path(os.environ.get("RUN_DIR", "runs/plain-ddp"))
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = run_dir / "plain_ddp.pt"
    restart = int(os.environ.get("TRAIN_RESTART_COUNT", os.environ.get("SLURM_RESTART_COUNT", "0")))
    torch.manual_seed(0)
    torch.set_num_threads(1)

    x = torch.randn(512, 8)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    ddp = eager_ddp(model) if world > 1 else model
    opt = eager(torch.optim.SGD)(model.parameters(), lr=0.1)

    step = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    progress = run_dir / "progress.jsonl"

    def record(**fields: object) -> None:
        if rank == 0:
            with progress.open("a") as f:
                f.write(json.dumps({"time": time.time(), "restart": restart, **fields}) + "\n")

    def save() -> None:
        if rank == 0:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
        if world > 1:
            dist.barrier()

    record(event="start", step=step, world=world)
    agreed: dist.Work | None = None  # the stop flag's all_reduce in flight
    flag = torch.zeros(1)
    epoch = step // len(loader)
    while step < args.steps:
        sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            if i < step % len(loader):
                continue  # resume mid-epoch: skip the batches already trained on
            loss = nn.functional.binary_cross_entropy_with_logits(ddp(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            time.sleep(args.step_time)
            if step % args.log_every == 0:  # the mean loss over ranks, now and then
                metric = loss.detach().clone()
                if world > 1:
                    dist.all_reduce(metric)
                    metric /= world
                record(step=step, loss=round(float(metric), 5))
            # Whether any rank must stop, agreed one step late: wait for the all_reduce started
            # after the previous step (it ran while this step did), then start the next one.
            if agreed is not None:
                agreed.wait()
                if flag.item() > 0:
                    save()
                    record(event="saved", step=step)
                    # exit fast: the job requeues once we are gone (the interpreter's final
                    # collection of torch's objects took 0.4 s here; frozen, 0.1 s)
                    gc.freeze()
                    return 0  # the job requeues us; the next start resumes from `ckpt`
            flag = torch.tensor([1.0 if STOP else 0.0])
            if world > 1:
                agreed = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
            elif STOP:
                save()
                record(event="saved", step=step)
                return 0
            if step % args.save_every == 0 or step == args.steps:
                save()
            if step >= args.steps:
                break
        epoch += 1
    if agreed is not None:
        agreed.wait()  # every rank started the same collectives: finish them before leaving
    record(event="done", step=step)
    if world > 1:
        # DDP first: its reducer holds the process group too, and if it lets go last, the group
        # is destroyed with the GIL held while gloo's worker thread may need it (a rank stuck at
        # its exit: torch 2.13). Released by destroy_process_group, the group goes without it.
        del ddp
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
