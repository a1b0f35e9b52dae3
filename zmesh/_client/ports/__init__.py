"""Ports, channels and streams: values that travel outside a call's one reply."""
