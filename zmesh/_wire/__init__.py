"""What crosses a socket, in every zmesh process.

* ``messages``: every wire message by name, and the union each socket decodes;
* ``base``, ``data``, ``control``: the messages (msgspec structs): their base,
  the data plane (callers and procs), the control plane (agents);
* ``names``: field rules for names, sizes and text;
* ``codec``: user values in and out of messages, and batches of messages;
* ``zsock``: ZeroMQ sockets on an asyncio loop, the fast way;
* ``security``: CURVE keys, and who may connect to an agent or a proc.
"""
