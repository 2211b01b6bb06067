"""Load a spec file: YAML -> overrides -> strict validation -> sweep expansion.

Every problem becomes one line ``file:line:column: field.path: problem (hint)``; a problem
that comes from ``--set`` points at the override instead (``--set k=v: field.path: ...``).
"""

from __future__ import annotations

import itertools
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from jobs.errors import SpecError
from jobs.overrides import CONTROL_RE, Override, apply_overrides, parse_override, set_path
from jobs.spec import FieldIssue, JobSpec
from jobs.yamlsrc import Path_, Source, load_yaml

MAX_ARRAY = 10_000
MAX_LINES = 20
# Sections a sweep may vary: everything else is part of the one sbatch script all tasks share.
SWEEPABLE = ("train.", "entrypoint.", "requeue.max_")


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
        return _where(tuple(path), False, self.source, self.parsed)


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> LoadedSpec:
    """Read, override, validate and expand a spec.

    Raises :class:`SpecError` listing every problem, one line each.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise SpecError([f"{p}: cannot read the spec: {reason}"]) from None
    return load_text(text, str(p), overrides, path=p)


def load_text(
    text: str, filename: str, overrides: Sequence[str] = (), *, path: Path | None = None
) -> LoadedSpec:
    """Like :func:`load_spec` for a spec held in memory (``filename`` only labels errors)."""
    source = load_yaml(text, filename)
    if not isinstance(source.data, dict):
        raise SpecError(
            [
                f"{source.where(())}: (top level): the spec must be a mapping (name:, resources:, "
                "train: ...; see examples/cifar.yaml)"
            ]
        )
    parsed = [parse_override(o) for o in overrides]
    data = apply_overrides(source.data, parsed)
    lines = _control_chars(data, source, parsed)
    if lines:
        raise SpecError(lines)
    spec = _validate(data, source, parsed)
    tasks = _expand(spec, data, source, parsed)
    return LoadedSpec(path or Path(filename), text, data, spec, tasks, source, tuple(parsed))


# -- validation and error lines -----------------------------------------------------------------
def _validate(
    data: dict[str, Any], source: Source, parsed: Sequence[Override], point: str = ""
) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_lines(exc, data, source, parsed, point)) from None


def _lines(
    exc: ValidationError, data: Any, source: Source, parsed: Sequence[Override], point: str
) -> list[str]:
    out: list[str] = []
    for err in exc.errors(include_url=False):
        path, is_key = _data_path(err, data)
        where = _where(path, is_key, source, parsed)
        field = _dotted(path) or "(top level)"
        line = f"{where}: {point}{field}: {_message(err, path)}"
        if line not in out:
            out.append(line)
    return out


def _data_path(err: Any, data: Any) -> tuple[Path_, bool]:
    """The error's location in the YAML data: drop pydantic's union/validator tags."""
    loc = list(err["loc"])
    path: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        in_map = isinstance(node, Mapping) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_map or in_list:
            path.append(part)
            node = node[part]
        elif last and err["type"] in ("extra_forbidden", "missing"):
            path.append(part)
    issue = (err.get("ctx") or {}).get("error")
    if isinstance(issue, FieldIssue):
        path.extend(issue.path.split("."))
        return tuple(path), False
    return tuple(path), err["type"] == "extra_forbidden"


def _where(path: Path_, is_key: bool, source: Source, parsed: Sequence[Override]) -> str:
    for ov in reversed(parsed):
        if tuple(path[: len(ov.path)]) == ov.path or ov.path[: len(path)] == tuple(path):
            return ov.origin
    if not is_key and path and path not in source.value_marks:
        # A missing field or a cross-field rule: point at the field's key, else its section.
        return source.where(path, key=True)
    return source.where(path, key=is_key)


def _dotted(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _message(err: Any, path: Path_) -> str:
    kind = err["type"]
    msg = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if kind == "extra_forbidden":
        allowed = fields_at(tuple(str(p) for p in path[:-1] if isinstance(p, str)))
        hint = f"valid: {', '.join(allowed)}" if allowed else "remove it"
        return f"unknown field ({hint})"
    if kind == "missing":
        return "required field is missing (add it)"
    if kind in ("value_error", "assertion_error"):
        return msg
    shown = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    hint = f"got {shown}"
    if kind == "float_type" and isinstance(value, str) and _looks_numeric(value):
        hint += "; YAML reads 1e-3 as text, write 1.0e-3"
    elif kind in ("int_type", "float_type", "bool_type") and isinstance(value, str):
        hint += "; write the value without quotes"
    return f"{msg} ({hint})"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _control_chars(data: Any, source: Source, parsed: Sequence[Override]) -> list[str]:
    found: list[str] = []

    def walk(node: Any, path: Path_) -> None:
        if isinstance(node, str) and CONTROL_RE.search(node):
            where = _where(path, False, source, parsed)
            found.append(
                f"{where}: {_dotted(path)}: contains a newline or control character "
                "(values must be one line of printable text)"
            )
        elif isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, (*path, str(k)))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, (*path, i))

    walk(data, ())
    return found


# -- field lookup (unknown-field hints, sweep keys) ----------------------------------------------
def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(model class inside ``annotation``, whether it is a dict of them / of values)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            model, is_dict = _model_of(arg)
            if model is not None or is_dict:
                return model, is_dict
        return None, False
    if origin is dict:
        return None, True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _field_names(model: type[BaseModel]) -> dict[str, str]:
    """YAML key -> field name, aliases included (e.g. checkpoint ``async``)."""
    names: dict[str, str] = {}
    for name, info in model.model_fields.items():
        names[name] = name
        alias = info.validation_alias
        for choice in getattr(alias, "choices", [alias] if isinstance(alias, str) else []):
            if isinstance(choice, str):
                names[choice] = name
    return names


def resolve_field(path: Iterable[str]) -> tuple[bool, list[str]]:
    """Whether ``path`` names a field of JobSpec; else the valid names where it went wrong."""
    model: type[BaseModel] | None = JobSpec
    free = False
    for part in path:
        if free:
            return True, []
        if model is None:
            return False, []
        names = _field_names(model)
        if part not in names:
            return False, sorted(model.model_fields)
        model, free = _model_of(model.model_fields[names[part]].annotation)
    return True, []


def fields_at(path: tuple[str, ...]) -> list[str]:
    """The valid field names of the section at ``path`` (empty when unknown)."""
    model: type[BaseModel] | None = JobSpec
    for part in path:
        if model is None:
            return []
        names = _field_names(model)
        if part not in names:
            return []
        model, _ = _model_of(model.model_fields[names[part]].annotation)
    return sorted(model.model_fields) if model is not None else []


# -- sweeps -------------------------------------------------------------------------------------
def _expand(
    spec: JobSpec, data: dict[str, Any], source: Source, parsed: Sequence[Override]
) -> list[Task]:
    if spec.sweep is None:
        return [Task(0, {}, spec)]
    grid = spec.sweep.grid
    problems: list[str] = []
    for key in grid:
        where = _where(("sweep", "grid", key), True, source, parsed)
        exists, valid = resolve_field(key.split("."))
        if not exists:
            hint = f"valid here: {', '.join(valid)}" if valid else "check the path"
            problems.append(f"{where}: sweep.grid.{key}: no such field ({hint})")
        elif not key.startswith(SWEEPABLE):
            problems.append(
                f"{where}: sweep.grid.{key}: cannot vary inside one job array, all tasks share one "
                "sbatch script (sweep train.*, entrypoint.* or requeue.max_*; submit separate "
                "specs for other fields)"
            )
    if spec.sweep.size > MAX_ARRAY:
        where = _where(("sweep", "grid"), True, source, parsed)
        problems.append(
            f"{where}: sweep.grid: {spec.sweep.size} points is more than {MAX_ARRAY} "
            "(Slurm's MaxArraySize); split the sweep"
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
            lines = _lines(exc, point, source, parsed, f"(sweep point {label}) ")
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
                where = source.where(("sweep", "grid", key, idx))
                return where + line[line.index(": ") :]
    return line
