"""The actor process: its server, its actors' mailboxes, and the relay it can be."""
