"""Our calls into torch raise no warnings (issue 19): a real 2-rank gloo DDP, warnings as errors.

Each rank builds the ``ddp`` strategy (plain and with global BatchNorm, the case that turns off
per-forward buffer broadcasts) and runs two training steps with every warning turned into an
error; then the ranks compare parameters (and, with global BatchNorm, buffers): they must agree.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

WORKER = textwrap.dedent(
    """
    import os, socket, sys, warnings

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from train.env import DistEnv
    from train.device import resolve_device
    from train.loop.models import build_model
    from train.loop.optim import eager
    from train.loop.strategies import build_strategy


    def worker(rank, world, port):
        env = DistEnv(rank=rank, local_rank=rank, world_size=world, local_world_size=world,
                      master_port=port, launcher="torchrun")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        warnings.simplefilter("error")  # from here on: our calls only
        for sync_bn in (False, True):
            train_two_steps(rank, world, env, sync_bn)
        dist.destroy_process_group()
        # torch's gloo threads can abort the interpreter's exit ("terminate called without an
        # active exception", SIGABRT; seen once in CI after all of the above passed): this
        # test is about the training, not torch's teardown
        sys.stderr.flush()
        os._exit(0)


    def train_two_steps(rank, world, env, sync_bn):
        torch.manual_seed(0)
        devices = resolve_device(env, "ddp", allow_cpu_fallback=False)
        model = build_model("tinycnn", width=4, norm="batch")
        strategy = build_strategy("ddp", model, devices, env, sync_batchnorm=sync_bn)
        assert type(strategy.module).__name__ == "DistributedDataParallel"
        # the trainer's optimizer step (torch's, without its import of the compiler)
        opt = eager(torch.optim.SGD)(strategy.model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(2):
            x = torch.randn(8, 3, 32, 32, generator=gen)
            y = torch.randint(0, 10, (8,), generator=gen)
            loss = torch.nn.functional.cross_entropy(strategy(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        # Buffers too with global BatchNorm; with local BatchNorm the last forward updated
        # each rank's running statistics from its own batch, so only parameters must agree.
        tensors = strategy.model.state_dict().values() if sync_bn else strategy.model.parameters()
        state = torch.cat([t.detach().flatten().float() for t in tensors])
        gathered = [torch.empty_like(state) for _ in range(world)]
        dist.all_gather(gathered, state)
        assert torch.equal(gathered[0], gathered[1]), f"ranks diverged (sync_bn={sync_bn})"


    if __name__ == "__main__":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # forked, not spawned: the ranks start with torch and our modules already imported (a
        # spawned rank imports them again: ~3 s of CPU each, here)
        mp.start_processes(worker, args=(2, port), nprocs=2, join=True, start_method="fork")
        print("ok")
    """
)


def test_two_rank_ddp_runs_without_any_warning(tmp_path: Path) -> None:
    script = tmp_path / "ddp_worker.py"
    script.write_text(WORKER)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]
