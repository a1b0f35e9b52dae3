"""``zmesh up HOSTFILE`` / ``zmesh down HOSTFILE``: one agent per host, over ssh or any launcher.

The host file lists one host a line, ``HOST [ADDR]`` (``#`` comments): HOST
is what the launcher is given as ``{host}``, ADDR where that host's agent
binds and is reached (default: HOST). For each host ``zmesh up``

1. copies the agents' keys there (``--keys DIR``, made with ``zmesh keygen``
   if missing), as a tar stream on the launcher's stdin, into
   ``$HOME/.zmesh/up/HOST`` (0700);
2. starts ``zmesh agent --bind tcp://ADDR:PORT --keys ...`` there, detached
   (``nohup``; its log is ``$HOME/.zmesh/up/HOST/agent.log``), or, with
   ``--attach``, as a child that lives while ``zmesh up`` does (for ``srun``);
3. waits until every agent answers (with the keys), then prints
   ``ZMESH_AGENTS=... ZMESH_KEYS=...``.

The launcher is a command prefix with ``{host}`` in it: ``ssh {host} --``
(the default), ``srun -w {host} --``, ``ip netns exec {host}``, ... The
command to run is appended as ``sh -c SCRIPT`` (one quoted word for ssh,
which hands its command to the remote shell). ``zmesh down HOSTFILE`` runs
``zmesh down --local ADDR`` through the same launcher: it stops the agent of
that address registered on the host (SIGTERM; its procs go with it).
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zmesh._errors import AgentError
from zmesh._shared import registry
from zmesh._wire import messages as w
from zmesh._wire import security as _security
from zmesh._wire.codec import Codec
from zmesh._wire.security import secure_client
from zmesh.cli._common import doc_help, json_arg, print_json

DEFAULT_LAUNCHER = "ssh {host} --"
REMOTE_DIR = '"$HOME/.zmesh/up/{host}"'
PID_SAYS = "zmesh-agent-pid="  # the start command's word for the detached agent's pid
CHECK_EVERY = 1.0  # seconds between asking whether silent agents have exited


@dataclass(frozen=True)
class Host:
    name: str  # what the launcher reaches
    addr: str  # where the agent binds

    def control(self, port: int) -> str:
        return f"tcp://{self.addr}:{port}"


def read_hosts(path: str) -> list[Host]:
    """``HOST [ADDR]`` a line.

    Raises:
        AgentError: unreadable, empty, or a line with more than two words.
    """
    try:
        with open(path) as f:
            lines = [ln.split("#", 1)[0].split() for ln in f]
    except OSError as exc:
        raise AgentError(f"cannot read the host file {path!r}: {exc}") from exc
    hosts = []
    for i, words in enumerate(lines, 1):
        if not words:
            continue
        if len(words) > 2:
            raise AgentError(f"{path}:{i}: expected 'HOST [ADDR]', got {' '.join(words)!r}")
        hosts.append(Host(words[0], words[-1]))
    if not hosts:
        raise AgentError(f"the host file {path!r} lists no host")
    return hosts


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("hostfile", nargs="?", help="one 'HOST [ADDR]' a line")
    parser.add_argument(
        "--launcher",
        default=DEFAULT_LAUNCHER,
        help="the command prefix that runs a command on {host} (default: %(default)r)",
    )
    parser.add_argument("--port", type=int, default=7411, help="the agents' control port")
    parser.add_argument(
        "--zmesh", default="zmesh", help="how to run zmesh on the hosts (default: %(default)s)"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait per step")


def configure_up(parser: argparse.ArgumentParser) -> None:
    """``zmesh up``'s options."""
    doc_help(parser, __doc__)
    _common(parser)
    parser.add_argument("--keys", default=None, help="the agents' keys (made if missing)")
    parser.add_argument(
        "--attach", action="store_true", help="keep the agents as children until Ctrl+C (srun)"
    )
    json_arg(parser, '{"agents", "keys"} once every agent answers')


