"""A proc's setup as it travels in its environment: names, and CPU lists.

Shared by the caller that describes it (``zmesh._client.control.procsetup``) and
the proc that applies it (``zmesh._host.proc.procsetup``).
"""

from __future__ import annotations

# The variables that carry the setup to a proc; it takes them out of its
# environment first thing, so nothing it starts inherits them.
BOOTSTRAP_VAR = "ZMESH_BOOTSTRAP"
PROC_BIND_VAR = "ZMESH_PROC_BIND"
CWD_VAR = "ZMESH_CWD"
# Built-in bootstraps, by the word that names them.
BUILTIN_BOOTSTRAPS = ("cuda",)
# What a proc_bind entry may say (Monarch's keys): CPUs as a Linux cpu list
# ("0-3,8"), or NUMA nodes whose CPUs the proc runs on (``membind`` is
# taken as ``cpunodebind``: memory follows the CPUs that first touch it).
BIND_KEYS = ("cpus", "physcpubind", "cpunodebind", "membind")


def cpu_list(text: str) -> set[int]:
    """The numbers of a Linux cpu list (``"0-3,8"``).

    Raises:
        ValueError: it is not one.
    """
    out: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"not a cpu list: {text!r}")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"not a cpu list: {text!r}")
        out.update(range(first, last + 1))
    return out
