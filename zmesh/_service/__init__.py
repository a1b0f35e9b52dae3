"""Services: replicated, self-healing actor meshes behind one handle.

Runs in the process that owns the service.

* ``service``: the ``Service`` handle and its orchestrator;
* ``routing``: settings, statistics, routers and sessions;
* ``endpoint``: ``svc.endpoint``'s adverbs, from any thread;
* ``orchestrator``: a detached service's supervisor, in an actor on an agent,
  with ``adoption`` (its replicas outlive it; a restarted one takes them over);
* ``supervisor``: spawns and replaces replicas, with ``health`` (their checks);
* ``dispatch`` (with its records in ``requests``, and ``replicastates``: what
  a replica's change of state does): where each request goes, returned as
  ``decisions`` (send, settle, replace, wake) and never called back;
* ``client``: carries those decisions out on one runtime, and ``Follower``;
* ``streaming``: generator endpoints through a service.
"""
