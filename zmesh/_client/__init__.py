"""The user's process: the runtime, its meshes and the calls it makes, in four rooms by role.

* ``handles``: what the user holds: ``HostMesh``/``ProcMesh``/``ActorMesh``
  (``mesh``, ``hosts``), endpoint references and their adverbs (``adverbs``,
  ``accumulate``), and meshes whose actors live in this process (``inprocess``,
  and their transport ``localranks``);
* ``calls``: the call path: what every transport of a call does (``transport``),
  the runtime of an event loop and its I/O thread (``runtime``), connections
  to procs and their backpressure (``connections``), requests in flight
  (``inflight``), the sync lane (``lanes``), calls waiting for a mesh
  (``pending``), fan-outs by proc (``grouping``) and by host (``tree``,
  ``treeanswers``), ``Future``, ``Stream`` and ``ValueMesh``;
* ``ports``: values outside a call's one reply: ports and channels
  (``channels``, ``portsockets``, ``portserver``, ``portcalls``) and
  generator endpoints' streams (``streams``);
* ``control``: the control plane: agents and their streams (``agents``,
  ``agentconn``, ``controller``), failures up the tree (``faults``,
  ``actorwatch``), spawning and stopping (``spawning``, ``procstart``,
  ``stopping``, ``named``), this process as an owner (``local``), detached
  names (``lookup``) and actors' output on the terminal (``logforward``).

The call path is the core: it imports neither handles nor ports
(``tests/test_layers.py``).
"""
