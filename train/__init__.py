"""Training runtime that runs inside a Slurm allocation, under torchrun, or as a plain process.

Importing this package is cheap and never imports torch: ``train.config`` (the spec models) and
``train.errors`` are torch-free so that ``jobs`` can validate specs without paying for torch.
The trainer, models and data live in submodules that import torch when they are imported.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
