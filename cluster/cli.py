"""Command line of the local dev cluster: ``up``, ``down``, ``status``."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from cluster.errors import ClusterError

if TYPE_CHECKING:
    from cluster.local.manager import LocalCluster


class _Parser(argparse.ArgumentParser):
    """Bad arguments in one line (``python -m cluster up: argument --hosts: ...``), exit 2;
    the usage is one ``--help`` away (its subcommands' parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m cluster",
        description="A real Slurm cluster on this machine (munged, MariaDB, slurmdbd, "
        "slurmctld, slurmd n1, n2 and n3).",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        help="config and state directory (default: $SLURM_TRAIN_CLUSTER_DIR, else "
        "/var/tmp/slurm-train-cluster)",
    )
    p.add_argument(
        "--port-offset",
        type=int,
        default=None,
        help="shift every port (run a second cluster, with its own --state-dir, beside another; "
        "default: $SLURM_TRAIN_CLUSTER_PORT_OFFSET, else 0)",
    )
    p.add_argument(
        "--slurm",
        metavar="RELEASE",
        default=None,
        help="the Slurm release: 22.05 (the host's Debian package, the default), 24.11 or 26.05 "
        "(each in a root file system built once with mmdebstrap); picks the default state dir "
        "(/var/tmp/slurm-train-cluster-RELEASE) and port offset of that release's cluster. "
        "Without it: the release the state dir records",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    # --slurm, --state-dir, --port-offset also after the command (`cluster up --slurm 24.11`)
    after = _Parser(add_help=False)
    after.add_argument("--slurm", metavar="RELEASE", default=argparse.SUPPRESS,
                       help="the Slurm release (see above)")  # fmt: skip
    after.add_argument("--state-dir", type=Path, default=argparse.SUPPRESS,
                       help="the config and state directory (see above)")  # fmt: skip
    after.add_argument("--port-offset", type=int, default=argparse.SUPPRESS,
                       help="shift every port (see above)")  # fmt: skip
    up = sub.add_parser(
        "up", parents=[after], help="start the cluster (idempotent) and wait for idle nodes"
    )
    up.add_argument("--timeout", type=float, default=120.0)
    up.add_argument(
        "--hosts",
        choices=("shared", "net"),
        default=None,
        help="shared: every node on this machine as it is (the default); net: each node a host "
        "of its own (network, UTS and mount namespaces: its address, host name, /dev/shm and "
        "/tmp) and a login host. Without it: the layout the state dir records",
    )
    up.add_argument(
        "--share",
        action="append",
        metavar="PATH",
        default=None,
        help="with --hosts net: a path under /tmp every host sees as this machine's (run "
        "directories there); repeatable. The checkout, /home, /root and /var/tmp are shared",
    )
    sub.add_parser("down", parents=[after], help="stop every process the cluster started")
    sub.add_parser("status", parents=[after], help="daemons, nodes and partitions")
    sub.add_parser(
        "env",
        parents=[after],
        help="print the export lines that point plain Slurm commands (sbatch, squeue) at the "
        'cluster: eval "$(python -m cluster env)"',
    )
    shell = sub.add_parser(
        "shell",
        parents=[after],
        help="run a command (or a shell) on a host of a --hosts net cluster",
        description="Run CMD (default: an interactive shell) on HOST (login, n1, n2, n3) of a "
        "cluster brought up with --hosts net, in the directory it was called from, with the "
        "cluster's environment (SLURM_CONF, the release's PATH): sbatch, srun and python -m "
        "jobs work there as for a user of that host.",
    )
    shell.add_argument("host", metavar="HOST")
    shell.add_argument(
        "--user", default="trainee", help="who runs it (default: trainee; root: as we are)"
    )
    shell.add_argument(
        "argv", nargs="*", metavar="CMD", help="after --: the command and its arguments"
    )
    return p


def _print_status(lc: LocalCluster) -> bool:
    from cluster import slurm_client

    all_alive = True
    print(f"state dir: {lc.layout.root}")
    for d in lc.status():
        mark = "alive" if d.alive else "DOWN"
        all_alive &= d.alive
        print(f"  {d.name:<12} pid {d.pid if d.pid else '-':<8} {mark}")
    print(f"  slurm {lc.release.name}" + ("" if lc.release.on_host else f" (root {lc.slurm.path})"))
    if not lc.status()[3].alive:  # slurmctld
        return False
    client = slurm_client(conf=lc.conf, timeout=10, environ=lc.client_environ())
    try:
        for n in client.nodes():
            gres = ",".join(f"{k}:{v}" for k, v in n.gres.items()) or "-"
            print(f"  node {n.name:<4} {n.state:<10} cpus={n.cpus} gres={gres}")
        for p in client.partitions():
            default = " (default)" if p.default else ""
            print(
                f"  partition {p.name}{default}: {p.state}, nodes={','.join(p.nodes)}, "
                f"max_time={p.max_time_s}s, tier={p.priority_tier}, preempt={p.preempt_mode}"
            )
    except ClusterError as exc:
        print(f"  controller did not answer: {exc}")
        return False
    return all_alive


def _cluster(args: argparse.Namespace) -> LocalCluster:
    """The cluster the flags name: ``--slurm R`` alone is release R's own cluster (its state
    dir and ports); an explicit state dir or offset (flag or environment) wins."""
    from cluster.local.manager import LocalCluster
    from cluster.local.paths import PORT_OFFSET_ENV, STATE_ENV, state_dir
    from cluster.local.release import release

    hosts = getattr(args, "hosts", None)
    share = getattr(args, "share", None)
    if args.slurm is None:
        return LocalCluster(args.state_dir, port_offset=args.port_offset, hosts=hosts, shared=share)
    rel = release(args.slurm)
    root, offset = args.state_dir, args.port_offset
    if root is None and not os.environ.get(STATE_ENV):
        root = rel.default_state_dir(state_dir())
        if offset is None and not os.environ.get(PORT_OFFSET_ENV):
            offset = rel.port_offset
    return LocalCluster(root, port_offset=offset, slurm=rel.name, hosts=hosts, shared=share)


def _exports(lc: LocalCluster) -> list[str]:
    """The lines that make plain Slurm commands in a shell reach this cluster (its release's
    wrappers first on PATH for a release other than the host's)."""
    lines = [f"export SLURM_CONF={shlex.quote(str(lc.conf))}"]
    if lc.slurm.bin_dir is not None:
        lines.append(f'export PATH={shlex.quote(str(lc.slurm.bin_dir))}:"$PATH"')
    login = lc.login_server()
    if login is not None:  # the login node of --remote (README: From your laptop)
        lines.append(f"export SLURM_TRAIN_SSH_CONFIG={shlex.quote(str(login.client_config))}")
    return lines


def _shell(lc: LocalCluster, host: str, user: str, argv: list[str]) -> int:
    """Run ``argv`` (a login shell without one) on ``host`` as ``user``; its exit status."""
    import pwd
    import subprocess

    from cluster.errors import LocalClusterError

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise LocalClusterError(
            f"--user {user}: no such user on this machine (scripts/setup.sh adds trainee; "
            "--user root runs as root)"
        ) from None
    env = lc.client_environ()
    env.update(HOME=entry.pw_dir, USER=user, LOGNAME=user)
    argv = argv or [entry.pw_shell or "/bin/sh"]
    cmd = lc.shell_command(host, argv, os.getcwd(), None if entry.pw_uid == 0 else user)
    try:
        return subprocess.run(cmd, env=env, check=False).returncode
    except FileNotFoundError as exc:
        raise LocalClusterError(f"cluster shell: {exc.filename} not found") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # `shell HOST -- CMD ...`: what follows the first `--` is the command, untouched (argparse
    # would read its options as ours)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    if command and args.command != "shell":
        _parser().error(f"`-- {command[0]} ...` belongs to `shell` only")
    try:
        lc = _cluster(args)
        if args.command == "up":
            res = lc.up(timeout=args.timeout)
            if res.restarted:
                print(f"config changed: restarted {', '.join(res.restarted)}")
            if res.started:
                print(f"started: {', '.join(res.started)}")
            elif res.config_changed and not res.restarted:
                print("config updated; running daemons already use it")
            elif not res.restarted:
                print("cluster already up and healthy; nothing changed")
            _print_status(lc)
            for line in _exports(lc):
                print(line)
            return 0
        if args.command == "shell":
            return _shell(lc, args.host, args.user, args.argv + command)
        if args.command == "down":
            stopped = lc.down()
            left = lc.leftovers()
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
            if left:
                print(f"error: processes still running: {left}", file=sys.stderr)
                return 1
            return 0
        if args.command == "env":  # the lines `up` ends with; nothing is started or asked
            for line in _exports(lc):
                print(line)
            return 0
        ok = _print_status(lc)
        return 0 if ok else 1
    except ClusterError as exc:
        if args.debug:
            traceback.print_exc()
        msg = str(exc)
        first, _, rest = msg.partition("\n")
        print(f"error: {first}", file=sys.stderr)
        if rest:
            print(rest, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and closed early: not an error of ours.
        sys.stderr.close()
        return 0
