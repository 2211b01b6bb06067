"""Load a spec file: YAML -> overrides -> strict validation -> sweep expansion.

Reading, YAML, ``--set`` and the one-line errors are :mod:`train.spec.load` /
:mod:`train.spec.messages`, shared with ``python -m train --config``. Every problem becomes one
line ``file:line:column: field.path: problem (hint)``; a problem that comes from ``--set``
points at the override instead (``--set k=v: field.path: ...``). The sweep is expanded here
and only here (:attr:`LoadedSpec.tasks`); :func:`sweepable` is the one rule for what a sweep
may vary.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.errors import SpecError
from train.spec import Override, Source, load_source, read_spec_file, set_path, where

if TYPE_CHECKING:
    from jobs.spec import JobSpec

MAX_ARRAY = 10_000
MAX_LINES = 20
# Sections a sweep may vary: everything else is part of the one sbatch script all tasks share.
SWEEPABLE = ("train.", "entrypoint.", "requeue.max_")


def sweepable(key: str) -> bool:
    """Whether a sweep may vary the field ``key`` (dotted): the one rule, for every renderer."""
    return key.startswith(SWEEPABLE)


@dataclass(frozen=True)
class Task:
    """One point of a sweep (or the whole job when there is no sweep)."""

    index: int
    values: dict[str, Any]
    spec: JobSpec


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec with where it came from; ``tasks`` has one entry per array task."""

    path: Path
    text: str
    data: dict[str, Any]
    spec: JobSpec
    tasks: list[Task]
    source: Source
    parsed: tuple[Override, ...] = ()

    @property
    def is_array(self) -> bool:
        return self.spec.sweep is not None

    @property
    def overrides(self) -> list[str]:
        return [ov.text for ov in self.parsed]

    def where(self, path: Sequence[str]) -> str:
        """``file:line:column`` (or ``--set k=v``) of a field, for messages about it."""
        return where(tuple(path), False, self.source, self.parsed)


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> LoadedSpec:
    """Read, override, validate and expand a spec.

    Raises :class:`SpecError` listing every problem, one line each.
    """
    p = Path(path)
    return load_text(read_spec_file(p), str(p), overrides, path=p)


def load_text(
    text: str, filename: str, overrides: Sequence[str] = (), *, path: Path | None = None
) -> LoadedSpec:
    """Like :func:`load_spec` for a spec held in memory (``filename`` only labels errors)."""
    source, parsed, data = load_source(text, filename, overrides)
    # Only now pydantic and the models (~40 ms): a file refused as YAML never pays for them.
    from jobs.spec import JobSpec
    from train.spec import validate

    spec = validate(JobSpec, data, source, parsed)
    tasks = _expand(spec, data, source, parsed)
    return LoadedSpec(path or Path(filename), text, data, spec, tasks, source, parsed)


def resolve_field(path: Iterable[str]) -> tuple[bool, list[str]]:
    """Whether ``path`` names a field of JobSpec; else the valid names where it went wrong."""
    from jobs.spec import JobSpec
    from train.spec import resolve_field as _resolve_field

    return _resolve_field(JobSpec, path)


# -- sweeps -------------------------------------------------------------------------------------
def _expand(
    spec: JobSpec, data: dict[str, Any], source: Source, parsed: Sequence[Override]
) -> list[Task]:
    if spec.sweep is None:
        return [Task(0, {}, spec)]
    from pydantic import ValidationError

    from jobs.spec import JobSpec
    from train.spec import error_lines

    grid = spec.sweep.grid
    problems: list[str] = []
    for key in grid:
        place = where(("sweep", "grid", key), True, source, parsed)
        exists, valid = resolve_field(key.split("."))
        if not exists:
            hint = f"valid here: {', '.join(valid)}" if valid else "check the path"
            problems.append(f"{place}: sweep.grid.{key}: no such field ({hint})")
        elif not sweepable(key):
            problems.append(
                f"{place}: sweep.grid.{key}: cannot vary inside one job array, all tasks share one "
                "sbatch script (sweep train.*, entrypoint.* or requeue.max_*; submit separate "
                "specs for other fields)"
            )
    if spec.sweep.size > MAX_ARRAY:
        place = where(("sweep", "grid"), True, source, parsed)
        problems.append(
            f"{place}: sweep.grid: {spec.sweep.size} points is more than {MAX_ARRAY}, "
            "the most one submission takes; split the sweep"
        )
    if problems:
        raise SpecError(problems)
    base = {k: v for k, v in data.items() if k != "sweep"}
    keys = list(grid)
    tasks: list[Task] = []
    for index, combo in enumerate(itertools.product(*(grid[k] for k in keys))):
        point = base
        for key, value in zip(keys, combo, strict=True):
            point = set_path(point, tuple(key.split(".")), value, f"sweep.grid.{key}")
        values = dict(zip(keys, combo, strict=True))
        try:
            task_spec = JobSpec.model_validate(point)
        except ValidationError as exc:
            label = ", ".join(f"{k}={v!r}" for k, v in values.items())
            lines = error_lines(exc, point, source, parsed, JobSpec, f"(sweep point {label}) ")
            problems.extend(_point_where(line, keys, combo, source) for line in lines)
            if len(problems) >= MAX_LINES:
                break
            continue
        tasks.append(Task(index, values, task_spec))
    if problems:
        raise SpecError(list(dict.fromkeys(problems))[:MAX_LINES])
    return tasks


def _point_where(line: str, keys: list[str], combo: Sequence[Any], source: Source) -> str:
    """Point a sweep-point error at the grid value that caused it when one did."""
    for key, value in zip(keys, combo, strict=True):
        if f" {key}: " in line or f"){key}" in line.replace(" ", ""):
            values = source.data.get("sweep", {}).get("grid", {}).get(key, [])
            idx = next((i for i, v in enumerate(values) if v == value), None)
            if idx is not None:
                place = source.where(("sweep", "grid", key, idx))
                return place + line[line.index(": ") :]
    return line
