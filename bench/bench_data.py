"""Data pipeline: images/s the CIFAR pipeline delivers on its own vs what a training step eats.

The pipeline is exactly what :mod:`train.loop.trainer` does per step: one index operation into the
in-memory ``uint8`` set, ``Augmenter.draw`` (crop offsets and flips for the step) and
``Augmenter.apply`` (pad, crop, flip, normalise), on the CPU, one thread. The consumer is one
training step (forward, loss, backward, SGD) of the same model and batch the training
benchmark uses, fed a batch that is already prepared. Both are timed in the same process,
alternating, after a warm-up; ``ratio = pipeline images/s / step images/s`` should be far
above 1: the loader is then never the bottleneck, and a data-loader process pool would buy
nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.common import Figure, Goal, Options, interleave

__all__ = ["run"]

SECTION = "Data pipeline (CPU, 1 thread)"
#: "Never the bottleneck": with 10x headroom the pipeline costs under a tenth of a step.
GOAL = Goal(">=", 10.0)


def _measures(
    model_name: str, width: int, batch: int, rounds: int
) -> dict[str, Callable[[], float]]:
    import torch
    from torch import nn

    from train.loop.data import Augmenter, make_synthetic
    from train.loop.models import build_model

    torch.set_num_threads(1)
    data = make_synthetic(8 * batch * rounds, seed=0, split="train")
    aug = Augmenter(torch.device("cpu"), augment=True, seed=0)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))
    n_batches = len(data) // batch
    torch.manual_seed(0)
    model = build_model(model_name, width)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    x_ready = aug.normalize(data.images[:batch])
    y_ready = data.labels[:batch]
    state = {"step": 0}

    def pipeline() -> float:
        # Several batches per sample: one batch takes well under a millisecond.
        n = 8
        t0 = time.perf_counter()
        for _ in range(n):
            s = state["step"] % n_batches
            state["step"] += 1
            idx = order[s * batch : (s + 1) * batch]
            crops = aug.draw(batch, epoch=0, step=s, rank=0)
            x = aug.apply(data.images[idx], crops)
            _ = data.labels[idx]
        elapsed = time.perf_counter() - t0
        assert x.shape == (batch, 3, 32, 32)
        return n * batch / elapsed

    def step() -> float:
        n = 2
        t0 = time.perf_counter()
        for _ in range(n):
            loss = nn.functional.cross_entropy(model(x_ready), y_ready)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return n * batch / (time.perf_counter() - t0)

    return {"pipeline": pipeline, "step": step}


def run(opts: Options) -> list[Figure]:
    """Pipeline vs step images/s for the tiny CNN (the training benchmark's model) and ResNet-9."""
    repeats = 5 if opts.quick else 9
    figures = []
    cases = [("tinycnn", 16, 128)] + ([] if opts.quick else [("resnet", 16, 128)])
    for model_name, width, batch in cases:
        opts.log(f"data: pipeline vs {model_name} w{width} step, batch {batch}")
        measures = _measures(model_name, width, batch, repeats + 2)
        samples = interleave(measures, repeats=repeats, warmup=2)
        figures.append(
            Figure.measured(
                SECTION,
                f"pipeline images/s vs {model_name} w{width} training step",
                "img/s",
                samples["pipeline"],
                samples["step"],
                baseline_name="step consumption",
                goal=GOAL,
                note=(
                    f"index + crop/flip + normalise as the trainer does, batch {batch}; "
                    f"median of {repeats}"
                ),
            )
        )
    return figures
