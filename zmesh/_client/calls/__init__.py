"""The call path: runtimes, connections, requests in flight, and fan-out."""
