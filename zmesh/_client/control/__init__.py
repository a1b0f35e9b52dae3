"""The control plane, as the caller sees it: agents, supervision, spawning and stopping."""
