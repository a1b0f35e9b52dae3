"""The host agent's process and its forkserver: spawning, watching and reaping a host's procs."""
