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
    ("step exited 137 (killed by signal 9) without a record from its ranks", "infra"),
    ("command killed by SIGKILL", "infra"),
    ("ZeroDivisionError: division by zero", "unknown"),
    ("command exited 3", "unknown"),
    (None, "unknown"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_the_built_in_table(text: str | None, expected: str) -> None:
    assert classify([text])[0] == expected


def test_the_stderr_tail_counts_too() -> None:
    tail = ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'x'"]
    assert classify(["command exited 1", tail]) == ("user", "an error in the code")


def test_the_specs_rules_come_first() -> None:
    config = RequeueConfig.model_validate(
        {"failure_rules": [{"match": "CUDA out of memory", "cause": "user"},
                           {"match": "ZeroDivision", "cause": "infra"}]}
    )  # fmt: skip
    rules = rules_of(config.failure_rules)
    assert classify(["RuntimeError: CUDA out of memory. Tried"], rules)[0] == "user"
    assert classify(["ZeroDivisionError"], rules) == (
        "infra",
        "requeue.failure_rules: 'ZeroDivision'",
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
    assert failure["event"] == "failure" and failure["failure_class"] == "infra"
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