def _launch(launcher: str, host: Host, script: str) -> list[str]:
    prefix = shlex.split(launcher.replace("{host}", host.name))
    if prefix and os.path.basename(prefix[0]) == "ssh":
        return [*prefix, shlex.join(["sh", "-c", script])]  # ssh hands one string to a shell
    return [*prefix, "sh", "-c", script]


def _key_tar(keys: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(keys, arcname="keys")
    return buf.getvalue()


def run_up(args: argparse.Namespace) -> int:
    """Start the agents; print where they are once they all answer."""

    if not args.hostfile:
        raise AgentError("zmesh up needs a HOSTFILE")
    hosts = read_hosts(args.hostfile)
    keys = args.keys or os.path.join(
        os.path.expanduser("~"), ".zmesh", "up-" + os.path.basename(args.hostfile)
    )
    if not os.path.exists(os.path.join(keys, "zmesh.key_secret")):
        _security.keygen(keys)
        _say(args, f"# made the agents' keys in {keys}")
    keys = os.path.abspath(keys)
    children: list[subprocess.Popen[bytes]] = []
    started: list[Host] = []  # detached agents started: they outlive a failed up
    pids: dict[str, int] = {}  # host -> its detached agent's pid there (the start said)
    try:
        _start_agents(args, hosts, _key_tar(keys), children, started, pids)
    except AgentError as exc:
        _stop(children)
        raise AgentError(exc.message + _left_running(args, started)) from exc
    except BaseException:
        # Agents started already (attached) must not outlive us: nobody else
        # knows of them, and they hold our stderr open.
        _stop(children)
        raise
    controls = [h.control(args.port) for h in hosts]
    _security.use(keys)
    child_of = dict(zip((h.name for h in hosts), children, strict=False))  # attached only

    def exited(silent: list[str]) -> dict[str, str]:
        # An agent that could not start (its port taken, say) never answers:
        # say so at once rather than at the end of --timeout.
        waiting = [h for h in hosts if h.control(args.port) in silent]
        return _exited(args, waiting, child_of, pids)

    try:
        silent, ended = wait_started(controls, args.timeout, exited)
    except BaseException:
        _stop(children)
        raise
    if ended:
        _stop(children)
        answering = [h for h in started if h.control(args.port) not in silent]
        why = "; ".join(f"{name}: {reason}" for name, reason in ended.items())
        raise AgentError(
            f"the agent exited before it answered on {why}" + _left_running(args, answering)
        )
    if silent:
        _stop(children)
        answering = [h for h in started if h.control(args.port) not in silent]
        raise AgentError(
            f"no answer within {args.timeout}s from {', '.join(silent)} "
            f"(see $HOME/.zmesh/up/HOST/agent.log there)" + _left_running(args, answering)
        )
    if not args.attach:
        _announce(args, controls, keys)
        return 0
    # Attached: the agents live while we do (SIGTERM, as Ctrl+C, stops them).
    # The handler goes in before the line is printed: whoever reads the line
    # may send SIGTERM at once, and it must stop the agents, not kill us.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        _announce(args, controls, keys)
        while any(c.poll() is None for c in children):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        _stop(children)
    return 0


def _announce(args: argparse.Namespace, controls: list[str], keys: str) -> None:
    if args.json:
        print_json({"agents": controls, "keys": keys})
    else:
        print(f"ZMESH_AGENTS={','.join(controls)} ZMESH_KEYS={keys}", flush=True)


def _left_running(args: argparse.Namespace, started: list[Host]) -> str:
    """What a failed ``zmesh up`` says of the detached agents it did start.

    They are not stopped: an agent of an earlier ``zmesh up`` may be the one
    serving at that address (ours then exited, its port taken).
    """
    if not started:
        return ""
    names = ", ".join(h.name for h in started)
    return f"; agents are running on {names}: 'zmesh down {args.hostfile}' stops them"


def _start_agents(
    args: argparse.Namespace,
    hosts: list[Host],
    tar: bytes,
    children: list[subprocess.Popen[bytes]],
    started: list[Host],
    pids: dict[str, int],
) -> None:
    """Copy the keys (``tar``) to each host and start its agent; attached ones join
    ``children``, the hosts of detached ones ``started`` (and their pids ``pids``).

    Raises:
        AgentError: a launcher failed (the message says which host, and why).
    """
    for h in hosts:
        remote = REMOTE_DIR.format(host=h.name)
        copy = f"umask 077 && mkdir -p {remote} && tar -x -C {remote} -f -"
        done = _run(_launch(args.launcher, h, copy), args.timeout, "copy the keys", h, tar)
        if done.returncode != 0:
            raise AgentError(
                f"copying the keys to {h.name} failed: {done.stderr.decode(errors='replace')}"
            )
        agent = (
            f"{args.zmesh} agent --bind {shlex.quote(h.control(args.port))} "
            f"--label {shlex.quote(h.name)} --keys {remote}/keys --log-dir {remote}/logs"
        )
        if args.attach:
            # Its own process group, so that stopping it stops what the launcher started.
            # The agent's stdout (its ready line) goes to our stderr: our stdout is the
            # one ZMESH_AGENTS=... line that scripts read.
            cmd = _launch(args.launcher, h, f"exec {agent}")
            children.append(
                subprocess.Popen(cmd, start_new_session=True, stdout=sys.stderr.fileno())
            )
        else:
            start = f"nohup {agent} >> {remote}/agent.log 2>&1 < /dev/null & echo {PID_SAYS}$!"
            done = _run(_launch(args.launcher, h, start), args.timeout, "start the agent", h)
            if done.returncode != 0:
                err = done.stderr.decode(errors="replace")
                raise AgentError(f"starting the agent on {h.name} failed: {err}")
            started.append(h)
            said = done.stdout.decode(errors="replace").rpartition(PID_SAYS)[2].split()
            if said and said[0].isdigit():
                pids[h.name] = int(said[0])


def _exited(
    args: argparse.Namespace,
    hosts: list[Host],
    child_of: dict[str, subprocess.Popen[bytes]],
    pids: dict[str, int],
) -> dict[str, str]:
    """Of ``hosts`` (silent so far), the names of those whose agent has exited -> why.

    An attached agent is our child (its error went to our stderr); a detached
    one is asked about through the launcher, all hosts at once, and its log's
    last lines say why.
    """
    out: dict[str, str] = {}
    if args.attach:
        for h in hosts:
            c = child_of.get(h.name)
            if c is not None and c.poll() is not None:
                out[h.name] = f"exit code {c.returncode} (its error is above)"
        return out
    checks = []
    for h in hosts:
        if h.name not in pids:
            continue  # the launcher did not say (it may not run the command at all)
        remote = REMOTE_DIR.format(host=h.name)
        script = (
            f"kill -0 {pids[h.name]} 2>/dev/null && exit 0; tail -n 2 {remote}/agent.log; exit 3"
        )
        cmd = _launch(args.launcher, h, script)
        checks.append((h, subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )))  # fmt: skip
    for h, popen in checks:
        try:
            out_bytes, _ = popen.communicate(timeout=max(args.timeout, 1.0))
        except subprocess.TimeoutExpired:
            _kill_group(popen, signal.SIGKILL)
            popen.communicate()
            continue  # no word: the wait for its answer goes on
        if popen.returncode == 3:
            tail = " ".join(out_bytes.decode(errors="replace").split())
            out[h.name] = tail or "it exited (its agent.log says nothing)"
    return out


