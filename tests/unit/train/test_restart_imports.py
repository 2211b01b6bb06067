"""A restart imports only what its first step needs (issue 17): no ``torch._dynamo``.

torch's optimizers import ``torch._dynamo`` at their first ``step`` (and ``add_param_group``,
``zero_grad``, ``state_dict``, ``load_state_dict``), and so does DDP (its constructor and its
first forward), which costs about as much again as ``import torch``.
:func:`train.loop.optim.eager` and :func:`train.loop.strategies.eager_ddp` do the same without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _train_helpers import (
    eager_ddp_worker,
    free_port,
    resumed_imports_worker,
    start_ranks,
)

from train.loop.optim import eager

REPO = Path(__file__).resolve().parents[3]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO), **extra}


def _run(code: str, tmp_path: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env=_env(tmp_path),
    )
    return out.stdout.strip().splitlines()[-1]


def test_a_resumed_deterministic_single_process_run_never_imports_the_compiler(
    tmp_path: Path,
) -> None:
    # torch.use_deterministic_algorithms imports torch._inductor.config (with torch._dynamo:
    # as long as `import torch` again); train.deterministic sets torch's flag without it, and
    # the compiler's own flag the moment something imports it (a user's torch.compile)
    code = f"""
        import sys
        from pathlib import Path
        import torch
        from train.spec.config import TrainConfig
        from train.env import DistEnv
        from train.loop.trainer import run_training
        cfg = TrainConfig.model_validate({{
            "model": "tinycnn", "width": 4, "data": {{"train_size": 128, "test_size": 32}},
            "batch_size": 32, "epochs": 2, "num_threads": 1, "strategy": "single",
            "optimizer": {{"name": "adamw", "lr": 0.001}}, "deterministic": True,
        }})
        run = Path({str(tmp_path / "run")!r})
        run_training(cfg, DistEnv(), run, max_steps=2)
        r = run_training(cfg, DistEnv(), run, max_steps=4, resume=True)
        assert r.steps == 4 and r.resumed_from is not None, r
        compiler = sorted(m for m in sys.modules if m.startswith(("torch._dynamo", "torch._ind")))
        on = torch.are_deterministic_algorithms_enabled()
        import torch._inductor.config as inductor
        print(compiler, on, inductor.deterministic)
    """
    assert _run(code, tmp_path) == "[] True True"


def test_a_resumed_ddp_run_never_imports_the_compiler(tmp_path: Path) -> None:
    # two ranks over gloo, each its own process (forked from the fork server, which has imported
    # torch and the trainer but never the compiler: checked), a run, then its resume from the
    # checkpoint of step 4 in the same processes
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    start_ranks(resumed_imports_worker, (2, (free_port(), free_port()), str(run_dir)), 2)
    results = [json.loads((run_dir / f"imports-{r}.json").read_text()) for r in range(2)]
    assert results == [{"before": [], "after": [], "resumed": True}] * 2


def test_eager_ddp_trains_bitwise_like_torchs(tmp_path: Path) -> None:
    # each rank trains the same model under eager_ddp (no compiler imported), then under torch's
    # DDP (which imports it), then eager_ddp's forward once more with the compiler imported
    start_ranks(eager_ddp_worker, (2, free_port(), str(tmp_path)), 2)
    results = [json.loads(Path(tmp_path, f"{r}.json").read_text()) for r in range(2)]
    assert results == [{"compiler_after_ours": False, "same": True, "again": True}] * 2


# a script run as `python SCRIPT ARGS`, saying at its exit whether torch's compiler was imported
_AS_MAIN = """
import atexit, runpy, sys
atexit.register(lambda: print("compiler imported:", "torch._dynamo" in sys.modules))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _kill_marked(marker: str) -> None:
    """SIGKILL every process whose environment carries ``marker`` (torchrun starts its ranks
    in sessions of their own: a kill of its group would miss them)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)


def test_the_readmes_plain_ddp_script_never_imports_the_compiler(tmp_path: Path) -> None:
    # examples/byo/plain_ddp.py (the README's recipe) on two real ranks over gloo, started by
    # torchrun (which binds the rendezvous port itself): its one optional import of this project
    # (eager_ddp, eager) is found and used, and the run trains to its end and exits. Before the
    # script released its DDP wrapper ahead of destroy_process_group, about one run in 40 here
    # left a rank stuck at its exit (README, "End a DDP script")
    script = REPO / "examples" / "byo" / "plain_ddp.py"
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "--no-python", sys.executable, "-c", _AS_MAIN, str(script), "--steps", "6",
        "--log-every", "3",
    ]  # fmt: skip
    env = _env(tmp_path, RUN_DIR=str(tmp_path / "run"), OMP_NUM_THREADS="1")
    env["PLAIN_DDP_TEST"] = str(tmp_path)  # what marks every process of this test
    marker = f"PLAIN_DDP_TEST={tmp_path}"
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        _kill_marked(marker)  # torchrun and both ranks: the pipes close, communicate returns
        out, err = proc.communicate()
        pytest.fail(f"not done in 120 s (a rank stuck?): {out[-1000:]} {err[-2000:]}")
    assert proc.returncode == 0, err[-3000:]
    said = [line.split(":")[-1].strip() for line in out.splitlines() if "compiler imported" in line]
    assert said == ["False", "False"], out[-2000:]
    progress = (tmp_path / "run" / "progress.jsonl").read_text().splitlines()
    assert json.loads(progress[-1])["event"] == "done" and json.loads(progress[-1])["step"] == 6


def _train(cls: type[torch.optim.Optimizer], **kw: Any) -> tuple[list[torch.Tensor], Any]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = cls(m.parameters(), **kw)
    for _ in range(4):
        m(torch.randn(3, 4)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    opt.load_state_dict(opt.state_dict())
    return [p.detach().clone() for p in m.parameters()], opt.state_dict()


@pytest.mark.parametrize(
    ("cls", "kw"),
    [
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}),
        (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    ],
)
def test_eager_optimizers_step_bitwise_like_torchs(
    cls: type[torch.optim.Optimizer], kw: dict[str, Any]
) -> None:
    ours, our_state = _train(eager(cls), **kw)
    theirs, their_state = _train(cls, **kw)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert our_state["param_groups"] == their_state["param_groups"]
    assert isinstance(eager(cls)([torch.zeros(1, requires_grad=True)], **kw), cls)


def test_the_collector_is_off_for_start_up_and_on_for_training(tmp_path: Path) -> None:
    # python -m train and TrainLaunch pause the collector; the run's start freezes what start-up
    # built and turns it back on, so training and the user's code run with it on.
    code = f"""
        import gc
        from train.startup import pause_collector, resume_collector
        resume_collector()
        untouched = gc.isenabled() and gc.get_freeze_count() == 0  # not paused by us: no-op
        pause_collector()
        paused = not gc.isenabled()
        from pathlib import Path
        from train.spec.config import TrainConfig
        from train.env import DistEnv
        from train.loop.trainer import run_training
        seen = []
        cfg = TrainConfig.model_validate({{
            "model": "tinycnn", "width": 4, "data": {{"train_size": 64, "test_size": 16}},
            "batch_size": 32, "epochs": 1, "num_threads": 1, "strategy": "single",
        }})
        import train.loop.trainer as t
        step = t._Loop.run
        def run(self, *a, **k):
            seen.append((gc.isenabled(), gc.get_freeze_count() > 1000))
            return step(self, *a, **k)
        t._Loop.run = run
        run_training(cfg, DistEnv(), Path({str(tmp_path / "run")!r}), max_steps=1)
        print(untouched, paused, seen)
    """
    assert _run(code, tmp_path) == "True True [(True, True)]"
