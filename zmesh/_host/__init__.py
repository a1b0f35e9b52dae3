"""A host's processes, in two rooms: the agent's and the proc's.

* ``agent``: the host agent's process (``hostagent``: spawns, watches and
  reaps procs; speaks the control protocol) with its proc table
  (``proctable``), its read-only requests (``agentops``), detached names
  (``detached``, ``restarter``), its forkserver (``forkserver``, ``forking``,
  ``forklaunch``, ``spawner``), logs (``logtail``, ``logcap``) and the
  cleaning up of process trees (``janitor``, ``ptree``, ``strays``);
* ``proc``: the actor process (``procserver``: its entry point, sockets,
  dispatch and replies) with its actors' mailboxes (``mailbox``,
  ``actorthread``, ``spawnactor``, ``lifecycle``, ``actordeath``), several
  actors per proc (``actors``, ``groupfast``), generators, response ports,
  cancels, and the relay a proc can be for its host (``relay``, ``relayown``,
  ``relayfold``).

The proc's room never imports the agent's (``tests/test_layers.py``): the
agent starts procs, a proc knows nothing of its agent's code.
"""
