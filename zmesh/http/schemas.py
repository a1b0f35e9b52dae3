"""JSON schemas of a service's endpoints, from their type hints (msgspec), and the
OpenAPI document of every service the gateway serves."""

from __future__ import annotations

import inspect
from typing import Any

import msgspec

from zmesh.http.binding import Binder

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            "required": ["type", "message"],
        }
    },
    "required": ["error"],
}


class Schemas:
    """Collects the schemas of endpoints; named types go to ``defs`` once, referred to
    with ``template`` (``"#/$defs/{name}"``, or OpenAPI's components)."""

    def __init__(self, template: str = "#/$defs/{name}") -> None:
        self.template = template
        self.defs: dict[str, Any] = {}

    def of(self, hint: Any) -> dict[str, Any]:
        """The schema of one type (``{}``, anything, where msgspec cannot describe it)."""
        if hint is Any:
            return {}
        try:
            (schema,), defs = msgspec.json.schema_components([hint], ref_template=self.template)
        except (TypeError, ValueError):
            return {}
        self.defs.update(defs)
        return dict(schema)

    def endpoint(self, binder: Binder) -> dict[str, Any]:
        """``{"name", "stream", "params", "request", "returns"}`` of one endpoint."""
        sig = binder.signature
        out: dict[str, Any] = {"name": binder.endpoint, "stream": binder.stream}
        if sig is None:  # its hints did not travel: any arguments
            return {**out, "params": None, "request": _REQUEST_ANY, "returns": {}}
        params = [
            {
                "name": p.name, "kind": _KINDS[p.kind], "required": not p.has_default
                and p.kind not in (_VAR_POSITIONAL, _VAR_KEYWORD), "schema": self.of(p.hint),
            }
            for p in sig.params
        ]  # fmt: skip
        return {
            **out,
            "params": params,
            "request": _request(params),
            "returns": self.of(sig.returns),
        }


_VAR_POSITIONAL = inspect.Parameter.VAR_POSITIONAL
_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD
_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "positional",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional_or_keyword",
    inspect.Parameter.VAR_POSITIONAL: "var_positional",
    inspect.Parameter.KEYWORD_ONLY: "keyword",
    inspect.Parameter.VAR_KEYWORD: "var_keyword",
}
_REQUEST_ANY: dict[str, Any] = {
    "type": "object",
    "properties": {"args": {"type": "array"}, "kwargs": {"type": "object"}},
}


def _request(params: list[dict[str, Any]]) -> dict[str, Any]:
    """The request body's schema: ``args`` positional, ``kwargs`` by name."""
    positional = [p for p in params if p["kind"] in ("positional", "positional_or_keyword")]
    named = [p for p in params if p["kind"] in ("positional_or_keyword", "keyword")]
    var_pos = next((p for p in params if p["kind"] == "var_positional"), None)
    var_kw = next((p for p in params if p["kind"] == "var_keyword"), None)
    args: dict[str, Any] = {"type": "array", "prefixItems": [p["schema"] for p in positional]}
    args["items"] = var_pos["schema"] if var_pos is not None else False
    kwargs: dict[str, Any] = {
        "type": "object",
        "properties": {p["name"]: p["schema"] for p in named},
        "additionalProperties": var_kw["schema"] if var_kw is not None else False,
    }
    must = [p["name"] for p in params if p["kind"] == "keyword" and p["required"]]
    if must:
        kwargs["required"] = must
    return {
        "type": "object",
        "properties": {"args": args, "kwargs": kwargs},
        "additionalProperties": False,
    }


def openapi(
    services: dict[str, list[dict[str, Any]]], defs: dict[str, Any], version: str
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``services`` (name -> its endpoints' schemas)."""
    paths: dict[str, Any] = {}
    errors = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for name, endpoints in sorted(services.items()):
        for ep in endpoints:
            if ep["stream"]:
                ok = {"text/event-stream": {"schema": {"type": "string"},
                                            "x-item-schema": ep["returns"]}}  # fmt: skip
            else:
                result = {"result": ep["returns"]}
                ok = {"application/json": {"schema": {
                    "type": "object", "properties": result, "required": ["result"],
                }}}  # fmt: skip
            paths[f"/v1/{name}/{ep['name']}"] = {
                "post": {
                    "operationId": f"{name}.{ep['name']}",
                    "tags": [name],
                    "parameters": [_SESSION_HEADER],
                    "requestBody": {
                        "required": False,
                        "content": {"application/json": {"schema": ep["request"]}},
                    },
                    "responses": {
                        "200": {"description": "the endpoint's result", "content": ok},
                        **{str(s): {"description": d, "content": errors} for s, d in _ERRORS},
                    },
                }
            }
    return {
        "openapi": "3.1.0",
        "info": {"title": "zmesh http", "version": version},
        "paths": paths,
        "components": {
            "schemas": {**defs, "Error": ERROR_SCHEMA},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


_SESSION_HEADER = {
    "name": "X-Zmesh-Session",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
}
_ERRORS = [
    (401, "no valid bearer token"),
    (404, "no such service or endpoint"),
    (422, "arguments that do not fit the endpoint"),
    (500, "the endpoint raised"),
    (503, "no healthy replica, or overloaded: see Retry-After"),
    (504, "the request's timeout passed"),
]
