"""A host's processes: the agent, its forkserver, and the actor procs.

* ``agent``: the host agent (spawns, watches and reaps procs; speaks the
  control protocol);
* ``forkserver``: a warm interpreter the agent forks procs from;
* ``proc``: the actor process (mailboxes, endpoints, replies);
* ``janitor``, ``ptree``: cleaning up process trees when an agent dies;
* ``stacks``: a live proc's stacks, on request.
"""
