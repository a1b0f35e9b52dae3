"""The base of every wire message, and how user values ride in one.

Every message is a ``msgspec`` tagged, frozen ``Struct`` encoded as msgpack
(``zmesh._wire.messages`` has the unions each socket decodes).
"""

from __future__ import annotations

from typing import Any

import msgspec

from zmesh._wire.names import Count


class Message(msgspec.Struct, tag=True, tag_field="msg", frozen=True, array_like=True):
    """The base of every wire message: a msgpack array tagged by its class name."""


# --------------------------------------------------------------- payloads


class Payload(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """User values: plain ``args``/``kwargs`` or one pickle ``blob``."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    blob: bytes | None = None
    nbuf: Count = 0  # out-of-band pickle buffers, in frames after the envelope
