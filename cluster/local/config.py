"""Render the local cluster's config files from the machine's hostname and the state directory.

Pure functions: the text of slurm.conf, gres.conf, slurmdbd.conf and the task prolog. What each
line is for is recorded in ../shared/SLURM-NOTES.md (verified on these machines); the non-obvious
ones are commented here.

Three nodes: ``n1`` and ``n2`` take jobs first; ``n3`` has a higher scheduling ``Weight``, so it is
used only when the others are busy or excluded (a 2-node job can be moved off a bad node, and jobs
land where they did when the cluster had two nodes).

The cluster marks what it is: its task prolog exports ``SLURM_TRAIN_DUMMY_GPUS=1`` into every task
(batch script and srun ranks), because its GPUs are generic resources backed by dummy files.
``train`` reads it (``train.env.DistEnv.dummy_gpus``) and trains on CPU there instead of refusing
allocated GPUs without CUDA, which stays an error on a real GPU cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.local.hosts import Network

CLUSTER_NAME = "slurmtrain"
#: The host's own Slurm release (cluster.local.release.HOST_RELEASE; config stays pure).
HOST_SLURM = "22.05"
#: Releases that know SlurmctldParameters=enable_expedited_requeue (25.11 and later).
EXPEDITED_REQUEUE_RELEASES = frozenset({"26.05"})
NODES = ("n1", "n2", "n3")
#: Slurm allocates the lowest Weight first: the spare node n3 only when n1/n2 are busy or excluded.
NODE_WEIGHTS = {"n1": 1, "n2": 1, "n3": 10}
CPUS_PER_NODE = 2
GPUS_PER_NODE = 2
REAL_MEMORY_MB = 4096
# Ports away from Slurm's defaults so a system Slurm on the same machine is never disturbed.
SLURMCTLD_PORT = 16817
SLURMDBD_PORT = 16819
MARIADB_PORT = 13306
SLURMD_BASE_PORT = 17001
DEBUG_MAX_TIME = "02:00:00"
URGENT_MAX_TIME = "01:00:00"
# Seconds a preempted job keeps running after its signal to reach a step boundary and save.
GRACE_TIME_S = 20
#: Exported into every task by the task prolog (train.env reads the same name).
DUMMY_GPUS_ENV = "SLURM_TRAIN_DUMMY_GPUS"
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"


@dataclass(frozen=True)
class Layout:
    """Every path (and port) of the local cluster, under one state directory.

    ``port_offset`` shifts every port, so a second cluster (a test of ``up``/``down``, a test
    worker's own cluster) can run beside the shared one; it also moves the cluster's first job
    id (:attr:`first_job_id`), so that jobs of two clusters running at once do not share ids,
    and with them the rendezvous port derived from the id (train.env.master_port_for_job).
    """

    root: Path
    port_offset: int = 0

    @property
    def slurmctld_port(self) -> int:
        return SLURMCTLD_PORT + self.port_offset

    @property
    def slurmdbd_port(self) -> int:
        return SLURMDBD_PORT + self.port_offset

    @property
    def mariadb_port(self) -> int:
        return MARIADB_PORT + self.port_offset

    def slurmd_port(self, index: int) -> int:
        return SLURMD_BASE_PORT + self.port_offset + index

    @property
    def first_job_id(self) -> int:
        """1 for the default cluster; 5 ids per port of offset for another (200 -> 1001): the
        test workers' clusters (offsets 100 apart) start 500 ids apart."""
        return 1 + 5 * self.port_offset

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def cgroup_conf(self) -> Path:
        return self.etc / "cgroup.conf"

    @property
    def task_prolog(self) -> Path:
        return self.etc / "task-prolog.sh"

    @property
    def release_file(self) -> Path:
        """The Slurm release the cluster was last brought up with (``24.11``)."""
        return self.etc / "slurm-release"

    @property
    def hosts_layout_file(self) -> Path:
        """The hosts layout the cluster was last brought up with (``shared`` or ``net``)."""
        return self.etc / "hosts-layout"

    @property
    def hosts_json(self) -> Path:
        """The ``net`` layout's settings (the paths under /tmp every host shares)."""
        return self.etc / "hosts.json"

    @property
    def hosts_dir(self) -> Path:
        """Each host's node-local folders (``net`` layout): ``hosts/n1/tmp``, ..."""
        return self.root / "hosts"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def db_password(self) -> Path:
        return self.etc / "db-password"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def mysql_dir(self) -> Path:
        return self.root / "mysql"

    @property
    def mysql_tmp(self) -> Path:
        """MariaDB's own temporary folder: with the shared /tmp, two clusters set up at once
        (the test workers' clusters) collided on its temporary table names and one
        mariadb-install-db failed ("Could not remove temporary table: '/tmp/#sql-temptable-..")."""
        return self.mysql_dir / "tmp"

    @property
    def mysql_data(self) -> Path:
        return self.mysql_dir / "data"

    @property
    def mysql_socket(self) -> Path:
        return self.mysql_dir / "mysqld.sock"

    @property
    def gres_dev(self) -> Path:
        return self.root / "dev"

    def pid_file(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        return self.log / f"{daemon}.log"


def render_slurm_conf(
    layout: Layout, hostname: str, slurm: str = HOST_SLURM, net: Network | None = None
) -> str:
    """slurm.conf; with ``net`` (the ``net`` hosts layout) each node is a host of its own
    (its name, its address) and the controller and accounting listen at the bridge's address."""
    r = layout.root
    ctld_addr = "127.0.0.1" if net is None else net.controller_addr

    def where(n: str) -> str:
        if net is None:
            return f"NodeHostname={hostname} NodeAddr=127.0.0.1"
        return f"NodeHostname={n} NodeAddr={net.addr(n)}"

    nodes = "\n".join(
        f"NodeName={n} {where(n)} Port={layout.slurmd_port(i)} "
        f"CPUs={CPUS_PER_NODE} RealMemory={REAL_MEMORY_MB} Gres=gpu:{GPUS_PER_NODE} "
        f"Weight={NODE_WEIGHTS[n]} State=UNKNOWN"
        for i, n in enumerate(NODES)
    )
    node_list = ",".join(NODES)
    debug = (
        f"PartitionName=debug Nodes={node_list} Default=YES MaxTime={DEBUG_MAX_TIME} State=UP "
        f"PriorityTier=1 PreemptMode=REQUEUE GraceTime={GRACE_TIME_S}"
    )
    urgent = (
        f"PartitionName=urgent Nodes={node_list} Default=NO MaxTime={URGENT_MAX_TIME} State=UP "
        "PriorityTier=2 PreemptMode=OFF"
    )
    # The same nodes where a preempted job is cancelled, never requeued (sites that preempt
    # with PreemptMode=CANCEL): jobs submit runs a job there as a chain (jobs.chain).
    cancel = (
        f"PartitionName=cancel Nodes={node_list} Default=NO MaxTime={DEBUG_MAX_TIME} State=UP "
        f"PriorityTier=1 PreemptMode=CANCEL GraceTime={GRACE_TIME_S}"
    )
    first_job = f"FirstJobId={layout.first_job_id}\n" if layout.first_job_id > 1 else ""
    # 25.11+: a job submitted with --requeue=expedite and requeued after a node failure starts
    # again at once, at top priority (no wait for its old credential to expire)
    ctld_parameters = "preempt_send_user_signal" + (
        ",enable_expedited_requeue" if slurm in EXPEDITED_REQUEUE_RELEASES else ""
    )
    return f"""\
# Generated by `python -m cluster up` for host {hostname}, Slurm {slurm}. Edits are overwritten.
ClusterName={CLUSTER_NAME}
{first_job}SlurmctldHost={hostname}({ctld_addr})
SlurmctldPort={layout.slurmctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={layout.munge_socket}
CredType=cred/munge
StateSaveLocation={r}/spool/ctld
SlurmdSpoolDir={r}/spool/d-%n
SlurmctldPidFile={layout.pid_file("slurmctld")}
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={layout.log_file("slurmctld")}
SlurmdLogFile={r}/log/slurmd-%n.log
# cgroup plugins do not work in this sandbox (no usable controllers).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobRequeue=1
InactiveLimit=0
KillWait=30
MinJobAge=300
SlurmdTimeout=300
GresTypes=gpu
# Marks every task as running on this dev cluster (dummy GPUs): see render_task_prolog.
TaskProlog={layout.task_prolog}
# Preemption on demand: a job in `urgent` requeues jobs in `debug` (cancels those in
# `cancel`); the job's --signal is
# sent at preemption too, so training can checkpoint within GraceTime.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters={ctld_parameters}
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={ctld_addr}
AccountingStoragePort={layout.slurmdbd_port}
# For slurmdbd connections this names the munge socket (AuthInfo does not reach them).
AccountingStoragePass={layout.munge_socket}
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
{nodes}
{debug}
{urgent}
{cancel}
"""


def render_gres_conf(layout: Layout) -> str:
    # Dummy device files: without File= the nodes register INVAL ("gres/gpu count reported
    # lower than configured").
    last = GPUS_PER_NODE - 1
    return f"""\
# Generated by `python -m cluster up`: GPUs as generic resources backed by dummy files.
AutoDetect=off
NodeName={",".join(NODES)} Name=gpu File={layout.gres_dev}/gpu[0-{last}]
"""


def render_task_prolog() -> str:
    # A task prolog's `export NAME=value` lines on stdout become the task's environment.
    return f"""\
#!/bin/sh
# Generated by `python -m cluster up`: this cluster's GPUs are dummies (no CUDA behind them).
echo "export {DUMMY_GPUS_ENV}=1"
"""


def render_cgroup_conf(slurm: str = HOST_SLURM) -> str:
    # slurmd 24.11 refuses to start without a cgroup file system unless the plugin is
    # disabled; 22.05 knows no "disabled" and starts with autodetect.
    plugin = "autodetect" if slurm == HOST_SLURM else "disabled"
    return (
        "# Generated by `python -m cluster up`: cgroups are not used here.\n"
        f"CgroupPlugin={plugin}\n"
    )


def render_slurmdbd_conf(layout: Layout, password: str) -> str:
    return f"""\
# Generated by `python -m cluster up`. Mode 600: it holds the database password.
AuthType=auth/munge
AuthInfo=socket={layout.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={layout.slurmdbd_port}
SlurmUser=root
PidFile={layout.pid_file("slurmdbd")}
LogFile={layout.log_file("slurmdbd")}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={layout.mariadb_port}
StorageUser={DB_USER}
StoragePass={password}
StorageLoc={DB_NAME}
"""
