"""The records a run leaves, each read through one typed schema (torch-free, stdlib only).

Every JSON-lines record (``events.jsonl``, ``metrics.jsonl``, the run index) and every JSON
record file (``run.json``, ``local_state.json``) is read here, or checked against a
:class:`Schema` here, before anything uses it. A record that does not fit (a line that does not
parse, a foreign or damaged object: an event without ``event``, ``nodes`` a number, a NaN time
or step, a string step, a list where an object belongs) is skipped, and :func:`report` says so in
ONE line per file on stderr (once per new problem, however often a follower re-reads it). One
bad record never costs the others, and never a traceback.

A schema names the fields readers use and their types; ``None`` counts as absent for an
optional field, and fields it does not name are kept as they are (a newer writer's). A schema
may type some fields differently for one kind of record (``by`` names the field that says which
kind; ``!`` marks a field that kind must have).

Types: ``str``, ``bool``, ``int`` (not a bool), ``count`` (an int >= 0), ``time`` (a finite
number >= 0), ``number`` (finite), ``float`` (any number, NaN included: a diverged loss is a
fact), ``dict``, ``list``, ``list[str]``, ``list[int]``, ``list[dict]``, and ``A|B``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "EVENT",
    "METRIC",
    "Schema",
    "check_lines",
    "fitting",
    "read_jsonl_checked",
    "read_records",
    "report",
]


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_TYPES: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "time": lambda v: _num(v) and math.isfinite(v) and v >= 0,
    "number": lambda v: _num(v) and math.isfinite(v),
    "float": _num,
    "dict": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "list[int]": lambda v: isinstance(v, list) and all(_TYPES["int"](x) for x in v),
    "list[dict]": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
}
_WORDS = {
    "str": "text",
    "bool": "true or false",
    "int": "a whole number",
    "count": "a whole number >= 0",
    "time": "a finite time >= 0",
    "number": "a finite number",
    "float": "a number",
    "dict": "an object",
    "list": "a list",
    "list[str]": "a list of text",
    "list[int]": "a list of whole numbers",
    "list[dict]": "a list of objects",
}


def _fits(value: Any, kind: str) -> bool:
    return any(_TYPES[k](value) for k in kind.split("|"))


def _words(kind: str) -> str:
    return " or ".join(_WORDS[k] for k in kind.split("|"))


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class Schema:
    """The fields of one record kind that readers rely on, with their types."""

    kind: str
    required: Mapping[str, str]
    optional: Mapping[str, str] = field(default_factory=dict)
    # Records whose ``by`` field has one of these values: their own types for some fields.
    by: str = ""
    variants: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        every = [*self.required.values(), *self.optional.values()]
        every += [k.lstrip("!") for v in self.variants.values() for k in v.values()]
        for kind in every:
            for part in kind.split("|"):
                if part not in _TYPES:
                    raise ValueError(f"schema {self.kind}: unknown type {part!r}")

    def problem(self, record: Any) -> str | None:
        """Why ``record`` does not fit (one short phrase), or None when it does."""
        if not isinstance(record, dict):
            return f"not a JSON object ({type(record).__name__})"
        for name, kind in self.required.items():
            if name not in record or record[name] is None:
                return f"{name}: missing"
            if not _fits(record[name], kind):
                return f"{name}: expected {_words(kind)}, got {_shown(record[name])}"
        optional = self.optional
        variant = self.variants.get(record[self.by]) if self.by else None
        if variant:
            optional = {**optional, **variant}
        for name, kind in optional.items():
            value = record.get(name)
            if kind.startswith("!"):  # required in this variant
                kind = kind[1:]
                if value is None:
                    return f"{name}: missing (a {record[self.by]} record has one)"
            if value is not None and not _fits(value, kind):
                return f"{name}: expected {_words(kind)}, got {_shown(value)}"
        return None


# RUN_DIR/events.jsonl (train/history.py writes it): what status, follow, plot, drills and the
# budgets read of an event.
EVENT = Schema(
    "event",
    required={"event": "str"},
    optional={
        "time": "time",
        "step": "count",
        "restart_count": "count",
        "job_id": "str|int",
        "reason": "str",
        "nodes": "list[str]|count",  # hosts; a count in start/resume events of older runs
        "ranks": "list[int]",
        "error": "str",
        "signal": "str|int",
        "received_at": "time",
        "via": "str",
        "test_accuracy": "float",
        "stderr_tail": "list[str]",
        "traceback": "list[str]",  # a failure in training: the last lines of its traceback
        "skipped": "str",
        "exit_code": "int",
        "first_output_at": "time",  # a command's first write in this process run
        "exited_at": "time",  # a command's requeue: when rank 0 saw every rank's command gone
        # the stop's facts and decision (train.stop.act.record)
        "kind": "str",
        "action": "str",
        "failure_class": "str",
        "cause": "str",  # the rule that sorted a failure (train.stop.causes)
        "signature": "str",  # a failure's exception and location: a deterministic crash
        "root_rank": "count",  # the rank whose failure was the root (its cascade on others)
        "cascade": "dict",  # this rank's own failure when it was the root's cascade
        "observed": "list[dict]",  # a hang: what the watcher saw of each rank
        "by": "str",  # who recorded it (rank, batch_script)
        "tries": "count",
        "then": "str",
        "after": "str",  # restart_in_place: the event it follows
        "in_place": "count",
        "next_in_place": "count",
        "submission": "str",  # the local executor's submission (local-N)
        "exact": "bool",
        "reported_step": "count",  # a command's restart: the step it had reported
        "config_changed": "list[str]",
    },
    by="event",
    # where readers name the hosts
    variants={
        **{e: {"nodes": "list[str]"} for e in ("hang", "node_fail", "quarantine")},
        "budget_exhausted": {"reason": "!str"},  # why the run stopped: what status says
    },
)
# RUN_DIR/metrics.jsonl (train/loop/metrics.py, rank 0).
METRIC = Schema(
    "metric",
    required={"kind": "str"},
    optional={
        "time": "time",
        "step": "count",
        "epoch": "count",
        "loss": "float",
        "accuracy": "float",
        "test_loss": "float",
        "test_accuracy": "float",
        "lr": "float",
        "images_per_s": "float",
        "seconds": "float",
        "blocking_s": "float",
        "scalars": "dict",  # a train.report line: the user's own numbers
    },
)


def read_jsonl_checked(path: str | Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The JSON objects of a JSON-lines file, oldest first, and the (1-based) numbers of the
    complete lines skipped as damaged (a torn or foreign line, a bad byte, not an object). An
    unterminated last line that does not parse is a line still being written: skipped, not
    reported. A missing file has none."""
    try:
        data = Path(path).read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return [], []
    out: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, record in check_lines(data.split(b"\n")):
        if record is not None:
            out.append(record)
        elif number > 0:
            bad.append(number)
    return out, bad


