"""Contracts at process boundaries that are no ZeroMQ socket.

Three things cross from one zmesh process to another outside the wire
messages, and each is a ``msgspec`` struct here, written and read as JSON
with ``msgspec.json`` on both sides (so a field that is missing, extra or of
the wrong type fails loudly at the reader, not later):

* ``ProcEnv``: what an agent tells a proc it starts, in the ``ZMESH_PROC``
  environment variable. Everything the proc starts inherits it, which is how
  the agent tells whose a stray process is (``strays.py``).
* ``ForkRequest`` and ``ForkReply``: one JSON object per line between an
  agent and its forkserver (``forkserver.py``), over pipes.
* ``AgentReady``: the line ``zmesh agent`` prints once it serves,
  ``ZMESH-AGENT-READY {json}``, which whoever started it waits for.
"""

from __future__ import annotations

import msgspec

from zmesh._wire.messages import MainSpec

PROC_ENV_VAR = "ZMESH_PROC"
READY_PREFIX = "ZMESH-AGENT-READY "


class ProcEnv(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a proc is: ``ZMESH_PROC``, from its agent (see ``ProcTable.spawn``)."""

    mesh: str
    rank: int
    generation: int
    dims: dict[str, int] = {}
    agent: str = ""  # the agent's control address: hello, heartbeats, stats
    agent_pid: int = 0  # 0: not checked (a proc whose parent is not its agent)
    host: str = ""  # the host's label
    bind: str = ""  # where the proc binds its ROUTER
    log_path: str = ""  # its stdout and stderr
    main: MainSpec = MainSpec()  # how it re-creates the client's __main__
    keys: str = ""  # the host's keys directory ("" = none)
    epoch: str = ""  # the agent's incarnation


class ForkRequest(msgspec.Struct, frozen=True, tag=True, forbid_unknown_fields=True):
    """Agent -> forkserver: fork a proc with this log, environment and cwd."""

    id: int
    log: str
    env: dict[str, str]
    cwd: str | None
    agent_pid: int  # the proc waits until the agent has adopted it


class ForkReady(msgspec.Struct, frozen=True, tag=True):
    """Forkserver -> agent, once: warm, and reading requests."""


class Forked(msgspec.Struct, frozen=True, tag=True):
    """Forkserver -> agent: request ``id`` is the proc ``pid``, the agent's child."""

    id: int
    pid: int


class ForkFailed(msgspec.Struct, frozen=True, tag=True):
    """Forkserver -> agent: request ``id`` could not be forked, and why."""

    id: int
    error: str


ForkReply = ForkReady | Forked | ForkFailed


class AgentReady(msgspec.Struct, frozen=True, kw_only=True):
    """What ``zmesh agent`` says of itself once it serves (its ready line)."""

    label: str
    control: str  # its control address: what a client connects to
    stream: str  # its event stream
    epoch: str
    pid: int
    log_dir: str


_proc_env = msgspec.json.Decoder(ProcEnv)
_fork_request = msgspec.json.Decoder(ForkRequest)
_fork_reply: msgspec.json.Decoder[ForkReply] = msgspec.json.Decoder(ForkReply)
_ready = msgspec.json.Decoder(AgentReady)
_encoder = msgspec.json.Encoder()


def encode(value: ProcEnv | ForkRequest | ForkReady | Forked | ForkFailed | AgentReady) -> bytes:
    """One of these contracts as JSON (one line: JSON strings escape newlines)."""
    return _encoder.encode(value)


def decode_proc_env(data: str | bytes) -> ProcEnv:
    """Read ``ZMESH_PROC``.

    Raises:
        msgspec.DecodeError: it is not a ``ProcEnv`` (with why).
    """
    return _proc_env.decode(data)


def proc_env_of(data: bytes | None) -> ProcEnv | None:
    """``ZMESH_PROC`` as some process's environment holds it, or ``None`` when
    it holds none, or one that is not a ``ProcEnv`` (a process may change it)."""
    if data is None:
        return None
    try:
        return _proc_env.decode(data)
    except msgspec.DecodeError:
        return None


def decode_fork_request(line: bytes) -> ForkRequest:
    """Read one request line, in the forkserver.

    Raises:
        msgspec.DecodeError: it is not a ``ForkRequest``.
    """
    return _fork_request.decode(line)


def decode_fork_reply(line: bytes) -> ForkReply:
    """Read one reply line, in the agent.

    Raises:
        msgspec.DecodeError: it is not a ``ForkReply``.
    """
    return _fork_reply.decode(line)


def ready_line(info: AgentReady) -> str:
    """The line ``zmesh agent`` prints once it serves."""
    return READY_PREFIX + encode(info).decode()


def parse_ready_line(line: bytes | str) -> AgentReady | None:
    """What an agent's ready line says, or ``None`` if ``line`` is not one.

    Raises:
        msgspec.DecodeError: it starts like one but does not decode.
    """
    text = line.decode() if isinstance(line, bytes) else line
    if not text.startswith(READY_PREFIX):
        return None
    return _ready.decode(text[len(READY_PREFIX) :])
