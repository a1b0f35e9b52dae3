"""The deployment recipes of examples/deploy/, run over three real (namespaced) hosts.

No Slurm and no Kubernetes here, so each recipe runs with what it would get
from them and nothing else faked:

- the sbatch script, as the batch step on the first node: ``scontrol`` and
  ``srun`` are shims first on PATH (``scontrol show hostnames`` prints the
  allocation's node names; ``srun -w HOST -- CMD`` runs CMD with
  ``ip netns exec HOST``), the node names resolve through a hosts file (as
  a cluster's DNS would), and the driver script spawns a mesh on every node;
- the DaemonSet's container script, run in a namespace as the node's
  network (``hostNetwork: true``) with NODE_IP/NODE_NAME set and its
  volumes as temp dirs (the pip line a no-op: zmesh is installed, and there
  is no network); a client authorised through the Secret runs an actor on it.

What the shims cannot show is Slurm's own part (node-list syntax, step
placement, its signals); the image and the volumes of the manifest are only
parsed (tests/unit/test_deploy_examples.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import zmesh
from zmesh._client.control import local as _local
from zmesh._wire import security as _security

from _helpers import end_child, live_processes
from netns_cluster import Host, NetnsCluster

DEPLOY = Path(__file__).resolve().parents[2] / "examples" / "deploy"
TREE = str(Path(__file__).resolve().parents[2])

SCONTROL = """\
#!/bin/sh
# scontrol show hostnames LIST: the allocation's nodes, one a line (LIST: a,b,c).
[ "$1 $2" = "show hostnames" ] || { echo "scontrol shim: only 'show hostnames'" >&2; exit 2; }
echo "$3" | tr ',' '\\n'
"""

SRUN = """\
#!/bin/sh
# srun [OPTIONS] -w HOST -- CMD...: CMD on HOST, i.e. in HOST's network namespace.
host=
while [ $# -gt 0 ]; do
    case $1 in
        -w) host=$2; shift 2 ;;
        --nodelist=*) host=${1#*=}; shift ;;
        --) shift; break ;;
        *) shift ;;
    esac
done
[ -n "$host" ] || { echo "srun shim: no -w HOST" >&2; exit 2; }
exec ip netns exec "$host" "$@"
"""

DRIVER = """\
import os

import zmesh


class Where(zmesh.Actor):
    @zmesh.endpoint
    def where(self) -> str:
        ino = os.stat("/proc/self/ns/net").st_ino  # the node (namespace) this proc runs on
        for name in os.listdir("/run/netns"):
            if os.stat(f"/run/netns/{name}").st_ino == ino:
                return name
        return "?"


if __name__ == "__main__":
    n = len(os.environ["ZMESH_AGENTS"].split(","))
    mesh = Where.options(hosts=n).as_actor().get(timeout=60)
    for rank, node in enumerate(mesh.where.call().get(timeout=30).values()):
        print(f"rank {rank} ran on {node}", flush=True)
    mesh.stop().get(timeout=30)
"""


class BareHosts(NetnsCluster):
    """The namespaces and their network, no agents: the recipes start those."""

    def _start_agent(self, h: object) -> None:
        pass


@pytest.fixture
def nodes() -> Iterator[NetnsCluster]:
    """Three nodes: namespaces on one bridge, nothing running in them."""
    with BareHosts(3) as cluster:
        yield cluster


@pytest.fixture
def run_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The recipes' environment, tagged so that whatever they leave running is found."""
    runtime = tempfile.mkdtemp(prefix="zd-", dir="/tmp")  # the nodes' registry: shared /tmp
    tag = uuid.uuid4().hex
    env = {
        **os.environ,
        "PYTHONPATH": TREE,
        "HOME": str(tmp_path / "home"),  # shared, as a cluster's home is
        "ZMESH_RUNTIME_DIR": runtime,
        "ZMESH_FORWARD_LOGS": "0",
        "ZMESH_DEPLOY_TEST": tag,
    }
    try:
        yield env
    finally:
        zmesh.shutdown()
        _local.configure(None)
        _security.use(None)
        for p in live_processes(f"ZMESH_DEPLOY_TEST={tag}"):  # a failed test's leftovers
            os.kill(p.pid, signal.SIGKILL)
        shutil.rmtree(runtime, ignore_errors=True)


def _leftovers(env: dict[str, str], within: float = 10.0) -> list[str]:
    """What the recipe left running (given ``within`` seconds to exit)."""
    deadline = time.monotonic() + within
    while (left := live_processes(f"ZMESH_DEPLOY_TEST={env['ZMESH_DEPLOY_TEST']}")) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return [b" ".join(p.cmdline).decode(errors="replace") for p in left]


