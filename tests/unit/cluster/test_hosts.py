"""The ``net`` hosts layout (cluster.local.hosts): each node a host of its own. What it renders
and refuses; the hosts themselves run in tests/integration/test_hosts_cluster.py."""

from __future__ import annotations

import ipaddress
import shutil
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.local import config as cfg
from cluster.local.hosts import Network, is_shareable, shared_from_json
from cluster.local.manager import LocalCluster


def _net(offset: int = 1200, shared: tuple[str, ...] = ()) -> Network:
    return Network(offset, cfg.NODES, Path("/s/hosts"), shared)


def test_each_node_is_its_own_host_in_slurm_conf() -> None:
    net = _net()
    text = cfg.render_slurm_conf(cfg.Layout(Path("/s"), 1200), "vm", net=net)
    for n in cfg.NODES:
        assert f"NodeName={n} NodeHostname={n} NodeAddr={net.addr(n)} " in text
    assert f"SlurmctldHost=vm({net.controller_addr})\n" in text
    assert f"AccountingStorageHost={net.controller_addr}\n" in text
    assert "127.0.0.1" not in text


def test_the_shared_layout_renders_as_before() -> None:
    text = cfg.render_slurm_conf(cfg.Layout(Path("/s"), 1200), "vm")
    assert "NodeName=n1 NodeHostname=vm NodeAddr=127.0.0.1 " in text
    assert "SlurmctldHost=vm(127.0.0.1)\n" in text


def test_clusters_side_by_side_get_subnets_and_interfaces_of_their_own() -> None:
    # the default cluster, the life-cycle test's, the releases', test workers 0..40 (worker
    # bases shift them) and each worker's hosts cluster (+50)
    offsets = [0, 100, 130, 160] + [100 * (k + 2) + d for k in range(41) for d in (0, 50)]
    nets = [_net(o) for o in offsets]
    assert len({n.subnet for n in nets}) == len(nets)
    names = [n.bridge for n in nets] + [n.veth(h) for n in nets for h in n.hosts]
    assert len(set(names)) == len(names) and max(map(len, names)) <= 15  # IFNAMSIZ
    for n in nets:
        addrs = [n.controller_addr, *(n.addr(h) for h in n.hosts)]
        subnet = ipaddress.IPv4Network(f"{n.controller_addr}/24", strict=False)
        assert len(set(addrs)) == len(addrs)
        assert all(ipaddress.ip_address(a) in subnet for a in addrs)
        assert subnet.subnet_of(ipaddress.IPv4Network("10.77.0.0/16"))


def test_every_host_resolves_every_host_and_the_controller() -> None:
    net = _net()
    lines = net.hosts_file("vm").splitlines()
    for h in ("login", *cfg.NODES):
        assert f"{net.addr(h)} {h}" in lines
    assert f"{net.controller_addr} vm controller" in lines
    assert "127.0.0.1 localhost" in lines


def test_a_hosts_first_process_gets_values_as_arguments_never_as_script() -> None:
    hostile = "/tmp/x $(touch /tmp/pwned) `id`;y"
    a = _net(shared=(hostile,)).host_command("n1", ["slurmd", "-N", "n1"])
    b = _net().host_command("n1", ["slurmd", "-N", "n1"])
    script = a[a.index("-c") + 1]
    assert script == b[b.index("-c") + 1]  # one fixed script
    assert hostile in a and "pwned" not in script
    assert a[:2] == ["nsenter", "--net=/run/netns/slurmtrain-1200-n1"]
    assert a[-4:] == ["--", "slurmd", "-N", "n1"]


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/tmp/pytest-of-root", True),
        ("/tmp/a/b", True),
        ("/tmp", False),
        ("/etc", False),
        ("tmp/x", False),
        ("/tmp/../etc", False),
    ],
)
def test_only_paths_under_tmp_are_shared(path: str, ok: bool) -> None:
    assert is_shareable(path) is ok


@pytest.mark.parametrize("text", [None, "", "{", "[]", '{"shared": 3}', '{"shared": ["/etc"]}'])
def test_a_damaged_hosts_record_shares_nothing(text: str | None) -> None:
    assert shared_from_json(text) == ()


