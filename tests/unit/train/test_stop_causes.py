"""Failures sorted by cause (issue 26): the built-in table, the spec's own rules first, and
what the batch script does after a step (train.stop.step.after_step)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster.errors import BadInputError
from cluster.models import Node, Partition
from train.history import RunHistory
from train.spec.config import RequeueConfig, load_run_config
from train.stop.causes import classify, rules_of
from train.stop.step import after_step, main

CASES = [
    # (text(s), class)
    ("ModuleNotFoundError: No module named 'foo'", "user"),
    ("command exited 1: ImportError: cannot import name 'x' from 'y'", "user"),
    ('  File "train.py", line 3\nSyntaxError: invalid syntax', "user"),
    ("NameError: name 'modle' is not defined", "user"),
    ("SpecError: spec.yaml:3:5: train.lr: unknown field", "user"),
    ("ValueError: non-finite loss at step 120", "user"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
     "Connection closed by peer [127.0.0.1]:1234", "infra"),
    ("RuntimeError: Connection reset by peer", "infra"),
    ("torch.distributed.DistBackendError: NCCL error in: ..., "
     "remote process exited or there was a network error", "infra"),
    ("RuntimeError: [/gloo/transport/tcp/unbound_buffer.cc:81] "
     "Timed out waiting 5000ms for recv operation to complete", "infra"),
    ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)", "infra"),
    ("CUDA error: uncorrectable ECC error encountered", "infra"),
    # a kill with no other evidence: the user's own OOM kill as likely as the machine's
    ("step exited 137 (killed by signal 9) without a record from its ranks", "unknown"),
    ("command killed by SIGKILL", "unknown"),
    ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=12.0", "user"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "user"),
    # the node, not the code: its driver, its mounts
    ("ImportError: libcuda.so.1: cannot open shared object file: No such file or directory",
     "infra"),
    ("ModuleNotFoundError: No module named 'torch'", "infra"),
    ("ModuleNotFoundError: No module named 'torch.distributed'", "infra"),
    ("RuntimeError: Found no NVIDIA driver on your system.", "infra"),
    # a harmless warning naming an error is no exception line
    ("UserWarning: failed to load image Python extension (ImportError)", "unknown"),
    ("ZeroDivisionError: division by zero", "unknown"),
    ("command exited 3", "unknown"),
    (None, "unknown"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_the_built_in_table(text: str | None, expected: str) -> None:
    assert classify([text])[0] == expected


def test_the_stderr_tail_counts_too() -> None:
    tail = ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'x'"]
    assert classify(["command exited 1", tail]) == (
        "user",
        "an error in the code (rule code_error: ModuleNotFoundError: No module named 'x')",
    )


def test_the_specs_rules_come_first() -> None:
    config = RequeueConfig.model_validate(
        {"failure_rules": [{"match": "CUDA out of memory", "cause": "user"},
                           {"match": "ZeroDivision", "cause": "infra"}]}
    )  # fmt: skip
    rules = rules_of(config.failure_rules)
    assert classify(["RuntimeError: CUDA out of memory. Tried"], rules)[0] == "user"
    assert classify(["ZeroDivisionError"], rules) == (
        "infra",
        "requeue.failure_rules: 'ZeroDivision' (rule requeue.failure_rules[1]: ZeroDivisionError)",
    )
    assert classify(["ImportError: x"], rules)[0] == "user"  # the built-in table still applies


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({"match": "(", "cause": "user"}, "requeue.failure_rules[0].match"),
        ({"match": "x", "cause": "sometimes"}, "requeue.failure_rules[0].cause"),
        ({"match": "", "cause": "user"}, "requeue.failure_rules[0].match"),
        ({"match": "x"}, "requeue.failure_rules[0].cause"),
    ],
)
def test_a_bad_rule_is_one_line_naming_the_field(
    tmp_path: Path, rule: dict[str, Any], field: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"requeue": {"failure_rules": [rule]}}))
    with pytest.raises(BadInputError) as err:
        load_run_config(spec)
    assert field in str(err.value) and "\n" not in str(err.value)


# -- after a step -----------------------------------------------------------------------------
BUDGETS = RequeueConfig(max_restarts_in_place=2)


def _append(run: Path, event: str, **fields: Any) -> None:
    RunHistory(run).append(event, step=5, restart_count=0, job_id="7", **fields)


def test_a_decided_restart_is_carried_out(tmp_path: Path) -> None:
    _append(tmp_path, "failure", action="restart_in_place", failure_class="infra")
    assert (
        after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=0, exit_code=1) is None
    )
    last = RunHistory(tmp_path).events()[-1]
    assert last["event"] == "restart_in_place" and last["next_in_place"] == 1
    # the same step asked again: already carried out, the script ends
    assert after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=0, exit_code=1) == 1


def test_a_step_that_died_without_a_record_is_decided_here(tmp_path: Path) -> None:
    code = after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=0, exit_code=137,
                      client=_NoSlurm())  # fmt: skip
    assert code is None
    failure, restart = RunHistory(tmp_path).events()[-2:]
    assert failure["event"] == "failure" and failure["failure_class"] == "unknown"
    assert "step exited 137" in failure["error"] and restart["event"] == "restart_in_place"


def test_restarts_in_place_stop_at_their_budget_then_the_job_is_requeued(tmp_path: Path) -> None:
    client = _NoSlurm()
    for n in range(2):
        assert after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=n,
                          exit_code=137, client=client) is None  # fmt: skip
    code = after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=2, exit_code=137,
                      client=client)  # fmt: skip
    assert code == 1 and client.requeued == ["7"]
    names = [e["event"] for e in RunHistory(tmp_path).events()]
    assert names.count("restart_in_place") == 2 and names[-1] == "requeue", names


def test_a_step_that_died_with_a_node_of_its_allocation_is_a_node_failure(tmp_path: Path) -> None:
    """The step died and n1 is down before Slurm requeued the job (its batch script lived on):
    not the training's failure and no restart in place on a lost node; requeued off n1."""
    client = _NoSlurm(down={"n1": "down*"})
    code = after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=0, exit_code=137,
                      hosts=("n1", "n2", "n3"), client=client)  # fmt: skip
    assert code == 137 and client.requeued == ["7"] and client.excluded == [["n1"]]
    names = [e["event"] for e in RunHistory(tmp_path).events()]
    assert names == ["node_fail", "requeue", "quarantine"], names
    failed = RunHistory(tmp_path).events()[0]
    assert failed["nodes"] == ["n1"] and failed["states"] == {"n1": "down*"}, failed


