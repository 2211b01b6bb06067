"""Fill ``sbatch_templates/NAME.sbatch`` for a spec (``jobs submit --dry-run --template NAME``).

The templates are plain scripts people copy and submit by hand. Rendering keeps them as they are
and only replaces two marked blocks, so the hand path and the command-line path launch training
the same way:

    # >>> sbatch options ...   the #SBATCH lines, from ``spec.resources``/``launch.sbatch_args``,
    # <<< sbatch options         ``requeue.signal``/``signal_delay_s`` and ``name``
    # >>> filled in ...          the spec's path, this checkout as PROJECT_DIR, ``--set`` options
    # <<< filled in              for whatever differs from the file (command-line overrides), srun
                                 options from ``launch``, the exported ``environment.variables``
                                 and ``environment.setup`` lines (``array``: one case per task)

Quoting: values on ``#SBATCH`` lines are written as sbatch's own parser reads them (double quotes,
backslash escapes); values in shell code go through :func:`shlex.quote`. Newlines and other
control characters are refused, so no value can end a comment line and start a command.
This module never imports torch.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.errors import SpecError, UsageError
from jobs.render import array_option, env_text, slurm_options
from train.errors import ConfigError
from train.spec import load_run_config, set_text

if TYPE_CHECKING:
    from jobs.load import LoadedSpec, Task
    from jobs.spec import JobSpec

__all__ = [
    "TEMPLATES_DIR",
    "TEMPLATE_NAMES",
    "render_template",
    "sbatch_options",
    "sbatch_quote",
    "template_path",
]

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TEMPLATES_DIR = PROJECT_ROOT / "sbatch_templates"
TEMPLATE_NAMES = ("ddp", "dataparallel", "requeue", "array")

_SBATCH_BEGIN = "# >>> sbatch options"
_SBATCH_END = "# <<< sbatch options"
_FILL_BEGIN = "# >>> filled in"
_FILL_END = "# <<< filled in"
# Characters sbatch's #SBATCH parser takes literally outside quotes (no space, quote, \ or #).
_SBATCH_PLAIN_RE = re.compile(r"^[A-Za-z0-9_.,:=/@%+\-\[\]&|*()!^~]+$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# Options the templates carry themselves, below the filled-in block.
_TEMPLATE_FIXED = ("requeue",)
# Sections of a spec that `python -m train` reads (and so can take as --set overrides).
_TRAIN_SECTIONS = ("train", "requeue", "entrypoint")


def template_path(name: str) -> Path:
    """The template file for ``name``; UsageError naming the choices for an unknown one."""
    if name not in TEMPLATE_NAMES:
        raise UsageError(
            f"--template {name!r}: no such template (choose one of {', '.join(TEMPLATE_NAMES)})"
        )
    path = TEMPLATES_DIR / f"{name}.sbatch"
    if not path.is_file():
        raise UsageError(f"--template {name}: {path} is missing (run from a full checkout)")
    return path


def _no_control(value: str, field: str) -> str:
    if _CONTROL_RE.search(value):
        raise SpecError([f"{field}: {value!r} contains a newline or control character"])
    return value


def sbatch_quote(value: str, field: str = "value") -> str:
    """``value`` as one argument on an ``#SBATCH`` line (sbatch's parser, not the shell's)."""
    _no_control(value, field)
    if _SBATCH_PLAIN_RE.match(value):
        return value
    # Inside quotes sbatch still treats backslash as an escape, and '#' loses its comment meaning.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_options(
    name: str, spec: JobSpec, tasks: Sequence[Task] | None = None
) -> list[tuple[str, str | None]]:
    """The ``(option, value)`` pairs (value None: a flag) of the #SBATCH block for ``name``.

    The options are :func:`jobs.render.slurm_options`' (the submitit path's), adjusted only
    where a template launches differently: ``dataparallel`` is one task, ``requeue`` traps the
    signal in the batch shell (``B:``), ``array`` adds ``--array`` for ``tasks``.
    """
    res = spec.resources
    if name == "dataparallel" and res.max_nodes != 1:
        raise UsageError(
            f"--template dataparallel runs one task on one node but resources.nodes is "
            f"{res.nodes} (set nodes: 1, or use --template ddp)"
        )
    if name == "array":
        if spec.sweep is None or tasks is None:
            raise UsageError(
                "--template array needs a `sweep:` section in the spec (or submit "
                "sbatch_templates/array.sbatch by hand with a directory of specs or SWEEP_FILE)"
            )
    elif spec.sweep is not None:
        raise UsageError(
            f"--template {name} runs one configuration but the spec has a sweep: section "
            "(use --template array, or remove the sweep)"
        )
    opts: list[tuple[str, str | None]] = []
    for key, value in slurm_options(spec).sbatch:
        if key in _TEMPLATE_FIXED:
            continue
        if name == "dataparallel" and key == "ntasks-per-node":
            opts += [("ntasks", "1"), ("ntasks-per-node", "1")]
            continue
        if key == "signal" and name == "requeue":
            value = f"B:{value}"
        opts.append((key, value))
        if key == "signal" and name == "array" and spec.sweep is not None and tasks is not None:
            opts.append(("array", array_option(len(tasks), spec.sweep.max_parallel)))
    return opts


def _sbatch_block(name: str, spec: JobSpec, tasks: Sequence[Task] | None) -> list[str]:
    lines = [f"{_SBATCH_BEGIN} (from the spec by `python -m jobs submit --dry-run`)"]
    for key, value in sbatch_options(name, spec, tasks):
        if value is None:
            lines.append(f"#SBATCH --{key}")
        else:
            lines.append(f"#SBATCH --{key}={sbatch_quote(value, key)}")
    lines.append(_SBATCH_END)
    return lines


