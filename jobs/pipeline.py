"""Pipelines: stages of jobs, each a resumable run of its own, queued with Slurm dependencies.

A spec with ``stages:`` is a pipeline::

    name: cifar-pipeline
    stages:
      - name: train
        spec: cifar.yaml              # a spec file (relative to this one) ...
        set: [train.epochs=1]         # ... with --set style overrides
      - name: eval
        after: ok                     # ok: only when train COMPLETED (afterok); any: afterany
        spec:                         # ... or a job spec written here
          entrypoint: {command: [python, eval.py, --checkpoint, "${stages.train.checkpoint}"]}

``jobs submit`` submits every stage as a run of its own (its run directory, its record, its
requeue or chain: preempted, it resumes), named ``PIPELINE-STAGE``, each after the stage before
(``--dependency=afterok:JOB`` or ``afterany``). A stage takes from an earlier stage
``${stages.NAME.run_dir}`` (known at submission) and ``${stages.NAME.checkpoint}`` (the path of
its newest valid checkpoint, found when the stage starts: ``python -m train.checkpoint.dirs``;
its batch script exports ``STAGE_NAME_*``,
and a command's ``${VAR}`` is expanded from its environment). A stage that ends without
completing (a failure, a spent budget, a cancel) cancels the stages waiting on it (``afterok``)
and records why in their run directories. The pipeline is one name for ``jobs status`` (a line
per stage) and ``jobs cancel`` (every stage, the last first); ``jobs list`` lists its stages
(``PIPELINE-STAGE-...``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from jobs import records
from train.history import RunHistory
from train.spec import StrictModel

if TYPE_CHECKING:
    from cluster import Slurm
    from jobs.load import LoadedSpec

#: ``${stages.NAME.FIELD}`` in a stage's spec.
REF_RE = re.compile(r"\$\{stages\.([^}.]*)\.([^}]*)\}")
FIELDS = ("checkpoint", "run_dir")


class Stage(StrictModel):
    """One stage of a pipeline."""

    name: Annotated[
        str, Field(description="the stage's name (a-z, 0-9, _)", pattern=r"^[a-z][a-z0-9_]{0,31}$")
    ]
    spec: Annotated[
        str | dict[str, Any],
        Field(description="a spec file (relative to the pipeline's) or a job spec written here"),
    ]
    after: Annotated[
        Literal["ok", "any"],
        Field(description="ok: start when the stage before COMPLETED (afterok); any: ended"),
    ] = "ok"
    set: Annotated[list[str], Field(description="overrides of the stage's spec (as --set)")] = []  # noqa: RUF012


class PipelineSpec(StrictModel):
    """A pipeline: a name and its stages, in order."""

    name: Annotated[
        str, Field(description="the pipeline's name", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,40}$")
    ]
    stages: Annotated[list[Stage], Field(description="the stages, in order", min_length=1)]


@dataclass(frozen=True)
class LoadedStage:
    stage: Stage
    loaded: LoadedSpec
    refs: tuple[str, ...]  # the earlier stages it takes from


def _var(stage: str, what: str) -> str:
    return f"STAGE_{stage.upper()}_{what.upper()}"


def load_pipeline(
    path: Path, overrides: Sequence[str] = ()
) -> tuple[PipelineSpec, list[LoadedStage]]:
    """Read and validate a pipeline and each stage's spec (one line per problem)."""
    from jobs.errors import SpecError
    from jobs.load import load_text
    from train.spec import dump_spec, load_source, read_spec_file, validate

    text = read_spec_file(path)
    source, parsed, data = load_source(text, str(path), overrides)
    spec = validate(PipelineSpec, data, source, parsed)
    names = [s.name for s in spec.stages]
    if len(set(names)) != len(names):
        raise SpecError(f"{source.where(('stages',))}: stages: two stages share a name ({names})")
    out: list[LoadedStage] = []
    for k, stage in enumerate(spec.stages):
        label = f"{path} (stage {stage.name})"
        at = f"{source.where(('stages', k, 'spec'))}: stages.{k}.spec"
        if isinstance(stage.spec, str):
            file = Path(stage.spec) if Path(stage.spec).is_absolute() else path.parent / stage.spec
            try:
                body = read_spec_file(file)
            except SpecError as exc:
                raise SpecError(f"{at}: {exc}") from None
            label = f"{file} (stage {stage.name})"
        else:
            body = dump_spec({"name": "stage", **stage.spec})
        body, refs, problems = _references(body, names[:k], at)
        if problems:
            raise SpecError(problems)
        name = f"name={spec.name}-{stage.name}"
        loaded = load_text(body, label, [*stage.set, name], path=path)
        out.append(LoadedStage(stage, loaded, tuple(dict.fromkeys(refs))))
    return spec, out