def _executable(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def _sbatch(
    nodes: list[Host],
    env: dict[str, str],
    tmp_path: Path,
    driver: str,
    timeout: float,
    names: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the sbatch script as Slurm would run the batch step of an allocation of ``nodes``
    (named ``names``: the nodes' own names unless given)."""
    shims = tmp_path / "bin"
    shims.mkdir()
    _executable(shims / "scontrol", SCONTROL)
    _executable(shims / "srun", SRUN)
    keys = str(tmp_path / "keys")
    _security.keygen(keys)
    # The nodes' names resolve as a cluster's DNS would make them: a hosts file
    # mounted over /etc/hosts in a mount namespace of the job's own.
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"{h.ip} {h.netns}\n" for h in nodes))
    (tmp_path / "driver.py").write_text(driver)
    env = {
        **env,
        "PATH": f"{shims}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": ",".join(names or [h.netns for h in nodes]),
        "ZMESH_KEYS_DIR": keys,
    }
    mount = 'mount --bind "$0" /etc/hosts && exec "$@"'
    cmd = ["unshare", "--mount", "sh", "-c", mount, str(hosts)]
    cmd += ["ip", "netns", "exec", nodes[0].netns]  # the batch step runs on the first node
    cmd += ["bash", str(DEPLOY / "zmesh-agents.sbatch"), "driver.py"]
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path
    )


