"""The user's process: the runtime, its meshes and the calls it makes.

* ``runtime``: the runtime of an event loop (calls out, replies in) and the I/O thread;
  ``connections``: its connections to procs, their backpressure and drops;
  ``inflight``: requests in flight and their fates;
* ``controller``: agents' supervision streams turned into mesh state; ``agentconn``: one
  agent's control socket and stream; ``agentfates``: what a silent or restarted agent
  means for its ranks;
* ``mesh``: ``HostMesh``/``ProcMesh``/``ActorMesh`` handles; ``spawning``: the work of
  spawning and stopping (``procstart``: procs through their agents); ``pending``: calls
  waiting for a mesh to be ready;
* ``meshstate``, ``values``: ``mesh.state()``, ``ValueMesh``; ``faults``: ``MeshFailure``
  and the hooks; ``this_proc``, ``singletons``: Monarch's process-level helpers;
* ``adverbs``: ``call``, ``call_one``, ``broadcast``, ``choose``, ``stream``;
  ``grouping``: fan-outs to several actors per proc, one message per proc;
* ``future``: ``zmesh.Future``, awaitable or ``.get()`` from plain code;
* ``local``: this process as an owner (its agents, heartbeats, exit);
* ``lookup``: detached services and meshes filed by name, and ``zmesh.lookup``;
* ``shutdown``: ``zmesh.shutdown()``.
"""
