"""``zmesh.http``: detached services over HTTP/JSON and Server-Sent Events.

``zmesh http`` (``zmesh.cli.http``) serves them from the command line;
``zmesh.http.app(...)`` is the same gateway as an ASGI application, to mount
in a Starlette or FastAPI application or serve with any ASGI server. Install
with ``pip install 'zmesh[http]'`` (uvicorn, for the command); ``import
zmesh`` never imports this package.

Modules, one job each: ``app`` (routes and calls), ``catalog`` (service
handles and sessions), ``binding`` (JSON arguments checked against type
hints), ``schemas`` (JSON schemas and OpenAPI), ``sse`` (streams),
``errors`` (statuses), ``tokens`` (the bearer token), ``asgi`` (requests
and responses), ``server`` (uvicorn, the ready line, signals).
"""

from __future__ import annotations

from zmesh.http.app import Gateway, app

__all__ = ["Gateway", "app"]