def test_a_draining_node_is_no_node_failure(tmp_path: Path) -> None:
    client = _NoSlurm(down={"n1": "draining"})
    code = after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=0, exit_code=137,
                      hosts=("n1", "n2"), client=client)  # fmt: skip
    assert code is None  # restarted in place: a draining node still runs its jobs
    names = [e["event"] for e in RunHistory(tmp_path).events()]
    assert names == ["failure", "restart_in_place"], names


@pytest.mark.parametrize("code", [0, 2, 3])
def test_codes_that_say_what_to_do_end_the_script(tmp_path: Path, code: int) -> None:
    assert (
        after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=0, exit_code=code)
        == code
    )
    assert not (tmp_path / "events.jsonl").exists()


def test_a_step_already_requeued_or_over_budget_ends_the_script(tmp_path: Path) -> None:
    _append(tmp_path, "failure", action="requeue")
    _append(tmp_path, "requeue", via="scontrol")
    assert after_step(tmp_path, BUDGETS, job_id="7", restart_count=0, in_place=0, exit_code=1) == 1


def test_the_command_line_answers_one_word_even_when_it_cannot_decide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--run-dir", str(tmp_path / "missing"), "--exit-code", "0"]) == 0
    assert capsys.readouterr().out == "exit 0\n"
    (tmp_path / "events.jsonl").write_text("{not json\n")
    _append(tmp_path, "failure", action="restart_in_place")
    main(["--run-dir", str(tmp_path), "--exit-code", "1", "--job-id", "7"])
    assert capsys.readouterr().out == "restart\n"


class _NoSlurm:
    """Slurm's answers for a job that runs on (not requeued by Slurm, not preempted) on n1-n3,
    whose nodes are idle or allocated unless ``down`` says otherwise."""

    def __init__(self, down: dict[str, str] | None = None) -> None:
        self.requeued: list[str] = []
        self.excluded: list[list[str]] = []
        self.down = down or {}

    def show_job(self, job_id: str) -> dict[str, str]:
        return {"JobState": "RUNNING", "Restarts": "0", "NumNodes": "2", "Partition": "debug"}

    def nodes(self) -> list[Node]:
        return [Node(n, self.down.get(n, "allocated"), 2) for n in ("n1", "n2", "n3")]

    def partition(self, name: str) -> Partition:
        return Partition(name, True, None, ("n1", "n2", "n3"), "UP", "REQUEUE", 1, 4)

    def exclude_nodes(self, job_id: str, nodes: list[str]) -> str:
        self.excluded.append(list(nodes))
        return ",".join(nodes)

    def requeue(self, job_id: str) -> None:
        self.requeued.append(job_id)


# -- issue 44 item 4: per line, evidence first, the root before its cascade -------------------


