"""Training runtime that runs inside a Slurm allocation, under torchrun, or as a plain process.

Importing this package is cheap and never imports torch: ``train.spec.config`` (the spec models) and
``train.errors`` are torch-free so that ``jobs`` can validate specs without paying for torch.

Public pieces (each module imports torch only if it needs it):

- ``python -m train --config SPEC.yaml`` / :func:`train.cli.main` (argv -> exit code);
- :func:`train.loop.trainer.run_training` (config, env, run_dir, max_steps) -> ``TrainResult``;
- :class:`train.env.DistEnv` (``from_env(os.environ)``: rank, world, master, job, restarts);
- :func:`train.device.resolve_device` (the device(s) and backend a rank trains on);
- :class:`train.entry.TrainContext`: what a spec ``entrypoint.function`` receives;
- :class:`train.session.RunSession`: the one run set-up around any training code (checkpoints,
  resume choice, preemption guard, process group, stop/failure -> requeue);
- :class:`train.checkpoint.manager.CheckpointManager`, :class:`train.stop.signals.PreemptionGuard`
  (:mod:`train.stop.facts` classifies Slurm stops, :mod:`train.stop.act` is the requeue policy);
- :mod:`train.loop.data` (CIFAR-10 readers/writer, synthetic data), :mod:`train.loop.models`,
  :mod:`train.loop.strategies` (ddp, dp, pipeline, single).
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