def test_the_sbatch_script_runs_the_driver_on_a_mesh_over_every_node(
    nodes: NetnsCluster, run_env: dict[str, str], tmp_path: Path
) -> None:
    done = _sbatch(nodes.hosts, run_env, tmp_path, DRIVER, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    ran_on = sorted(line.split()[-1] for line in done.stdout.splitlines() if " ran on " in line)
    assert ran_on == sorted(h.netns for h in nodes.hosts), done.stdout + done.stderr
    # The script ended the agents it started, on every node, and their procs.
    assert _leftovers(run_env) == []


def test_the_sbatch_script_ends_the_agents_when_the_driver_fails(
    nodes: NetnsCluster, run_env: dict[str, str], tmp_path: Path
) -> None:
    done = _sbatch(nodes.hosts, run_env, tmp_path, "raise SystemExit(3)\n", timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr  # the job fails as its driver did
    assert _leftovers(run_env) == []


def test_the_sbatch_script_fails_as_zmesh_up_did_within_its_timeout(
    nodes: NetnsCluster, run_env: dict[str, str], tmp_path: Path
) -> None:
    # The agents' port is taken on the second node: its agent cannot start and
    # exits, and `zmesh up` says so as soon as it sees that (well within
    # ZMESH_UP_TIMEOUT, which bounds the wait for a node that stays silent).
    taken = nodes.hosts[1]
    holder = subprocess.Popen(
        ["ip", "netns", "exec", taken.netns, sys.executable, "-c",
         "import socket, sys, time\n"
         "s = socket.create_server(('0.0.0.0', 7411)); print('bound', flush=True)\n"
         "time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "bound\n"
        t0 = time.monotonic()
        # (15 s: the failing agent must start Python and zmesh first, which took
        # over 4 s once on a loaded machine; "exited" below shows it was not waited out.)
        env = {**run_env, "ZMESH_UP_TIMEOUT": "15"}
        done = _sbatch(nodes.hosts, env, tmp_path, DRIVER, timeout=40)
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes its pipe
    assert done.returncode == 2, done.stdout + done.stderr  # zmesh up's own exit code
    (why,) = [line for line in done.stderr.splitlines() if "zmesh up: error:" in line]
    assert f"the agent exited before it answered on {taken.netns}" in why, why
    assert " ran on " not in done.stdout  # the driver never ran
    assert took < 30, f"the script took {took:.1f}s"
    assert _leftovers(run_env) == []  # the agents of the other nodes are gone too


def test_the_sbatch_script_fails_at_once_on_a_node_it_cannot_reach(
    nodes: NetnsCluster, run_env: dict[str, str], tmp_path: Path
) -> None:
    # The last node of the allocation has no namespace: srun cannot run anything there.
    names = [h.netns for h in nodes.hosts[:2]] + ["ghost-node"]
    t0 = time.monotonic()
    done = _sbatch(nodes.hosts, run_env, tmp_path, DRIVER, timeout=40, names=names)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "copying the keys to ghost-node failed" in done.stderr, done.stderr
    assert time.monotonic() - t0 < 20
    assert _leftovers(run_env) == []  # the agents already started on the first two


def _daemonset_script(root: Path) -> str:
    """The container's shell script, its volumes moved under ``root``."""
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((DEPLOY / "zmesh-daemonset.yaml").read_text())
    script: str = doc["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "pip install --no-cache-dir zmesh\n" in script
    # zmesh is installed here already (and there is no network to pip from).
    script = script.replace("pip install --no-cache-dir zmesh\n", ":\n")
    for path in ("/var/log/zmesh", "/secret", "/keys"):
        assert path in script
        script = script.replace(path, f"{root}{path}")
    return textwrap.dedent(script)


def test_the_daemonset_container_script_serves_a_keyed_agent_on_the_node_ip(
    nodes: NetnsCluster, run_env: dict[str, str], tmp_path: Path
) -> None:
    node = nodes.hosts[0]
    root = tmp_path / "pod"
    # The Secret, as the manifest's `kubectl create secret ... --from-file` lays it out
    # (read-only files): the agents' keypair, and the public key of a client of its own.
    keys = str(tmp_path / "keys")
    agents = _security.keygen(keys)
    alice = str(tmp_path / "alice")
    _security.keygen_client(alice, agents.public)
    (root / "secret").mkdir(parents=True)
    for src, dst in (
        (os.path.join(keys, "zmesh.key"), "zmesh.key"),
        (os.path.join(keys, "zmesh.key_secret"), "zmesh.key_secret"),
        (os.path.join(alice, "zmesh.key"), "alice.key"),
    ):
        shutil.copy(src, root / "secret" / dst)
        (root / "secret" / dst).chmod(0o400)
    (root / "var" / "log" / "zmesh").mkdir(parents=True)
    env = {**run_env, "NODE_IP": node.ip, "NODE_NAME": node.netns}
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    script = _daemonset_script(root)
    pod_log = tmp_path / "pod.log"  # what `kubectl logs` would show
    with open(pod_log, "wb") as out:
        pod = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, "/bin/sh", "-c", script],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    try:
        control = f"tcp://{node.ip}:7411"
        from zmesh.cli.up import wait_answering

        _security.use(keys)
        silent = wait_answering([control], 30)
        assert not silent, f"the agent never answered: {pod_log.read_text()}"
        # A client with its own keys, authorised through the Secret, reaches the node's IP
        # (and the proc it spawns reaches the agent back: the agents' key is authorised).
        zmesh.connect([control], keys=alice)
        mesh = _Where.options(hosts=1).as_actor().get(timeout=60)
        assert mesh.where.call().get(timeout=30).values() == [
            os.stat(f"/run/netns/{node.netns}").st_ino
        ]
        mesh.stop().get(timeout=30)
        zmesh.shutdown()
        assert (root / "keys" / "zmesh.key_secret").stat().st_mode & 0o077 == 0
        assert any((root / "var" / "log" / "zmesh").iterdir()), "no proc log in the log volume"
    finally:
        # Kubernetes stops a pod with SIGTERM to its process (the agent: the script execs it).
        pod.send_signal(signal.SIGTERM)
        try:
            pod.wait(15)
            ended = True
        except subprocess.TimeoutExpired:
            pod.kill()
            pod.wait()
            ended = False
    assert ended, "the agent did not end on SIGTERM"
    assert _leftovers(run_env) == []


class _Where(zmesh.Actor):
    @zmesh.endpoint
    def where(self) -> int:
        return os.stat("/proc/self/ns/net").st_ino  # the namespace this proc runs in


def test_zmesh_up_attached_prints_one_line_and_its_end_ends_every_agent(
    nodes: NetnsCluster, run_env: dict[str, str], tmp_path: Path
) -> None:
    """What the sbatch script relies on: stdout is the env line; SIGTERM ends every agent."""
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("".join(f"{h.netns} {h.ip}\n" for h in nodes.hosts))
    cmd = [sys.executable, "-m", "zmesh", "up", str(hostfile), "--attach"]
    cmd += ["--keys", str(tmp_path / "keys"), "--launcher", "ip netns exec {host}"]
    cmd += ["--zmesh", f"{sys.executable} -m zmesh"]
    with open(tmp_path / "up.err", "wb") as err:
        up = subprocess.Popen(cmd, env=run_env, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert up.stdout is not None
        first = up.stdout.readline()
        assert first.startswith("ZMESH_AGENTS="), first + (tmp_path / "up.err").read_text()
        agents = live_processes(f"ZMESH_DEPLOY_TEST={run_env['ZMESH_DEPLOY_TEST']}")
        assert len([p for p in agents if b"agent" in p.cmdline]) >= 3
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            rest, _ = up.communicate(timeout=30)
        finally:
            end_child(up, 10)  # killed, and its pipe closed, if it did not end
    assert rest == "", "the agents wrote to zmesh up's stdout"
    assert up.returncode == 0
    assert _leftovers(run_env) == []