def test_infrastructure_evidence_outvotes_a_harmless_import_error_line() -> None:
    """A CUDA fault whose stderr also holds an ImportError line (a library's optional import
    warned about): the device fault, judged line by line, before the code's patterns."""
    tail = [
        "ImportError: cannot import name 'packaging' from 'pkg_resources' (harmless)",
        "RuntimeError: CUDA error: an illegal instruction was encountered",
    ]
    cls, why = classify(["command exited 1", tail])
    assert cls == "infra" and why.startswith("a device fault (rule device_fault: RuntimeError")


@pytest.mark.parametrize(
    "line",
    ["ImportError: libcuda.so.1: cannot open shared object file: No such file or directory",
     "ModuleNotFoundError: No module named 'torch'"],
)  # fmt: skip
def test_a_nodes_broken_driver_or_missing_environment_excludes_the_node(
    tmp_path: Path, line: str
) -> None:
    """Not 'an error in the code': retried elsewhere, the node excluded (decided as a device
    fault is: train.stop.decision)."""
    from train.stop.decision import decide
    from train.stop.facts import gather

    facts = gather(
        "failure",
        job_id="7",
        restart_count=0,
        run_dir=tmp_path,
        client=_NoSlurm(),
        signal_delay_s=90,
        node="n2",
        error_texts=(f"command exited 1: {line}",),
    )
    assert facts.failure_class == "infra" and facts.device_fault
    assert (
        "rule node_driver" in facts.failure_why or "rule environment_missing" in facts.failure_why
    )
    decision = decide("failure", facts, {}, RequeueConfig())
    assert decision.exclude == ("n2",)


def test_a_rank_that_lost_its_peer_is_the_cascade_not_the_cause() -> None:
    """Rank 1 failed in the code; rank 0's gloo saw the connection close (a few ms earlier or
    later, by when each supervisor saw it): the root is rank 1, whatever the order."""
    from train.stop.causes import root_report

    peer = {"rank": 0, "error": "command exited 1: RuntimeError: [gloo] Connection closed by peer"}
    root = {"rank": 1, "error": "command exited 1: ValueError: shapes (3,) and (4,) differ"}
    for t_peer, t_root in ((10.00, 10.01), (10.02, 10.00)):
        got = root_report([{**peer, "time": t_peer}, {**root, "time": t_root}])
        assert got is not None and got["rank"] == 1
    # only symptoms everywhere: the first by time
    only = root_report([{**peer, "time": 3.0}, {**peer, "rank": 2, "time": 2.0}])
    assert only is not None and only["rank"] == 2
    assert root_report([{"rank": 0, "time": "x"}, "junk"]) is None  # type: ignore[list-item]


def _command_run(tmp_path: Path, rank: int) -> Any:
    from train.command.supervisor import CommandRun
    from train.env import DistEnv

    config = load_run_config_dict({"entrypoint": {"command": ["true"]}})
    return CommandRun(config, DistEnv(rank=rank, world_size=2, job_id="7"), tmp_path, None)


def load_run_config_dict(data: dict) -> Any:
    from train.spec.config import RunConfig

    return RunConfig.model_validate(data)


def test_the_deciding_rank_records_the_roots_failure(tmp_path: Path) -> None:
    """Rank 0 claims the failure (it lost its peer); rank 1 failed first in the code: the
    failure recorded is rank 1's (its error, its stderr, root_rank 1), rank 0's the cascade."""
    from train.command.rootcause import write_report

    write_report(tmp_path, "7", "0", 1, 100.0, "command exited 1: ValueError: bad shape",
                 ["Traceback (most recent call last):", "ValueError: bad shape"])  # fmt: skip
    run = _command_run(tmp_path, rank=0)
    mine = "command exited 1: RuntimeError: Connection closed by peer"
    write_report(tmp_path, "7", "0", 0, 100.01, mine, [mine])
    error, details = run._root(mine, {"stderr_tail": [mine], "exit_code": 1})
    assert error == "command exited 1: ValueError: bad shape" and details["root_rank"] == 1
    assert details["stderr_tail"][-1] == "ValueError: bad shape"
    assert details["cascade"] == {"rank": 0, "error": mine}
    assert classify([error, details["stderr_tail"]])[0] == "unknown"  # not 'infra'
    # the root deciding itself: its own failure
    own, more = _command_run(tmp_path, rank=1)._root("x", {})
    assert own == "x" and more["root_rank"] == 1


# -- issue 44 item 13: the exception line, and a deterministic crash ---------------------------

