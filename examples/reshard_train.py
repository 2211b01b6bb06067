"""Your own training that resumes on another world size: sharded with FSDP2, checkpointed with
``torch.distributed.checkpoint`` (DCP), which reshards on load.

The spec (examples/reshard.yaml) names this function as its entrypoint and lets Slurm start the
job on 1 or 2 nodes (``resources.nodes: "1-2"``); a run preempted on 2 nodes and requeued when
only 1 is free resumes here on 1. What makes that work:

1. the data order does not depend on the world size: the global batch of step ``s`` is a
   function of (seed, s), and rank ``r`` of ``W`` computes the contiguous slice ``r/W`` of it;
2. model and optimizer state are saved with DCP (every rank writes its shards) into
   ``RUN_DIR/dcp/step-N``, then ``ctx.checkpoints.save`` commits step N (its manifest is written
   last, so a valid ``checkpoints/step-N`` means the DCP directory of step N is complete);
3. on resume ``ctx.checkpoint_world_size`` says the size the checkpoint was written at, and
   ``dcp.load`` reads the shards into this world size's layout (2 shards -> 1, 1 -> 2).
"""

from __future__ import annotations

import logging
import math
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

from train.entry import TrainContext

log = logging.getLogger("examples.reshard_train")

#: The checkpoint manager's own file holds no weights here: they are in the DCP directory.
_NO_WEIGHTS = nn.Module()


def spirals(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points on 3 noisy spiral arms: inputs ``[n, 2]``, labels ``[n]``."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=gen)
    r = torch.rand(n, generator=gen)
    theta = 4.0 * r + labels * (2 * math.pi / 3) + 0.2 * torch.randn(n, generator=gen)
    return torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=1), labels


def global_batch(step: int, seed: int, n: int, batch: int) -> torch.Tensor:
    """The sample ids of step ``step``: the same for every world size."""
    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    return torch.randint(0, n, (batch,), generator=gen)


def make_model() -> nn.Sequential:
    """2 -> 64 -> 64 -> 3, each linear layer sharded over the ranks (FSDP2) when there are
    several (one process has no process group: its model is plain, and DCP reads any shards
    into it just the same)."""
    model = nn.Sequential(
        nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3)
    )
    if not dist.is_initialized():
        return model
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def main(ctx: TrainContext) -> int:
    """Train the sharded MLP; checkpoint with DCP; resume on any world size."""
    cfg = ctx.config.train
    env = ctx.env
    if cfg.batch_size % env.world_size:
        raise ValueError(f"train.batch_size {cfg.batch_size} does not split over {env.world_size}")
    torch.manual_seed(cfg.seed)  # the same initial weights at every world size
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=min(cfg.optimizer.lr, 0.01))
    x, y = spirals(6000, cfg.seed)
    total = cfg.max_steps or 600
    per_rank = cfg.batch_size // env.world_size
    mine = slice(env.rank * per_rank, (env.rank + 1) * per_rank)

    step = 0
    loaded = ctx.load_resume()
    if loaded is not None:
        model_state, optim_state = get_state_dict(model, optimizer)  # this layout's shards
        dcp.load(  # reads the shards of the size it was written at into this layout
            {"model": model_state, "optim": optim_state},
            checkpoint_id=ctx.run_dir / loaded.shared["dcp"],
        )
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
        step = loaded.step
        was = ctx.checkpoint_world_size
        log.info(
            "resumed at step %d from %s (written on %s rank(s), now %d)",
            step,
            loaded.path,
            was,
            env.world_size,
        )

    def save(step: int) -> None:
        model_state, optim_state = get_state_dict(model, optimizer)
        name = f"dcp/step-{step}"
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=ctx.run_dir / name)
        ctx.checkpoints.save(step, {"dcp": name}, {}, epoch=0, epoch_step=step, model=_NO_WEIGHTS)
        ctx.checkpoints.wait()
        if ctx.is_main:  # DCP directories of checkpoints the manager pruned
            kept = {p.name for p in ctx.checkpoints.checkpoints()}
            for old in (ctx.run_dir / "dcp").glob("step-*"):
                if old.name not in kept and old.name != f"step-{step}":
                    shutil.rmtree(old, ignore_errors=True)

    while step < total:
        idx = global_batch(step, cfg.seed, x.shape[0], cfg.batch_size)[mine]
        # sum over this rank's slice / global batch: FSDP's gradient average over ranks times
        # world size makes it the mean over the global batch at every world size
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="sum")
        (loss * env.world_size / cfg.batch_size).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if ctx.is_main and step % cfg.log_interval == 0:
            log.info("step %d/%d loss %.4f", step, total, loss.item() / per_rank)
        ctx.progress(step)
        if ctx.should_stop():  # every rank, every step: ranks agree on stopping
            save(step)
            return ctx.requeue(step)
    save(step)
    return 0
