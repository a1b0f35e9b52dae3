"""What crosses a socket, in every zmesh process.

* ``messages``: the wire messages (msgspec structs) and their field rules;
* ``codec``: user values in and out of messages, and batches of messages;
* ``zsock``: ZeroMQ sockets on an asyncio loop, the fast way;
* ``security``: CURVE keys, and who may connect to an agent or a proc.
"""