FABRIC = [
    "Traceback (most recent call last):",
    '  File "/home/u/fabric/train.py", line 88, in <module>',
    "    state = fabric.load(ckpt)",
    '  File "/venv/lib/python3.11/site-packages/torch/serialization.py", line 1470, in load',
    "    raise pickle.UnpicklingError(_get_wo_message(str(e))) from None",
    "_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so "
    "you have two options, do those steps only if you trust the source of the checkpoint. ",
    "\t(1) In PyTorch 2.6, we changed the default value of the `weights_only` argument.",
    "\t(2) Alternatively, to load with `weights_only=True` please check the recommended steps.",
    "Check the documentation of torch.load to learn more about types accepted by default with "
    "weights_only https://pytorch.org/docs/stable/generated/torch.load.html.",
]


def test_status_shows_the_exception_line_not_the_last_stderr_line() -> None:
    from train.command.supervisor import CommandRun
    from train.stop.causes import exception_line

    line = exception_line(FABRIC)
    assert line is not None and line.startswith("_pickle.UnpicklingError: Weights only load failed")
    assert line.endswith("the source of the checkpoint.")  # whole
    assert CommandRun._error(1, FABRIC) == f"command exited 1: {line}"
    assert (
        CommandRun._error(-9, ["no traceback here"])
        == "command killed by SIGKILL: no traceback here"
    )


def _fabric_history(tmp_path: Path, progress: bool) -> None:
    from train.stop.causes import signature

    h = RunHistory(tmp_path)
    h.append("start", step=0, restart_count=0, job_id="7")
    if progress:
        h.append("checkpoint", step=40, restart_count=0, job_id="7")
    h.append("failure", step=41, restart_count=0, job_id="7", failure_class="unknown",
             error="command exited 1: " + FABRIC[5], stderr_tail=FABRIC,
             signature=signature(["x", FABRIC]))  # fmt: skip
    h.append("resume" if progress else "start", step=40 if progress else 0, restart_count=1,
             job_id="7")  # fmt: skip


def test_the_same_crash_at_consecutive_starts_without_progress_stops_retrying(
    tmp_path: Path,
) -> None:
    """Was: 'unknown', run 4 times. The second start crashing the same way (type, message,
    location) from the same checkpoint: not retried, one line says why."""
    from train.stop.decision import decide
    from train.stop.facts import gather

    _fabric_history(tmp_path, progress=False)
    facts = gather("failure", job_id=None, restart_count=1, run_dir=tmp_path, signal_delay_s=90,
                   error_texts=("command exited 1: " + FABRIC[5], FABRIC))  # fmt: skip
    assert facts.failure_class == "user"
    assert facts.failure_why.startswith("the same failure at 2 starts in a row with no checkpoint")
    assert "train.py:88:<module>" not in facts.failure_why  # the raising frame: torch's
    assert "serialization.py:1470:load" in facts.failure_why
    decision = decide("failure", facts, RunHistory(tmp_path).counts(), RequeueConfig())
    assert decision.exhausted is not None and "the same failure at 2 starts" in decision.exhausted
    assert "\n" not in decision.exhausted


def test_the_same_crash_after_checkpoint_progress_is_retried(tmp_path: Path) -> None:
    from train.stop.facts import gather

    _fabric_history(tmp_path, progress=True)
    facts = gather("failure", job_id=None, restart_count=1, run_dir=tmp_path, signal_delay_s=90,
                   error_texts=("command exited 1: " + FABRIC[5], FABRIC))  # fmt: skip
    assert facts.failure_class == "unknown"
    other = tmp_path / "other"
    other.mkdir()
    _fabric_history(other, progress=False)  # a different crash the second time: retried
    facts = gather("failure", job_id=None, restart_count=1, run_dir=other, signal_delay_s=90,
                   error_texts=("command exited 1: ValueError: x",))  # fmt: skip
    assert facts.failure_class == "unknown"


def test_status_and_the_history_show_the_exception_and_the_rule(tmp_path: Path) -> None:
    """jobs status's failure lines: the exception line whole (an event recorded before, with
    the last stderr line cut mid-word, included), the rule that fired, the root rank; the
    history line names the rule."""
    from jobs.monitor import describe_failure

    old = {"event": "failure", "error": "command exited 1: Check the documentation of torch.lo",
           "stderr_tail": FABRIC}  # fmt: skip
    lines = describe_failure(old)
    assert lines[0] == f"error: command exited 1: {FABRIC[5].strip()}"
    cls, why = classify(
        ["command exited 1", ["RuntimeError: CUDA error: unspecified launch failure"]]
    )
    event = {**old, "failure_class": cls, "cause": why, "root_rank": 1,
             "cascade": {"rank": 0, "error": "x"}}  # fmt: skip
    assert describe_failure(event)[1] == f"cause: {why}, rank 1 failed first"
    h = RunHistory(tmp_path)
    h.append(
        "failure", step=None, restart_count=0, **{k: v for k, v in event.items() if k != "event"}
    )
    assert "last failure (infrastructure, rule device_fault): command exited 1" in h.summary()