def _references(body: str, earlier: list[str], at: str) -> tuple[str, list[str], list[str]]:
    """``${stages.NAME.FIELD}`` in a stage's text as the variable its script exports; the
    stages it names, and one line per reference that names no earlier stage or field."""
    refs: list[str] = []
    problems: list[str] = []

    def swap(m: re.Match[str]) -> str:
        name, what = m.group(1), m.group(2)
        if name not in earlier or what not in FIELDS:
            problems.append(
                f"{at}: {m.group(0)}: takes ${{stages.NAME.FIELD}} of an earlier stage "
                f"({', '.join(earlier) or 'none'}), FIELD one of {', '.join(FIELDS)}"
            )
            return m.group(0)
        refs.append(name)
        return f"${{{_var(name, what)}}}"

    return REF_RE.sub(swap, body), refs, problems


def _with_inputs(loaded: LoadedSpec, refs: Sequence[str], dirs: Mapping[str, Path]) -> LoadedSpec:
    """The stage's spec with what it takes from earlier stages in its environment: each one's
    run directory (a variable) and last checkpoint (found when the stage starts)."""
    if not refs:
        return loaded
    from jobs.executor import safe_python  # -P, as every python line of the script

    exe = safe_python()
    variables = {_var(r, "run_dir"): str(dirs[r]) for r in refs}
    setup = [
        f'export {_var(r, "checkpoint")}="$({exe} -m train.checkpoint.dirs '
        f'{shlex.quote(str(dirs[r]))})"'
        for r in refs
    ]

    def moded(spec: Any) -> Any:
        env = spec.environment
        new = env.model_copy(
            update={"variables": {**env.variables, **variables}, "setup": [*setup, *env.setup]}
        )
        return spec.model_copy(update={"environment": new})

    tasks = [replace(t, spec=moded(t.spec)) for t in loaded.tasks]
    return replace(loaded, spec=moded(loaded.spec), tasks=tasks)


def _with_stage_end(loaded: LoadedSpec, run_dir: Path) -> LoadedSpec:
    """The stage's script ends with ``python -m jobs.pipeline stage-end`` (the stages waiting on
    it cancelled when it ends without completing); a chain's link-end does it for a chain."""
    from jobs.executor import safe_python  # -P, as every python line of the script

    exe = safe_python()
    lines = [
        "stage_end() {",
        "  stage_rc=$?",
        f"  {exe} -m jobs.pipeline stage-end {shlex.quote(str(run_dir))} "
        '--job-id "$SLURM_JOB_ID" --exit-code "$stage_rc"',
        "}",
        "trap stage_end EXIT",
    ]

    def moded(spec: Any) -> Any:
        env = spec.environment
        return spec.model_copy(
            update={"environment": env.model_copy(update={"setup": [*env.setup, *lines]})}
        )

    tasks = [replace(t, spec=moded(t.spec)) for t in loaded.tasks]
    return replace(loaded, spec=moded(loaded.spec), tasks=tasks)


def plan_pipeline(
    spec: PipelineSpec, stages: list[LoadedStage], root: Path
) -> tuple[str, list[tuple[LoadedStage, records.Plan]]]:
    """The pipeline's id and each stage's run directory, with its inputs in its environment."""
    from jobs.submit import make_plan

    pipeline_id = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(4).hex()}"
    plans = [make_plan(s.loaded, root) for s in stages]
    dirs = {s.stage.name: p.run_dir for s, p in zip(stages, plans, strict=True)}
    out = []
    for k, (s, p) in enumerate(zip(stages, plans, strict=True)):
        loaded = _with_inputs(s.loaded, s.refs, dirs)
        if k < len(stages) - 1 and not loaded.is_array:
            # (a sweep's tasks end one by one: the stage after it waits on every array with
            # afterok, which Slurm never meets when a task failed: DependencyNeverSatisfied)
            loaded = _with_stage_end(loaded, p.run_dir)
        out.append((replace(s, loaded=loaded), p))
    return pipeline_id, out


