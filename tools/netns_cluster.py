"""Real hosts on one machine: N Linux network namespaces, one zmesh agent in each.

Each "host" is a network namespace with its own IP on a private test range,
joined by a veth pair to a bridge in the root namespace (which gets the
range's first address, so the client on the root side reaches every agent
directly, broker-less). Needs root and iproute2.

    sudo python tools/netns_cluster.py --agents 3          # prints ZMESH_AGENTS=..., Ctrl+C ends
    sudo python tools/netns_cluster.py --agents 3 --keys DIR   # CURVE-protected agents

From Python (the multihost tests do this)::

    with NetnsCluster(3) as cluster:
        zmesh.connect(cluster.controls)
        cluster.partition(1)   # cut host 1 off (its veth goes down)
        cluster.heal(1)

Every name carries this process's pid, so a later run removes what a crashed
run left behind (``cleanup_stale``), and ``close`` runs at exit and on
SIGTERM as well.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field

from zmesh._shared.paths import pid_exists

# A private range that nothing on a test machine should be using.
SUBNET = "10.213.{net}"
PREFIX = "zmn"  # names: zmn<pid>h<i> (netns), zv<pid>h<i> (veth), zb<pid> (bridge)


def available() -> str | None:
    """``None`` when namespaces can be made here, else the reason they cannot."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"'ip netns' does not work here: {probe.stderr.strip()}"
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return done


def cleanup_stale() -> None:
    """Remove namespaces, veths and bridges left by runs whose process is gone."""
    for line in _ip("netns", "list").stdout.splitlines():
        m = re.match(rf"{PREFIX}(\d+)h\d+", line.split()[0] if line.split() else "")
        if m and not pid_exists(int(m.group(1))):
            _ip("netns", "delete", m.group(0), check=False)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        m = re.search(r"\d+: (z[vb](\d+)[^:@ ]*)", line)
        if m and not pid_exists(int(m.group(2))):
            _ip("link", "delete", m.group(1), check=False)


@dataclass
class Host:
    """One namespace and the agent running in it."""

    index: int
    netns: str
    veth: str  # the root-side end, in the bridge
    ip: str
    peer: str = ""  # the namespace's end
    control: str = ""
    agent: subprocess.Popen[bytes] | None = None
    log_dir: str = ""


@dataclass
class NetnsCluster:
    """N namespaces with one agent each. Use as a context manager.

    Args:
        n: how many hosts.
        keys: a directory made by ``zmesh keygen`` for CURVE-protected agents;
            ``None`` starts them with ``--insecure``.
        port: the agents' control port (the same in every namespace).
        env: extra environment for the agents (e.g. ``ZMESH_OWNER_GRACE``).
        net: the third octet of the 10.213.x.0/24 range, so runs can coexist.
    """

    n: int
    keys: str | None = None
    port: int = 7411
    env: dict[str, str] = field(default_factory=dict)  # extra agent environment
    net: int = field(default_factory=lambda: 1 + os.getpid() % 250)
    hosts: list[Host] = field(default_factory=list)
    bridge: str = ""
    _closed: bool = False

    def __enter__(self) -> NetnsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def controls(self) -> list[str]:
        """The agents' control addresses, for ``zmesh.connect``."""
        return [h.control for h in self.hosts]

    def start(self) -> None:
        reason = available()
        if reason:
            raise RuntimeError(reason)
        cleanup_stale()
        atexit.register(self.close)
        pid = os.getpid()
        self.bridge = f"zb{pid}"
        base = SUBNET.format(net=self.net)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{base}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.n):
                self._add_host(i, pid, base)
            for h in self.hosts:
                self._start_agent(h)
        except BaseException:
            self.close()
            raise

    def _add_host(self, i: int, pid: int, base: str) -> None:
        h = Host(i, f"{PREFIX}{pid}h{i}", f"zv{pid}h{i}", f"{base}.{10 + i}")
        self.hosts.append(h)
        peer = h.peer = f"zp{pid}h{i}"
        _ip("netns", "add", h.netns)
        _ip("link", "add", h.veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", h.netns)
        _ip("link", "set", h.veth, "master", self.bridge)
        _ip("link", "set", h.veth, "up")
        _ip("link", "set", "lo", "up", ns=h.netns)
        _ip("addr", "add", f"{h.ip}/24", "dev", peer, ns=h.netns)
        _ip("link", "set", peer, "up", ns=h.netns)

    def _start_agent(self, h: Host) -> None:
        h.log_dir = tempfile.mkdtemp(prefix=f"zmesh-netns-h{h.index}-")
        cmd = [
            "ip", "netns", "exec", h.netns, sys.executable, "-m", "zmesh", "agent",
            "--bind", f"tcp://{h.ip}:{self.port}", "--label", f"host{h.index}",
            "--log-dir", h.log_dir,
        ]  # fmt: skip
        cmd += ["--keys", self.keys] if self.keys else ["--insecure"]
        from zmesh._client.control.local import await_ready

        log_path = os.path.join(h.log_dir, "agent.log")
        with open(log_path, "ab") as err:
            h.agent = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                start_new_session=True, env={**os.environ, **self.env},
            )  # fmt: skip
        info = await_ready(h.agent, log_path)
        h.control = info.control

    def partition(self, index: int) -> None:
        """Cut host ``index`` off the network (its link goes down; nothing is killed)."""
        _ip("link", "set", self.hosts[index].veth, "down")

    def heal(self, index: int) -> None:
        """Bring host ``index`` back."""
        _ip("link", "set", self.hosts[index].veth, "up")

    def limit_rate(self, index: int, rate: str = "100mbit") -> None:
        """Make host ``index``'s link a slow one, both ways (``tc`` token bucket).

        Raises:
            RuntimeError: ``tc`` is missing or the kernel has no ``tbf``.
        """
        h = self.hosts[index]
        tbf = ["qdisc", "add", "dev", "", "root", "tbf", "rate", rate]
        tbf += ["burst", "32kbit", "latency", "400ms"]
        for dev, ns in ((h.veth, None), (h.peer, h.netns)):
            tbf[3] = dev
            cmd = ["ip", "netns", "exec", ns, "tc", *tbf] if ns else ["tc", *tbf]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")

    def close(self) -> None:
        """Stop the agents (and so their procs) and remove every namespace and link."""
        if self._closed:
            return
        self._closed = True
        for h in self.hosts:
            if h.agent is not None and h.agent.poll() is None:
                h.agent.send_signal(signal.SIGTERM)
        for h in self.hosts:
            if h.agent is not None:
                try:
                    h.agent.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    h.agent.kill()
                    h.agent.wait()
        for h in self.hosts:
            _ip("link", "delete", h.veth, check=False)
            _ip("netns", "delete", h.netns, check=False)
        if self.bridge:
            _ip("link", "delete", self.bridge, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--keys", default=None, help="a 'zmesh keygen' directory (CURVE)")
    args = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with NetnsCluster(args.agents, keys=args.keys) as cluster:
        print(f"ZMESH_AGENTS={','.join(cluster.controls)}", flush=True)
        for h in cluster.hosts:
            print(f"# host{h.index}: netns {h.netns} ip {h.ip} logs {h.log_dir}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
