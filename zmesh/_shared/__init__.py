"""Pure logic more than one process runs (no sockets in it).

* ``state``: the supervision state machine (agent, client, ``zmesh top``);
* ``liveness``: busy or hung, here or gone (agent, client);
* ``stats``: endpoint counters and samplers (procs, agents, ``zmesh top``);
* ``paths``: the private directories for sockets and logs (everyone);
* ``invoke``: running one endpoint call, and how it ended (procs, and
  ``zmesh.testing.local_mesh``).
"""
