"""train.command.launchers: ${NAME} in a command, and torchrun told the allocation's nodes."""

from __future__ import annotations

import pytest

from jobs.load import load_text
from train.command.launchers import TorchrunNode, expand_vars, torchrun_argv
from train.errors import SpecError
from train.spec import launches_torchrun

NODE = TorchrunNode(num_nodes=3, node_rank=2, master_addr="n1", master_port=21234)
ADDED = [
    "--nnodes=3",
    "--node-rank=2",
    "--master-addr=n1",
    "--master-port=21234",
    "--nproc-per-node=1",
    "--max-restarts=0",
]


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["torchrun", "t.py"], 1),
        (["/opt/env/bin/torchrun", "--nproc-per-node=2", "t.py"], 1),
        (["python", "-m", "torch.distributed.run", "t.py"], 3),
        (["python3.11", "-u", "-P", "-m", "torch.distributed.run", "t.py"], 5),
        (["python", "-mtorch.distributed.run", "t.py"], 2),
        (["python", "t.py", "-m", "torch.distributed.run"], None),  # the script's own args
        (["python", "-m", "torch.distributed.launch", "t.py"], None),
        (["python", "-m", "mypkg.train"], None),
        (["bash", "-c", "torchrun t.py"], None),
        (["torchrunner", "t.py"], None),
        ([], None),
    ],
)
def test_a_torchrun_command_is_known_by_its_launcher(argv: list[str], start: int | None) -> None:
    assert launches_torchrun(argv) == start


def test_torchrun_is_told_the_nodes_before_the_users_own_options() -> None:
    argv = ["torchrun", "t.py", "--lr", "0.1"]
    assert torchrun_argv(argv, NODE) == ["torchrun", *ADDED, "t.py", "--lr", "0.1"]
    argv = ["python", "-m", "torch.distributed.run", "t.py"]
    assert torchrun_argv(argv, NODE) == [*argv[:3], *ADDED, "t.py"]


@pytest.mark.parametrize(
    ("given", "left_out"),
    [
        (["--nnodes", "3"], {"--nnodes=3"}),
        (["--node_rank=2"], {"--node-rank=2"}),  # torchrun's other spelling
        (["--master-port", "9999"], {"--master-port=21234"}),
        (["--nproc-per-node", "8"], {"--nproc-per-node=1"}),
        (["--max-restarts=2"], {"--max-restarts=0"}),  # the user asked for torchrun's restarts
        (
            ["--rdzv-backend=c10d", "--rdzv-endpoint=h:1"],  # a rendezvous of their own
            {"--node-rank=2", "--master-addr=n1", "--master-port=21234"},
        ),
        (
            ["--standalone"],
            {"--nnodes=3", "--node-rank=2", "--master-addr=n1", "--master-port=21234"},
        ),
    ],
)
def test_what_the_user_gave_torchrun_is_kept(given: list[str], left_out: set[str]) -> None:
    argv = ["torchrun", *given, "t.py", "--nnodes", "7"]  # the script's own --nnodes
    out = torchrun_argv(argv, NODE)
    assert out == ["torchrun", *[a for a in ADDED if a not in left_out], *argv[1:]]


def test_the_gpus_of_the_node_are_its_processes_unless_told() -> None:
    node = TorchrunNode(num_nodes=1, node_rank=0, master_addr="n1", master_port=1, gpus_on_node=4)
    assert "--nproc-per-node=4" in torchrun_argv(["torchrun", "t.py"], node)


def test_a_command_that_is_not_torchrun_is_left_as_it_is() -> None:
    argv = ["python", "t.py", "--nnodes", "3"]
    assert torchrun_argv(argv, NODE) == argv


def test_braced_variables_of_the_commands_environment_are_expanded() -> None:
    environ = {"RUN_DIR": "/runs/a b", "RANK": "3"}
    argv = ["--out=${RUN_DIR}/rank-${RANK}", "$${RUN_DIR}", "${UNSET}", "$RANK", "${RANK"]
    assert expand_vars(argv, environ) == [
        "--out=/runs/a b/rank-3",  # one argument, spaces and all: no shell splits it
        "${RUN_DIR}",
        "${UNSET}",  # not set: left for the program (or its shell) to read
        "$RANK",
        "${RANK",
    ]


SPEC = """
name: tr
resources: {partition: debug, nodes: 2%s}
entrypoint: {command: [torchrun, --nproc-per-node, "2", t.py]}
"""


def test_a_torchrun_job_runs_one_task_per_node() -> None:
    spec = load_text(SPEC % ", gpus_per_node: 2", "tr.yaml").spec
    assert spec.ntasks_per_node == 1


def test_a_torchrun_job_with_several_tasks_per_node_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError, match=r"ntasks_per_node.*torchrun.*--nproc-per-node"):
        load_text(SPEC % ", ntasks_per_node: 2", "tr.yaml")
