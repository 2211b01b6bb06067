"""The ``net`` hosts layout (cluster.local.hosts): each node a host of its own, a login host,
``python -m cluster shell``.

Runs on the session's cluster when it is a ``net`` one (``SLURM_TRAIN_TEST_HOSTS=net``), else on
a cluster of its own beside it (the worker's state dir with ``-hosts``, ports 50 above the
worker's), brought down at the end. Skips, saying why, where network namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.local.hosts import netns_problem
from cluster.local.manager import LocalCluster

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

#: What each rank reports: its host name, its addresses, what it finds in /dev/shm after
#: writing its own mark there, and the first node's name as it resolves, reached over TCP.
RANK = r"""
import json, os, socket, sys, time
from pathlib import Path
out = Path(sys.argv[1]); job = os.environ["SLURM_JOB_ID"]; rank = int(os.environ["SLURM_PROCID"])
mark = Path("/dev/shm") / f"hosts-test-{job}-{rank}"
mark.write_text("x")
time.sleep(1.0)
seen = sorted(p.name for p in Path("/dev/shm").glob(f"hosts-test-{job}-*"))
first = os.environ["MASTER_NODE"]
addr = socket.gethostbyname(first)
if rank == 0:
    srv = socket.create_server(("0.0.0.0", int(os.environ["PORT"])))
    srv.settimeout(30)
    conn, _ = srv.accept(); conn.sendall(socket.gethostname().encode()); conn.close()
    heard = None
else:
    for _ in range(100):
        try:
            c = socket.create_connection((first, int(os.environ["PORT"])), timeout=5); break
        except OSError:
            time.sleep(0.2)
    heard = c.recv(100).decode()
mark.unlink()
me = socket.gethostname()
info = {"rank": rank, "host": me, "addr": socket.gethostbyname(me),
        "shm": seen, "first": first, "first_addr": addr, "heard": heard}
(out / f"rank-{rank}.json").write_text(json.dumps(info))
"""


def _cli(lc: LocalCluster, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "cluster", "--state-dir", str(lc.layout.root),
         "--port-offset", str(lc.layout.port_offset), *args],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def hosts_cluster(
    slurm_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    if slurm_cluster.hosts_layout == "net":
        yield slurm_cluster
        return
    reason = netns_problem()
    if reason is not None:
        pytest.skip(reason)
    root = Path(f"{slurm_cluster.layout.root}-hosts")
    offset = slurm_cluster.layout.port_offset + 50
    LocalCluster(root, port_offset=offset).down()
    lc = LocalCluster(
        root, port_offset=offset, hosts="net", shared=[str(tmp_path_factory.getbasetemp())]
    )
    try:
        lc.up()
        yield lc
    finally:
        lc.down()


def test_two_ranks_on_two_nodes_are_two_hosts(hosts_cluster: LocalCluster, tmp_path: Path) -> None:
    """Different host names, addresses and /dev/shm; the first node's name resolves from the
    second to its address, and a connection to it arrives (MASTER_ADDR works)."""
    (tmp_path / "rank.py").write_text(RANK)
    port = str(21000 + hosts_cluster.layout.port_offset % 1000)
    script = (
        "#!/bin/sh\n"
        'export MASTER_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
        f"export PORT={port}\n"
        f'srun "{sys.executable}" "{tmp_path}/rank.py" "{tmp_path}"\n'
    )
    (tmp_path / "job.sh").write_text(script)
    res = _cli(
        hosts_cluster, "shell", "login", "--user", "root", "--",
        "sbatch", "--wait", "-N2", "--ntasks-per-node=1", "-t", "5", "-o", "job-%j.out",
        "job.sh", cwd=tmp_path,
    )  # fmt: skip
    logs = "".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert res.returncode == 0, res.stdout + res.stderr + logs
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    # any two of the three nodes (the cluster is shared with the other tests): two hosts, rank
    # 0 on the job's first node
    hosts = [r["host"] for r in ranks]
    assert len(set(hosts)) == 2 and set(hosts) <= {"n1", "n2", "n3"}, hosts
    first = hosts[0]
    assert [r["first"] for r in ranks] == [first, first]
    job = res.stdout.split("job", 1)[1].split()[0]  # "Submitted batch job N"
    assert [r["shm"] for r in ranks] == [[f"hosts-test-{job}-{r}"] for r in (0, 1)]
    net = hosts_cluster.net
    assert net is not None
    assert [r["addr"] for r in ranks] == [net.addr(h) for h in hosts]
    assert len({r["addr"] for r in ranks}) == 2
    assert ranks[1]["first_addr"] == net.addr(first)
    assert ranks[1]["heard"] == first


def test_shell_runs_on_the_host_in_the_callers_folder(
    hosts_cluster: LocalCluster, tmp_path: Path
) -> None:
    res = _cli(
        hosts_cluster, "shell", "n2", "--user", "root", "--",
        "sh", "-c", 'echo "$(hostname) $(pwd) $SLURM_CONF"; sinfo -h -o %D',
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["n2", str(tmp_path), str(hosts_cluster.conf), "3"]
    # the command's exit status is the shell's
    login = _cli(hosts_cluster, "shell", "login", "--user", "root", "--", "sh", "-c",
                 "hostname; exit 3")  # fmt: skip
    assert login.returncode == 3 and login.stdout.split() == ["login"], login.stdout


def test_shell_runs_as_trainee_by_default(hosts_cluster: LocalCluster, tmp_path: Path) -> None:
    try:
        pwd.getpwnam("trainee")
    except KeyError:
        pytest.skip("no user trainee here (scripts/setup.sh adds it)")
    res = _cli(hosts_cluster, "shell", "n1", "--", "id", "-un", cwd=Path("/"))
    assert res.returncode == 0 and res.stdout.strip() == "trainee", res.stdout + res.stderr


def test_the_login_alias_reaches_the_login_host(hosts_cluster: LocalCluster) -> None:
    """--remote's login node (cluster/local/sshd.py) is the login host: its sshd runs there,
    and a session there reaches the cluster with plain Slurm commands of its release, as on a
    real login node (no SLURM_CONF or PATH given)."""
    from cluster.local import sshd

    server = hosts_cluster.login_server()
    if server is None or shutil.which("ssh") is None:
        pytest.skip("no login node here: openssh-server, ssh or the user trainee is missing")
    res = subprocess.run(
        ["ssh", "-F", str(server.client_config), "-o", "BatchMode=yes", sshd.LOGIN_ALIAS,
         "hostname; id -un; sinfo -h -o %P | head -1; scontrol version"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[:3] == ["login", sshd.login_user(), "debug*"]
    assert hosts_cluster.release.name in res.stdout.splitlines()[-1]
