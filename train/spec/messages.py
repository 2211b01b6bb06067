"""Validation errors of a spec as one line each: ``file:line:column: field.path: problem (hint)``.

Shared by ``jobs`` (the whole :class:`jobs.spec.JobSpec`) and ``python -m train --config``
(:class:`train.spec.config.RunConfig`): the same problem in the same file gives the same line on
both
paths. A problem that comes from ``--set`` points at the override (``--set k=v: field: ...``).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from train.errors import SpecError
from train.spec.load import Override, where
from train.spec.yamlsafe import Path_, Source, dotted

__all__ = ["FieldIssue", "error_lines", "fields_at", "resolve_field", "validate"]

M = TypeVar("M", bound=BaseModel)
MAX_LINES = 20

_SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$", re.ASCII)
_TYPE_NAMES = {
    "string_type": "text",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "none_required": "null",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
    "literal_error": "one of the listed values",
}


class FieldIssue(ValueError):
    """A problem that names the field (dotted, relative to the model) to change.

    ``key``: the problem is one key of the mapping field ``path`` (a bad variable name): the
    line names the field and points at that key.
    """

    def __init__(self, path: str, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.key = key


def validate(
    model: type[M], data: Any, source: Source, parsed: Sequence[Override], point: str = ""
) -> M:
    """``model.model_validate(data)``; a :class:`SpecError` with one line per problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(error_lines(exc, data, source, parsed, model, point)) from None


def error_lines(
    exc: ValidationError,
    data: Any,
    source: Source,
    parsed: Sequence[Override],
    root: type[BaseModel],
    point: str = "",
) -> list[str]:
    """One line per field in error (a union's several complaints about one value are one)."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for err in exc.errors(include_url=False):
        path, pos, is_key = _data_path(err, data)
        place = where(pos, is_key, source, parsed)
        groups.setdefault((place, dotted(path) or "(top level)"), []).append((err, path))
    out: list[str] = []
    for (place, name), errs in groups.items():
        line = f"{place}: {point}{name}: {_message([e for e, _ in errs], errs[0][1], root)}"
        if line not in out:
            out.append(line)
    if len(out) > MAX_LINES:  # ten thousand bad list items are not ten thousand lines
        more = len(out) - MAX_LINES
        out = [*out[:MAX_LINES], f"{source.filename}: ... and {more} more problems like these"]
    return out


def _data_path(err: Any, data: Any) -> tuple[Path_, Path_, bool]:
    """(field path, position path, whether the position is a key) in the YAML data."""
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
        if issue.path:
            path.extend(issue.path.split("."))
        if issue.key is not None:
            return tuple(path), (*path, issue.key), True
        return tuple(path), tuple(path), False
    return tuple(path), tuple(path), err["type"] == "extra_forbidden"


def _shown(value: Any) -> str:
    if isinstance(value, dict | list):
        return "a mapping" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(errs: list[Any], path: Path_, root: type[BaseModel]) -> str:
    if len(errs) > 1:  # a union: the branch that matched the type says it best, else list types
        chosen = [e for e in errs if e["type"] not in _TYPE_NAMES]
        if not chosen:
            kinds = list(dict.fromkeys(_TYPE_NAMES[e["type"]] for e in errs))
            text = ", ".join(kinds[:-1]) + (" or " if len(kinds) > 1 else "") + kinds[-1]
            return f"Input should be {text} (got {_shown(errs[0].get('input'))})"
        errs = chosen[:1]
    err = errs[0]
    kind = err["type"]
    msg = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if kind == "extra_forbidden":
        allowed = fields_at(root, tuple(str(p) for p in path[:-1] if isinstance(p, str)))
        hint = f"valid: {', '.join(allowed)}" if allowed else "remove it"
        return f"unknown field ({hint})"
    if kind == "missing":
        return "required field is missing (add it)"
    if kind in ("value_error", "assertion_error"):
        return msg
    hint = f"got {_shown(value)}"
    number = kind in ("int_type", "float_type") and isinstance(value, str)
    if kind == "finite_number":
        hint += "; .nan and .inf are not numbers here"
    elif number and _SEXAGESIMAL.match(value):
        hint += f"; YAML 1.2 reads {value} as text, not as {_base60(value)}: write the number"
    elif kind == "float_type" and isinstance(value, str) and _looks_numeric(value):
        hint += "; YAML reads 1e-3 as text, write 1.0e-3"
    elif kind == "bool_type" and isinstance(value, str):
        hint += "; write true or false without quotes"
    elif number and not value.isascii():
        hint += "; only the ASCII digits 0-9 make a number"
    elif number:
        hint += "; write the value without quotes"
    return f"{msg} ({hint})"


def _base60(text: str) -> str:
    total = 0.0
    for part in text.lstrip("+-").replace("_", "").split(":"):
        total = total * 60 + float(part)
    return f"{-total if text.startswith('-') else total:g}"


def _looks_numeric(text: str) -> bool:
    return bool(re.match(r"^[-+]?[0-9.]+[eE][-+]?[0-9]+$", text, re.ASCII))


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


def resolve_field(root: type[BaseModel], path: Iterable[str]) -> tuple[bool, list[str]]:
    """Whether ``path`` names a field of ``root``; else the valid names where it went wrong."""
    model: type[BaseModel] | None = root
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


def fields_at(root: type[BaseModel], path: tuple[str, ...]) -> list[str]:
    """The valid field names of the section at ``path`` (empty when unknown)."""
    model: type[BaseModel] | None = root
    for part in path:
        if model is None:
            return []
        names = _field_names(model)
        if part not in names:
            return []
        model, _ = _model_of(model.model_fields[names[part]].annotation)
    return sorted(model.model_fields) if model is not None else []