def _run(
    cmd: list[str], timeout: float, what: str, host: Host, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run a launcher command to its end, or stop it and all it started at ``timeout``.

    The command runs in a process group of its own: a launcher that hangs
    (or leaves a child holding its pipes) is killed with everything in it,
    and nothing is left behind.

    Raises:
        AgentError: it did not end within ``timeout`` seconds.
    """
    popen = subprocess.Popen(
        cmd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = popen.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_group(popen, signal.SIGKILL)
        popen.communicate()
        raise AgentError(
            f"the launcher did not {what} on {host.name} within {timeout:g}s, so it was "
            f"stopped with all it started; check --launcher (it ran {shlex.join(cmd)}) "
            "or raise --timeout"
        ) from exc
    except BaseException:  # Ctrl+C: the launcher goes too
        _kill_group(popen, signal.SIGKILL)
        popen.wait()
        raise
    return subprocess.CompletedProcess(cmd, popen.returncode, out, err)


def _kill_group(popen: subprocess.Popen[Any], sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    """Stop attached launchers and what they started (SIGTERM, then SIGKILL)."""
    for c in children:
        _kill_group(c, signal.SIGTERM)
    for c in children:
        try:
            c.wait(10)
        except subprocess.TimeoutExpired:
            _kill_group(c, signal.SIGKILL)
            c.wait()


def wait_answering(controls: list[str], timeout: float) -> list[str]:
    """Ask each agent ``Describe`` until it answers; the ones silent at ``timeout``."""
    return wait_started(controls, timeout)[0]


def wait_started(
    controls: list[str],
    timeout: float,
    exited: Callable[[list[str]], dict[str, str]] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """Ask each agent ``Describe`` until it answers, or ``exited`` says it ended.

    Returns:
        The controls still silent (at ``timeout`` or when one ended), and
        what ``exited`` said (asked every ``CHECK_EVERY`` seconds about the
        silent ones) once it said anything.
    """
    import zmq

    ctx: Any = zmq.Context.instance()
    deadline = time.monotonic() + timeout
    silent = list(controls)
    checked = time.monotonic()
    while silent and time.monotonic() < deadline:
        if exited is not None and time.monotonic() - checked >= CHECK_EVERY:
            checked = time.monotonic()
            ended = exited(silent)
            if ended:
                return silent, ended
        for addr in list(silent):
            s = secure_client(ctx.socket(zmq.DEALER), addr=addr)
            s.setsockopt(zmq.LINGER, 0)
            try:
                s.connect(addr)
                s.send_multipart(Codec(w.AGENT_INBOX).encode(w.Describe(1)))
                if s.poll(1000):
                    silent.remove(addr)
            finally:
                s.close(linger=0)
    return silent, {}


def configure_down(parser: argparse.ArgumentParser) -> None:
    """``zmesh down``'s options."""
    _common(parser)
    parser.add_argument(
        "--local", metavar="ADDR", default=None, help="on a host: stop our agent of ADDR"
    )
    json_arg(parser, '[{"host", "agent", "ok", "error"}]')


def run_down(args: argparse.Namespace) -> int:
    """Stop the agents of the host file (each through the launcher)."""
    if args.local:
        return _down_local(args.local, args.timeout)
    if not args.hostfile:
        raise AgentError("zmesh down needs a HOSTFILE")
    rows = []
    for h in read_hosts(args.hostfile):
        control = h.control(args.port)
        cmd = f"{args.zmesh} down --local {shlex.quote(control)}"
        try:  # a launcher that hangs is stopped with all it started; the next host goes on
            done = _run(_launch(args.launcher, h, cmd), args.timeout, "stop the agent", h)
        except AgentError as exc:
            rows.append({"host": h.name, "agent": control, "ok": False, "error": exc.message})
            continue
        err = (done.stderr or done.stdout).decode(errors="replace").strip()
        rows.append({"host": h.name, "agent": control, "ok": done.returncode == 0, "error": err})
    if args.json:
        print_json(rows)
    else:
        for r in rows:
            said = "stopped" if r["ok"] else r["error"]
            print(f"{r['host']} ({r['agent']}): {said}")
    return 0 if all(r["ok"] for r in rows) else 1


def _down_local(address: str, timeout: float) -> int:
    entries = [e for e in registry.live() if e.address == address]
    if not entries:
        print(f"zmesh down: no agent of yours at {address} on this host", file=sys.stderr)
        return 1
    for e in entries:
        os.kill(e.pid, signal.SIGTERM)  # it stops its procs, then exits
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(registry.running(e) for e in entries):
            return 0
        time.sleep(0.1)
    for e in entries:
        if registry.running(e):
            os.kill(e.pid, signal.SIGKILL)
    return 0


def _say(args: argparse.Namespace, line: str) -> None:
    if not args.json:
        print(line, file=sys.stderr, flush=True)
