"""Generate the OpenRPC 1.3 document from the method registry."""

from __future__ import annotations

from typing import Any

import msgspec

from agentsd_protocol.api.events import Event
from agentsd_protocol.methods import METHODS, NOTIFICATIONS

OPENRPC_VERSION = "1.3.2"
_REF_TEMPLATE = "#/components/schemas/{name}"


def build_openrpc(version: str) -> dict[str, Any]:
    """The whole API as an OpenRPC document; params are by name, one content
    descriptor per field of the method's params Struct. ``components.schemas.Event``
    is the journal's event union (tagged by ``kind``): a ``JournalEvent``'s body is
    the schema its ``kind`` names, without the tag."""
    methods = list(METHODS.values())
    types: list[Any] = []
    for m in methods:
        types.extend([m.params, m.result])
    notifications = list(NOTIFICATIONS.values())
    types.extend(n.params for n in notifications)
    schemas, components = msgspec.json.schema_components(
        [*types, Event], ref_template=_REF_TEMPLATE
    )
    components["Event"] = schemas[-1]
    schemas = schemas[:-1]
    out_methods = []
    for m, params_schema, result_schema in zip(
        methods,
        schemas[0 : 2 * len(methods) : 2],
        schemas[1 : 2 * len(methods) : 2],
        strict=True,
    ):
        params_def = _resolve(params_schema, components)
        required = set(params_def.get("required", []))
        params = [
            {"name": name, "required": name in required, "schema": schema}
            for name, schema in params_def.get("properties", {}).items()
        ]
        out_methods.append(
            {
                "name": m.name,
                "summary": m.summary,
                "paramStructure": "by-name",
                "params": params,
                "result": {"name": f"{m.name}.result", "schema": result_schema},
                # Extensions: a mutation takes clientOperationId and is idempotent; a
                # streaming method's result names the route of the notifications after it.
                "x-mutation": m.mutation,
                "x-streaming": m.stream_key is not None,
            }
        )
    return {
        "openrpc": OPENRPC_VERSION,
        "info": {"title": "agentsd", "version": version},
        "methods": out_methods,
        "components": {"schemas": components},
        # OpenRPC has no notion of server-to-client notifications; list them here.
        "x-notifications": [
            {"name": n.name, "summary": n.summary, "params": schema}
            for n, schema in zip(notifications, schemas[2 * len(methods) :], strict=True)
        ],
    }


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    resolved: dict[str, Any] = components[ref.rsplit("/", 1)[-1]]
    return resolved
