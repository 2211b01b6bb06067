"""What the user's command line becomes before it runs (torch-free, pure).

Two things are done to ``entrypoint.command``, both visible in ``jobs submit --dry-run`` and in
the rank's log (``running ...``):

- ``${NAME}`` is replaced by the value of the variable NAME in the command's own environment
  (the job's, plus RUN_DIR, RANK, MASTER_ADDR, ...: ``train.command.processes.child_environ``):
  ``--out=${RUN_DIR}/out`` needs no ``bash -c``. Only the braced form is expanded, and only names
  that are set; anything else (``$HOME``, ``${UNSET}``, a ``bash -c`` script's own ``${i}``)
  stays as written, for the program (or the shell it starts) to read. ``$${NAME}`` is a literal
  ``${NAME}``.
- **torchrun** (``torchrun ...`` or ``python -m torch.distributed.run ...``) is a launcher of
  its own: it starts the node's processes itself. The job then runs ONE task per node (the spec's
  default for such a command; more is refused by ``jobs submit``) and each node's torchrun gets
  the options that make the nodes one run, where the user did not give them:
  ``--nnodes`` (the allocation's node count), ``--node-rank`` (this node's index),
  ``--master-addr``/``--master-port`` (the job's first node and the job's port: the static
  rendezvous, no etcd, no c10d store to agree on), ``--nproc-per-node`` (the node's GPUs, 1
  without), and ``--max-restarts=0``: a failed worker ends the step, and the restart happens
  here, in place or by requeue, from the run's last checkpoint (torchrun's own restarts would
  not know of Slurm's stops, budgets or checkpoints). A rendezvous of the user's own
  (``--rdzv-endpoint``/``--rdzv-backend``, ``--standalone``) is left alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from train.spec import launches_torchrun

__all__ = ["TorchrunNode", "expand_vars", "torchrun_argv"]

_VAR = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_vars(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """Each argument with ``${NAME}`` replaced by ``environ[NAME]`` where NAME is set (see the
    module docstring); ``$${NAME}`` gives ``${NAME}``."""

    def one(match: re.Match[str]) -> str:
        escaped, name = match.group(1), match.group(2)
        if escaped:
            return "${" + name + "}"
        value = environ.get(name)
        return match.group(0) if value is None else value

    return [_VAR.sub(one, arg) for arg in argv]


@dataclass(frozen=True)
class TorchrunNode:
    """What one node's torchrun must be told (from the task's :class:`train.env.DistEnv`)."""

    num_nodes: int
    node_rank: int
    master_addr: str
    master_port: int
    gpus_on_node: int | None = None


# torchrun accepts both spellings of each option (--node-rank, --node_rank)
def _given(options: Sequence[str], *names: str) -> bool:
    spellings = {n for name in names for n in (name, "--" + name[2:].replace("-", "_"))}
    return any(opt.split("=", 1)[0] in spellings for opt in options)


def _script_at(argv: Sequence[str], start: int) -> int:
    """The index of the first argument after torchrun's own options (the script or module),
    ``len(argv)`` when there is none: ``--opt=value`` is one argument, the flags without a value
    are listed, every other option takes the next argument."""
    no_value = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path"}
    no_value |= {"-m", "--module"}  # torchrun's -m is a flag: the script names a module
    i = start
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return i + 1
        if not arg.startswith("-"):
            return i
        i += 1 if ("=" in arg or arg in no_value) else 2
    return len(argv)


def torchrun_argv(argv: Sequence[str], node: TorchrunNode) -> list[str]:
    """``argv`` (a torchrun command, :func:`launches_torchrun`) with the options that make the
    allocation's nodes one run added before the script, where the user gave none of them."""
    start = launches_torchrun(argv)
    if start is None:
        return list(argv)
    end = _script_at(argv, start)
    given = list(argv[start:end])
    added: list[str] = []
    own_rendezvous = _given(given, "--standalone", "--rdzv-endpoint", "--rdzv-backend")
    if not _given(given, "--nnodes") and not _given(given, "--standalone"):
        added.append(f"--nnodes={node.num_nodes}")
    if not own_rendezvous:
        if not _given(given, "--node-rank"):
            added.append(f"--node-rank={node.node_rank}")
        if not _given(given, "--master-addr"):
            added.append(f"--master-addr={node.master_addr}")
        if not _given(given, "--master-port"):
            added.append(f"--master-port={node.master_port}")
    if not _given(given, "--nproc-per-node"):
        added.append(f"--nproc-per-node={max(1, node.gpus_on_node or 0)}")
    if not _given(given, "--max-restarts"):
        added.append("--max-restarts=0")
    return [*argv[:start], *added, *argv[start:]]
