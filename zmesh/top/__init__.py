"""``zmesh top``: a terminal dashboard of a live mesh, straight from its agents.

Parts that do not know of each other's insides:

* ``_collect``: follows every agent's stream (async) and produces a ``Snapshot``;
* ``_health``: a pure judgement of a snapshot: what is alive, what is a
  problem, what is history (``zmesh status``'s exit code, the folded rows);
* ``_view``: pure functions from a snapshot to rows (rates, percentiles,
  filters, sorting), with the actors pane's rows in ``_endpoints``;
* ``_render``: pure functions from rows to a ``rich`` frame (no clock reads),
  with each pane's table in ``_panes``, the number formats in ``_formats``,
  and what the user is looking at (the ``Screen``) in ``_screen``.

``_app`` runs them interactively; ``zmesh.cli.top`` holds the commands
(``top``, ``status``, ``ps``, ``stack``).
"""
