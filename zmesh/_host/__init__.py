"""A host's processes: the agent, its forkserver, and the actor procs.

* ``agent``: the host agent (spawns, watches and reaps procs; speaks the
  control protocol), with ``agentops`` (its read-only requests: state,
  stats, logs, health, stacks), ``meshorders`` (create or update, stop),
  ``reaper`` (seeing procs exit), ``detached`` (meshes kept past their
  owner, by name) and ``restarter`` (a detached service's orchestrator
  started again when its proc dies);
* ``forkserver``: a warm interpreter the agent forks procs from, with
  ``forking`` (forks that are the agent's children: ``clone(CLONE_PARENT)``
  or a middle child) and ``forklaunch`` (its start, before the agent's imports);
* ``proc``: the actor process (its entry point; sockets, dispatch, replies),
  with ``proclink`` (its sockets, hello and heartbeats), ``procreplies``
  (failures, the exit on ``SystemExit``), ``mailbox`` (an actor's queue and
  run loop; ``sidecalls``: what runs beside it), ``spawnactor`` (building
  actors), ``actors`` (several actors of one mesh in the proc: their group,
  and one gathered answer per fan-out), ``procboot`` (its setup before it
  serves) and ``lifecycle`` (``__cleanup__``, the proc's exit);
* ``janitor``, ``ptree``: cleaning up process trees when an agent dies;
* ``stacks``: a live proc's stacks, on request.
"""