def test_the_hosts_record_round_trips() -> None:
    assert shared_from_json(_net(shared=("/tmp/a",)).to_json()) == ("/tmp/a",)


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_a_release_in_a_root_runs_on_net_hosts_with_each_hosts_own_folders_in_its_root(
    tmp_path: Path, release: str
) -> None:
    """Each host's first process (a node's slurmd, chrooted into the release's root) gets the
    root's path as an argument of the one fixed script, which binds the host's private /tmp,
    /dev/shm and /etc/hosts over the root's inside that host's mount namespace only."""
    lc = LocalCluster(tmp_path, port_offset=1200, slurm=release, hosts="net")
    assert lc.net is not None and lc.slurm.path is not None
    argv = lc._as_host("n1", lc._cmd("slurmd", "-N", "n1"))
    plain = _net().host_command("n1", ["slurmd"])
    script = argv[argv.index("-c") + 1]
    assert script == plain[plain.index("-c") + 1]
    root = str(lc.slurm.path)
    assert argv[argv.index("-c") + 6] == root  # sh -c SCRIPT sh HOST DIR HOSTS ROOT
    assert plain[plain.index("-c") + 6] == ""  # the host's release: no root
    assert argv[-6:] == ["--", "chroot", root, "slurmd", "-N", "n1"]
    for target in ('"$root/tmp"', '"$root/dev/shm"', '"$root/etc/hosts"'):
        assert target in script
    server = lc.login_server()  # the login host's sshd puts the release's commands first
    assert server is None or server.bin_dir == lc.slurm.bin_dir


def _cli(tmp_path: Path, *args: str) -> list[str]:
    return ["--state-dir", str(tmp_path), "--port-offset", "1200", *args]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("shell", "n1", "--user", "root", "--", "true"), "runs every node on this machine"),
        (("shell", "n1", "--user", "no-such-user-here", "--", "true"), "no such user"),
        (("up", "--hosts", "net", "--share", "/etc"), "give an absolute path under /tmp"),
    ],
)
def test_bad_shell_or_share_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], says: str
) -> None:
    assert main(_cli(tmp_path, *args)) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1, err


def test_a_command_after_dashes_belongs_to_shell(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(_cli(tmp_path, "status", "--", "true"))
    assert exc.value.code == 2


def test_a_recorded_layout_is_kept(tmp_path: Path) -> None:
    layout = cfg.Layout(tmp_path, 1200)
    layout.etc.mkdir(parents=True)
    layout.hosts_layout_file.write_text("net\n")
    layout.hosts_json.write_text('{"shared": ["/tmp/runs"]}\n')
    lc = LocalCluster(tmp_path, port_offset=1200)
    assert lc.hosts_layout == "net" and lc.net is not None and lc.net.shared == ("/tmp/runs",)
    assert LocalCluster(tmp_path, port_offset=1200, hosts="shared").net is None


def test_the_login_node_of_net_hosts_is_the_login_host(tmp_path: Path) -> None:
    """--remote's sshd listens on the login host's address and the aliases go there; with the
    nodes on this machine it stays on loopback."""
    from cluster.local import sshd

    if shutil.which("ssh-keygen") is None or not sshd.installed() or sshd.login_user() is None:
        pytest.skip("no login node here: openssh-server or the user trainee is missing")
    net = LocalCluster(tmp_path / "a", port_offset=1200, hosts="net")
    shared = LocalCluster(tmp_path / "b", port_offset=1200, hosts="shared")
    assert net.net is not None
    for lc, addr in ((net, net.net.addr("login")), (shared, "127.0.0.1")):
        server = lc.login_server()
        assert server is not None
        server.write("trainee")
        assert f"ListenAddress {addr}\n" in (server.dir / "sshd_config").read_text()
        assert f"  HostName {addr}\n" in server.client_config.read_text()
        assert (server.dir / "known_hosts").read_text().startswith(f"[{addr}]:13422 ")
        assert (server.on_host is None) == (lc is shared)  # started in the login host's namespaces


def _netns_problem() -> str | None:
    from cluster.local.hosts import netns_problem

    return netns_problem()


@pytest.mark.skipif(_netns_problem() is not None, reason=str(_netns_problem()))
def test_a_network_brought_down_while_a_process_lives_in_a_host_is_made_again_at_once(
    tmp_path: Path,
) -> None:
    """A namespace outlives ``ip netns del`` while a process lives in it, and its veth pair with
    it: a cluster made again at once on the same worker met "File exists" (CI, the 24.11 half
    after the 22.05 one). The teardown deletes each pair by its machine end first."""
    import subprocess

    net = Network(9990, ("n1",), tmp_path / "hosts")

    def run_all(cmds: list[list[str]], check: bool) -> None:
        for cmd in cmds:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
            assert not check or proc.returncode == 0, (cmd, proc.stderr)

    run_all(net.teardown_commands(), check=False)  # a test run before that died
    run_all(net.setup_commands(), check=True)
    lingering = subprocess.Popen(["nsenter", f"--net=/run/netns/{net.netns('n1')}", "sleep", "60"])
    try:
        run_all(net.teardown_commands(), check=False)
        assert not Path(f"/sys/class/net/{net.veth('n1')}").exists()
        run_all(net.setup_commands(), check=True)  # at once, the old namespace still alive
    finally:
        lingering.kill()
        lingering.wait()
        run_all(net.teardown_commands(), check=False)
    assert not Path(f"/sys/class/net/{net.bridge}").exists()
