"""Names and field constraints: what a wire field may hold.

Every field of every message an agent or a proc receives is checked when it
is decoded (``zmesh._wire.messages`` annotates its fields with the types
here), and ``check_name`` refuses a bad name before anything is sent.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

#
# Every field of every message an agent or a proc receives is checked when
# it is decoded, so a handler only ever sees values of the right type and
# range (a message that fails is answered with an error, or dropped). Names
# end up in file names (a proc's log is ``<mesh>.<rank>.g<gen>.log``), so
# they are restricted to a safe set of characters, without "..". Anchored
# with \Z, not $: a regex's $ also matches before a final newline.

NAME_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9_.-]{1,128}\Z"
_NAME_RE = re.compile(NAME_PATTERN)
NAME_RULE = "1-128 letters, digits, '_', '.' or '-', without '..'"
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, description=NAME_RULE)]
# GetState's name may be empty: every mesh.
NameOrAll = Annotated[str, msgspec.Meta(pattern=r"^\Z|" + NAME_PATTERN)]
# Text that becomes a path, an argument or an environment entry: no NUL.
Text = Annotated[str, msgspec.Meta(pattern=r"^[^\x00]*$", max_length=4096)]
Id = Annotated[str, msgspec.Meta(pattern=r"^[^\x00]*$", min_length=1, max_length=256)]
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[^=\x00]+$", max_length=1024)]
EnvValue = Annotated[str, msgspec.Meta(pattern=r"^[^\x00]*$", max_length=1 << 20)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Size = Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]
RankNo = Annotated[int, msgspec.Meta(ge=0, lt=1 << 20)]
Dims = Annotated[dict[Name, Size], msgspec.Meta(max_length=16)]
MAX_RANKS_PER_HOST = 4096


def check_name(name: object, what: str, reserve: int = 0) -> str:
    """Return ``name`` if it is a safe name, else raise before anything is sent.

    Args:
        reserve: characters zmesh appends to it (a mesh gets ``-<8 hex>``).

    Raises:
        ValueError: ``name`` is not a ``str`` of 1-128 letters, digits,
            ``_``, ``.`` or ``-`` (and has no ``..``).
    """
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > 128 - reserve:
        rule = NAME_RULE if not reserve else NAME_RULE.replace("128", str(128 - reserve))
        raise ValueError(f"{what} {name!r} is not a valid name: use {rule}")
    return name
