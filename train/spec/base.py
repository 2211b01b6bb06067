"""The base of every job-spec model (torch-free): strict, immutable, no coercion, no NaN/inf."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel"]


class StrictModel(BaseModel):
    """Base of every spec model: unknown keys are errors, instances are immutable, no types are
    coerced and ``.nan``/``.inf`` are not numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
