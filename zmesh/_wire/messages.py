"""Wire messages: what crosses a socket between zmesh's processes.

Every message is a ``msgspec`` tagged, frozen ``Struct`` encoded as msgpack.
Each socket decodes with one decoder over the union of what it may receive
(``PROC_INBOX``, ``CLIENT_INBOX``, ...), defined here. Anything that fails to
decode is counted by the receiver and dropped, never fatal. How user values
travel inside a message is ``codec``'s business.

The messages themselves are in ``base`` (``Message``, ``Payload``), ``data``
(callers and procs) and ``control`` (agents, owners, observers); every name
is re-exported here, so code says ``w.Call`` whichever plane it belongs to.
"""

from __future__ import annotations

from typing import Any

import msgspec

from zmesh._wire.base import *
from zmesh._wire.control import *
from zmesh._wire.data import *
from zmesh._wire.names import check_name as check_name

# Messages that carry a request id in their first field and expect an
# answer: one that fails to decode is answered with an error naming why.
AGENT_REQUESTS = frozenset(
    {"CreateOrUpdate", "GetState", "Stop", "ListMeshes", "Describe", "GetStats", "GetLogs"}
    | {"FlushLogs"}
    | {"Detach", "Lookup", "StopDetached", "Adopt"}
)
PROC_REQUESTS = frozenset({"Call", "SpawnActor", "StopActor", "StreamCall", "GroupCall", "Relay"})

PROC_INBOX: Any = (
    Call | SpawnActor | StopActor | StreamCall | Credit | Cancel | CancelCall | GroupCall | Relay
)
CLIENT_INBOX: Any = (
    Reply | Failure | StreamItem | StreamEnd | StreamAlive | Gathered | GatheredFrames | RelayReply
)
PORT_INBOX: Any = PortSend
PORT_ACKS: Any = PortAck
AGENT_INBOX: Any = (
    CreateOrUpdate
    | GetState
    | Stop
    | ListMeshes
    | Describe
    | OwnerHeartbeat
    | OwnerGone
    | ProcHello
    | ProcHeartbeat
    | ProcStats
    | ServiceReport
    | GetStats
    | GetStack
    | GetHealth
    | GetLogs
    | FlushLogs
    | Detach
    | Lookup
    | StopDetached
    | Adopt
)
AGENT_REPLIES: Any = (
    Ack | StateReply | AgentInfo | StatsReply | StackReply | HealthReply | LogsReply | LookupReply
)
AGENT_REPLIES = AGENT_REPLIES | AdoptReply
# What a client's log forwarder decodes from an agent's log stream.
LOG_STREAM: Any = LogLines
STREAM: Any = Event | Heartbeat
# What an observer (``zmesh top``) decodes from an agent's two streams.
OBSERVER_STREAM: Any = Event | Heartbeat | Stats


# Message classes by tag, for ``codec.explain`` and for fuzzing.
KINDS: dict[str, type[msgspec.Struct]] = {c.__name__: c for c in Message.__subclasses__()}
KINDS["StreamCall"] = StreamCall  # a subclass of Call, not of Message directly