def _set_value(value: Any) -> str:
    # What train's --set parser reads back as this value ("1" stays text, 1e-05 is 1.0e-05).
    return set_text(value)


def _leaves(data: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(data, Mapping) and data:
        for key, value in data.items():
            yield from _leaves(value, f"{prefix}.{key}")
    else:
        yield prefix, data


def spec_overrides(spec: JobSpec, spec_path: Path) -> list[str]:
    """``--set`` items that make train see ``spec`` although it reads ``spec_path``.

    ``spec`` may carry command-line overrides the file does not: every train/requeue/entrypoint
    leaf whose value differs from what train would read from the file becomes one ``--set``.
    """
    try:
        base = load_run_config(spec_path)
        base_data: dict[str, Any] = {s: getattr(base, s) for s in _TRAIN_SECTIONS}
    except ConfigError:
        base_data = {}  # train would fail on the file alone: state every value explicitly
    out: list[str] = []
    for section in _TRAIN_SECTIONS:
        model = getattr(spec, section)
        if model is None:
            continue
        new = dict(_leaves(model.model_dump(mode="json"), section))
        old_model = base_data.get(section)
        old = dict(_leaves(old_model.model_dump(mode="json"), section)) if old_model else {}
        for key, value in new.items():
            if key not in old or old[key] != value:
                out.append(f"{key}={_set_value(value)}")
    return out


def _sweep_tasks(tasks: Sequence[Task]) -> list[tuple[int, list[str]]]:
    """``--set`` items per array task, from :mod:`jobs.load`'s one sweep expansion."""
    return [
        (task.index, [f"{k}={_set_value(v)}" for k, v in task.values.items()]) for task in tasks
    ]


def _set_args(items: Sequence[str], field: str) -> str:
    return " ".join(f"--set {shlex.quote(_no_control(item, field))}" for item in items)


def _fill_block(
    name: str, spec: JobSpec, spec_path: Path, tasks: Sequence[Task] | None
) -> list[str]:
    lines = [f"{_FILL_BEGIN} by `python -m jobs submit --dry-run` from {spec.name}"]
    lines.append(f"DEFAULT_CONFIG={shlex.quote(_no_control(str(spec_path), 'spec path'))}")
    # The checkout this jobs runs from, as the submitit path uses it: the script then works
    # wherever it is submitted from (an exported PROJECT_DIR still wins).
    root = shlex.quote(_no_control(str(PROJECT_ROOT), "project directory"))
    lines.append(f'if [[ -z "${{PROJECT_DIR:-}}" ]]; then PROJECT_DIR={root}; fi')
    overrides = _set_args(spec_overrides(spec, spec_path), "--set")
    lines.append(f"spec_overrides=({overrides})")
    srun = " ".join(shlex.quote(_no_control(o, "launch")) for o in slurm_options(spec).srun)
    lines.append(f"srun_options=({srun})")
    if name == "array" and tasks is not None:
        lines.append("sweep_task() {  # one case per combination of sweep.grid")
        lines.append('  case "$1" in')
        for i, items in _sweep_tasks(tasks):
            lines.append(f"    {i}) sweep_args=({_set_args(items, 'sweep.grid')}) ;;")
        lines.append('    *) echo "[array.sbatch] the sweep has no task $1" >&2; exit 2 ;;')
        lines.append("  esac")
        lines.append("}")
    for key, value in spec.environment.variables.items():
        text = _no_control(env_text(value), f"environment.variables.{key}")
        lines.append(f"export {key}={shlex.quote(text)}")
    if spec.environment.setup:
        lines.append("# environment.setup (shell lines from the spec, run as written):")
        for i, line in enumerate(spec.environment.setup):
            if _CONTROL_RE.search(line.replace("\t", " ")):
                raise SpecError([f"environment.setup[{i}]: one line per item (no newlines)"])
            lines.append(line)
    lines.append(_FILL_END)
    return lines


def _replace_block(text: str, begin: str, end: str, new: list[str], name: str) -> str:
    lines = text.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith(begin))
        stop = next(i for i in range(start, len(lines)) if lines[i].startswith(end))
    except StopIteration:
        raise UsageError(f"template {name}: marker {begin!r} ... {end!r} not found") from None
    return "\n".join([*lines[:start], *new, *lines[stop + 1 :]]) + "\n"


def render_template(name: str, spec: LoadedSpec | JobSpec, spec_path: Path) -> str:
    """The template ``name`` filled in for ``spec`` (read from ``spec_path``), ready for sbatch.

    ``--template array`` needs the :class:`~jobs.load.LoadedSpec` (its ``tasks`` are the sweep's
    points). Raises UsageError for an unknown template or one that does not fit the spec,
    SpecError for a value that cannot be written safely (newlines, control characters).
    """
    from jobs.load import LoadedSpec

    tasks = spec.tasks if isinstance(spec, LoadedSpec) else None
    job = spec.spec if isinstance(spec, LoadedSpec) else spec
    path = template_path(name)
    text = path.read_text(encoding="utf-8")
    spec_path = Path(spec_path).resolve()
    text = _replace_block(text, _SBATCH_BEGIN, _SBATCH_END, _sbatch_block(name, job, tasks), name)
    fill = _fill_block(name, job, spec_path, tasks)
    return _replace_block(text, _FILL_BEGIN, _FILL_END, fill, name)