def check_lines(lines: list[bytes]) -> list[tuple[int, dict[str, Any] | None]]:
    """(line number, object or None) for each non-blank line; the last piece (no newline
    after it) that does not parse gets number 0: still being written, not damage."""
    out: list[tuple[int, dict[str, Any] | None]] = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))  # UnicodeDecodeError is a ValueError
        except (ValueError, RecursionError):
            record = None
        if isinstance(record, dict):
            out.append((number, record))
        else:
            out.append((number if number < len(lines) else 0, None))
    return out


def read_records(path: str | Path, schema: Schema) -> list[dict[str, Any]]:
    """The records of a JSON-lines file that fit ``schema``, oldest first; the others are
    skipped and reported (:func:`report`, one line per file)."""
    try:
        data = Path(path).read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return []
    return fitting(check_lines(data.split(b"\n")), schema, path)


def fitting(
    lines: list[tuple[int, dict[str, Any] | None]], schema: Schema, path: str | Path
) -> list[dict[str, Any]]:
    """The records of :func:`check_lines` that fit ``schema``; the others are reported."""
    good: list[dict[str, Any]] = []
    problems: list[tuple[int, str]] = []
    for number, record in lines:
        why = "not a JSON object" if record is None else schema.problem(record)
        if why is None and record is not None:
            good.append(record)
        elif number > 0:  # number 0: the last line, still being written
            problems.append((number, why or ""))
    if problems:
        report(path, schema.kind, problems)
    return good


_reported: dict[str, int] = {}


def report(path: str | Path, kind: str, problems: list[tuple[int, str]]) -> None:
    """One line on stderr for the records of ``path`` that were skipped, when there are more
    than this process already said (a follower re-reads its files every second).

    ``problems``: (number, why); the number is the line for a file of lines, 0 for a whole file.
    """
    key = f"{path}\0{kind}"
    if len(problems) <= _reported.get(key, 0):
        return
    _reported[key] = len(problems)
    number, why = problems[0]
    where = f"line {number}: " if number else ""
    more = f"; and {len(problems) - 1} more" if len(problems) > 1 else ""
    n = len(problems)
    what = f"{n} {kind} record{'s' if n > 1 else ''}"
    print(f"warning: {path}: skipped {what} that did not fit ({where}{why}{more})", file=sys.stderr)