def dry_run_pipeline(path: Path, overrides: Sequence[str], root: Path) -> str:
    """Every stage's script, each under a header naming it and what it waits for."""
    from jobs.submit import dry_run

    spec, stages = load_pipeline(path, overrides)
    _, planned = plan_pipeline(spec, stages, root)
    parts = []
    for k, (s, plan) in enumerate(planned):
        wait = "" if k == 0 else f" (after the stage before: {s.stage.after})"
        parts.append(f"# ==== stage {s.stage.name}{wait}\n{dry_run(s.loaded, plan)}")
    return "\n".join(parts)


def submit_pipeline(
    path: Path, overrides: Sequence[str], client: Slurm, root: Path, *, preflight: bool = True
) -> list[records.RunRecord]:
    """Submit every stage (each after the stage before); a stage refused cancels the ones
    already submitted. Returns the stages' records."""
    from cluster import ClusterError
    from jobs.submit import submit

    spec, stages = load_pipeline(path, overrides)
    pipeline_id, planned = plan_pipeline(spec, stages, root)
    done: list[records.RunRecord] = []
    try:
        for s, plan in planned:
            after = []
            if done:
                kind = "afterok" if s.stage.after == "ok" else "afterany"
                after = [f"--dependency={kind}:{':'.join(done[-1].slurm_job_ids())}"]
            record = submit(s.loaded, plan, client, "slurm", preflight=preflight, after=after)
            record.pipeline, record.stage = pipeline_id, s.stage.name
            records.save_record(record)
            if done:
                done[-1].dependents, done[-1].dependents_after = [record.job_id], s.stage.after
                records.save_record(done[-1])
            done.append(record)
    except BaseException:
        for record in reversed(done):
            with contextlib.suppress(ClusterError):
                client.cancel(record.slurm_job_ids()[::-1], no_requeue=True)
        raise
    return done


# -- inside the allocation ------------------------------------------------------------------
def stage_end(run_dir: Path, job_id: str, exit_code: int, client: Slurm | None = None) -> None:
    """A (non-chain) stage's batch script exits: completed, over without completing (its
    dependents cancelled), or requeued (nothing to do)."""
    from jobs.dependents import release_dependents, unfinished

    record = records.load_record(run_dir)
    events = RunHistory(run_dir).events()
    completed = any(e.get("event") == "complete" for e in events)
    release_dependents(record, job_id, completed, unfinished(events), client)


# -- one name for the pipeline ----------------------------------------------------------------
def find_pipeline(query: str) -> list[records.RunRecord]:
    """The stages of the newest pipeline named ``query`` (or with that id), in order; [] when
    no pipeline has that name. Reads only the index and the records of runs whose name is
    ``QUERY-STAGE`` (a damaged one is skipped here: ``find_run`` reports it)."""
    from jobs.errors import RunNotFoundError

    m = re.fullmatch(r"(.+)-\d{8}-\d{6}-[0-9a-f]+", query)
    name = m.group(1) if m else query
    found: dict[str, list[records.RunRecord]] = {}
    for entry in reversed(records.read_index(report=False)):
        if not str(entry.get("name", "")).startswith(f"{name}-"):
            continue
        try:
            record = records.load_record(entry["run_dir"])
        except RunNotFoundError:
            continue
        pid = record.pipeline
        if not pid or (m is not None and pid != query):
            continue
        if m is None and not re.fullmatch(rf"{re.escape(name)}-\d{{8}}-\d{{6}}-[0-9a-f]+", pid):
            continue
        if found and pid not in found:
            break  # an older pipeline of the same name
        found.setdefault(pid, []).append(record)
    stages = next(iter(found.values()), [])
    return sorted(stages, key=lambda r: r.submitted_at)


def main(argv: list[str] | None = None) -> int:
    """``python -m jobs.pipeline stage-end RUN_DIR --job-id ID --exit-code N``: a stage's batch
    script at its exit."""
    p = argparse.ArgumentParser(prog="python -m jobs.pipeline")
    p.add_argument("what", choices=("stage-end",))
    p.add_argument("run_dir", type=Path)
    p.add_argument("--job-id", default="")
    p.add_argument("--exit-code", type=int, default=0)
    ns = p.parse_args(argv)
    try:
        stage_end(ns.run_dir, ns.job_id, ns.exit_code)
    except Exception as exc:  # the batch script goes on
        print(f"jobs.pipeline: {ns.what}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
