"""Property: any mutation of a valid spec (examples/*.yaml) is accepted (exit 0) or refused in
one line per problem (exit 2); never a traceback, an internal error or a hang.

In-process through jobs.cli.main for speed; hypothesis' deadline bounds the time per example.
Memory is bounded by the loader's limits; test_refuse.py runs the worst inputs under RLIMIT_AS.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.cli import main

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
SPECS = [p.read_text() for p in EXAMPLES]

# Scalars that once changed meaning or crashed: YAML 1.1 leftovers, special floats, huge and
# Unicode numbers, YAML syntax, anchors, tags, control characters.
TRICKY = [
    "010",
    "0130",
    "0o17",
    "0x1f",
    "1_000",
    "yes",
    "No",
    "on",
    "OFF",
    "y",
    "1:00",
    "1:00:00",
    ".nan",
    ".inf",
    "-.Inf",
    "1e999",
    "99999999999999999999999",
    "\u0661\u0662",
    "\uff11",
    "",
    "~",
    "null",
    "[",
    "]",
    "{",
    "}",
    "[1, 2]",
    "{a: 1}",
    "&a x",
    "*a",
    "!!binary aGk=",
    "!!python/object:os.system",
    "'quoted'",
    '"a\\nb"',
    '"\\0"',
    "<<",
    "- x",
    "? x",
    "|",
    ">",
    "\t",
    "true",
    "0",
    "-1",
    "1.5",
    "2024-01-01",
    "banana",
    "--wrap=x",
    "a: b: c",
]
# A line to append: keys that reach scripts, reserved sbatch options, duplicate sections.
LINES = [
    "train: {}", "name: again", "launch: {sbatch_args: {arr: 1}}",
    "launch: {sbatch_args: {nodes: 2}}",
    'launch: {sbatch_args: {"a\\nb": x}}', "environment: {variables: {ON: off}}",
    "sweep: {grid: {train.seed: [1, 2]}}", "sweep: {grid: {resources.nodes: [1, 2]}}",
    "requeue: {signal: CHLD}", "resources: {time: '0-0:0:1'}", "---", "%YAML 1.1", "x: &a [*a]",
]  # fmt: skip
_VALUE = re.compile(r"^(\s*(?:- )?[A-Za-z_][\w.-]*: )(.+)$", re.MULTILINE)
_LINE = re.compile(r"^(\S.*?):\d+:\d+: \S|^--set \S")


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(st.sampled_from(SPECS))
    values = list(_VALUE.finditer(text))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["value", "line", "cut", "insert", "delete", "indent"]))
        if kind == "value" and values:
            m = draw(st.sampled_from(values))
            new = draw(st.sampled_from(TRICKY) | st.text(max_size=12))
            text = text[: m.start(2)] + new + text[m.end(2) :]
            values = list(_VALUE.finditer(text))
        elif kind == "line":
            text += "\n" + draw(st.sampled_from(LINES)) + "\n"
        elif kind == "cut":
            text = text[: draw(st.integers(0, len(text)))]
        elif kind == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.text(max_size=8)) + text[at:]
        else:
            lines = text.splitlines()
            if lines:
                i = draw(st.integers(0, len(lines) - 1))
                lines[i] = "" if kind == "delete" else " " + lines[i]
                text = "\n".join(lines) + "\n"
    sets = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["train.max_steps", "train.run_dir", "name", "resources.time"]),
                st.sampled_from(TRICKY) | st.text(max_size=6),
            ).map(lambda kv: f"{kv[0]}={kv[1]}"),
            max_size=2,
        )
    )
    return text, sets


@settings(
    max_examples=150,
    deadline=5000,  # a hang past a few seconds fails; the machine may be loaded
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutated())
def test_mutated_specs_are_accepted_or_refused_in_lines(case: tuple[str, list[str]]) -> None:
    text, sets = case
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_bytes(text.encode("utf-8", "surrogatepass"))
        old = os.environ.get("SLURM_TRAIN_STATE_DIR")
        os.environ["SLURM_TRAIN_STATE_DIR"] = str(Path(tmp) / "state")
        err = io.StringIO()
        argv = ["submit", str(spec), "--dry-run", "--runs-dir", str(Path(tmp) / "runs")]
        argv += [a for s in sets for a in ("--set", s)]
        try:
            with contextlib.redirect_stderr(err):
                code = main(argv, out=io.StringIO())
        finally:
            if old is None:
                os.environ.pop("SLURM_TRAIN_STATE_DIR", None)
            else:
                os.environ["SLURM_TRAIN_STATE_DIR"] = old
        out = err.getvalue()
        assert "Traceback" not in out and "internal error" not in out, out
        if code == 0:
            assert out == ""
            return
        assert code == 2, out
        lines = out.splitlines()
        assert 1 <= len(lines) <= 20, out
        for line in lines:  # each problem one line: file:line:column: ... or --set k=v: ...
            assert line.startswith((str(spec), "--set ")), line
            if line.startswith(str(spec) + ":"):
                assert _LINE.match(line) or ": cannot read" in line or ": the spec" in line, line
