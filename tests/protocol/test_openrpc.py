"""The OpenRPC document is generated from the registry and is self-contained."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from msgspec import inspect as mi

from agentsd_protocol.api.events import KINDS
from agentsd_protocol.methods import METHODS, NOTIFICATIONS
from agentsd_protocol.openrpc import build_openrpc


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    built = build_openrpc("9.9.9")
    # What a client sees: the document after a trip through JSON.
    decoded: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(built))
    return decoded


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                assert isinstance(value, str)
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve"
        node = node[part]
    return node


def check_openrpc_document(doc: dict[str, Any]) -> None:
    """Shared with the end-to-end test of ``rpc.discover``."""
    assert doc["openrpc"].startswith("1.3.")
    assert doc["info"]["title"]
    assert isinstance(doc["info"]["version"], str)
    assert [m["name"] for m in doc["methods"]] == list(METHODS)
    for method in doc["methods"]:
        registered = METHODS[method["name"]]
        assert method["paramStructure"] == "by-name"
        assert method["summary"] == registered.summary
        info = mi.type_info(registered.params)
        assert isinstance(info, mi.StructType)
        assert [p["name"] for p in method["params"]] == [f.encode_name for f in info.fields]
        assert {p["name"] for p in method["params"] if p["required"]} == {
            f.encode_name for f in info.fields if f.required
        }
        for param in method["params"]:
            assert isinstance(param["schema"], dict)
        assert method["result"]["name"]
        assert method["x-mutation"] is registered.mutation
        assert method["x-streaming"] is (registered.stream_key is not None)
        assert isinstance(method["result"]["schema"], dict)
    schemas = doc["components"]["schemas"]
    assert isinstance(schemas, dict)
    all_refs = list(refs(doc))
    assert all_refs, "struct results should be referenced, not inlined"
    for ref in all_refs:
        assert ref.startswith("#/components/schemas/"), ref
        assert isinstance(resolve(doc, ref), dict)


def test_the_document_is_openrpc_1_3_with_one_method_per_registry_entry(
    doc: dict[str, Any],
) -> None:
    check_openrpc_document(doc)
    assert doc["info"]["version"] == "9.9.9"


def test_method_names_are_unique_and_mutations_are_known(doc: dict[str, Any]) -> None:
    names = [m["name"] for m in doc["methods"]]
    assert len(names) == len(set(names))
    assert METHODS["daemon.shutdown"].mutation
    assert not METHODS["daemon.ping"].mutation


def test_struct_results_are_component_schemas(doc: dict[str, Any]) -> None:
    by_name = {m["name"]: m for m in doc["methods"]}
    schema = resolve(doc, by_name["daemon.ping"]["result"]["schema"]["$ref"])
    assert schema["type"] == "object"
    assert "pong" in schema["properties"]


def test_unknown_params_are_refused_in_the_schema_too(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    for method in METHODS.values():
        name = method.params.__name__
        assert schemas[name].get("additionalProperties") is False, name


def test_every_journal_kind_is_in_the_document(doc: dict[str, Any]) -> None:
    """A client in another language generates the journal's types from the
    document: every kind the daemon can write is a schema, tagged by ``kind``."""
    schemas = doc["components"]["schemas"]
    union = schemas["Event"]
    assert union["discriminator"]["propertyName"] == "kind"
    mapping = union["discriminator"]["mapping"]
    assert set(mapping) == set(KINDS)
    for kind, event_type in KINDS.items():
        schema = resolve(doc, mapping[kind])
        assert schema is schemas[event_type.__name__]
        assert schema["properties"]["kind"] == {"enum": [kind]}
        info = mi.type_info(event_type)
        assert isinstance(info, mi.StructType)
        assert set(schema["properties"]) == {"kind"} | {f.encode_name for f in info.fields}


def test_every_notification_payload_is_in_the_document(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    listed = {n["name"]: n for n in doc["x-notifications"]}
    assert set(listed) == set(NOTIFICATIONS)
    for name, notification in NOTIFICATIONS.items():
        assert resolve(doc, listed[name]["params"]["$ref"]) is schemas[notification.params.__name__]
    journal_event = schemas["JournalEvent"]
    assert "Event" in journal_event["properties"]["body"]["description"]
