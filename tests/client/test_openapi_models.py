"""The client's models, problem codes and paths against the service's own
/openapi.json: a field renamed, retyped or made nullable on the service
fails here before it fails on a kiosk."""

from __future__ import annotations

import dataclasses
import typing
from datetime import datetime
from typing import Any, Dict, List, Tuple

import httpx
import pytest

from token_billing_kiosk import (
    Balance,
    Event,
    Grant,
    Job,
    JobReservation,
    LedgerEntry,
    Reservation,
    TopupFiring,
    TopupRule,
)
from token_billing_kiosk._errors import ERRORS_BY_CODE, PROBLEM_FIELDS
from token_billing_kiosk._events import EVENT_DATA
from token_billing_kiosk._models import EVENT_TYPES, JOB_TERMINAL_STATUSES

MODELS = [
    Balance, Event, Grant, Job, JobReservation, LedgerEntry, Reservation, TopupFiring, TopupRule,
]

# The requests the client sends: (method, OpenAPI path).
CLIENT_PATHS = [
    ("get", "/v1/accounts/{account_id}"),
    ("post", "/v1/accounts/{account_id}/jobs"),
    ("get", "/v1/accounts/{account_id}/jobs/{request_id}"),
    ("post", "/v1/accounts/{account_id}/reservations"),
    ("get", "/v1/accounts/{account_id}/reservations/{reservation_id}"),
    ("post", "/v1/accounts/{account_id}/reservations/{reservation_id}/commit"),
    ("post", "/v1/accounts/{account_id}/reservations/{reservation_id}/release"),
    ("post", "/v1/accounts/{account_id}/reservations/{reservation_id}/extend"),
    ("get", "/v1/events"),
    ("get", "/v1/accounts/{account_id}/topup-rules"),
    ("get", "/v1/accounts/{account_id}/ledger"),
    ("get", "/v1/accounts/{account_id}/reservations"),
    ("get", "/v1/accounts/{account_id}/jobs"),
    ("get", "/v1/accounts/{account_id}/grants"),
]


@pytest.fixture(scope="module")
def document(service_url: str) -> Dict[str, Any]:
    response = httpx.get(service_url + "/openapi.json", timeout=10)
    response.raise_for_status()
    return dict(response.json())


def schema(document: Dict[str, Any], name: str) -> Dict[str, Any]:
    schemas = document["components"]["schemas"]
    assert name in schemas, f"/openapi.json has no schema {name}"
    return dict(schemas[name])


def resolve(document: Dict[str, Any], node: Dict[str, Any]) -> Dict[str, Any]:
    while "$ref" in node:
        node = schema(document, node["$ref"].rsplit("/", 1)[-1])
    return node


def json_types(document: Dict[str, Any], node: Dict[str, Any]) -> Tuple[set, bool]:
    """The JSON types a property may hold (``$ref`` → object) and whether it
    may be null."""
    types: set = set()
    nullable = False
    for option in node.get("oneOf", node.get("anyOf", [node])):
        if "$ref" in option:
            option = resolve(document, option)
        kind = option.get("type")
        for one in kind if isinstance(kind, list) else [kind]:
            if one == "null":
                nullable = True
            elif one is not None:
                types.add(one)
        if option.get("nullable"):
            nullable = True
    return types, nullable


def python_type(annotation: Any) -> Tuple[Any, bool]:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union and type(None) in args:
        (inner,) = [arg for arg in args if arg is not type(None)]
        return inner, True
    return annotation, False


EXPECTED = {int: {"integer"}, str: {"string"}, datetime: {"string"}, bool: {"boolean"}}


def test_every_model_field_is_in_the_service_schema_with_its_type(
    document: Dict[str, Any]
) -> None:
    problems: List[str] = []
    checks = []
    for model in MODELS:
        spec = schema(document, model.OPENAPI_SCHEMA)
        # A union (the events, one schema per type): every member holds
        # the fields.
        for variant in spec.get("oneOf", [spec]):
            checks.append((model, resolve(document, variant)))
    for model, spec in checks:
        properties = spec["properties"]
        required = set(spec.get("required", []))
        hints = typing.get_type_hints(model)
        for field in dataclasses.fields(model):
            where = f"{model.__name__}.{field.name} ({model.OPENAPI_SCHEMA})"
            if field.name not in properties:
                problems.append(f"{where}: not in the schema")
                continue
            inner, optional = python_type(hints[field.name])
            types, nullable = json_types(document, properties[field.name])
            if not optional and (nullable or field.name not in required):
                problems.append(f"{where}: the client needs it, the service may omit it")
            if inner in EXPECTED:
                wanted = EXPECTED[inner]
                if not types & wanted:
                    problems.append(f"{where}: schema types {types}, client reads {inner}")
                if inner is datetime:
                    fmt = resolve(document, properties[field.name]).get("format")
                    if fmt != "date-time":
                        problems.append(f"{where}: format {fmt}, client parses a timestamp")
            elif "object" not in types and not types <= {"object"}:
                problems.append(f"{where}: schema types {types}, client reads an object")
    assert not problems, "\n".join(problems)


def test_the_problem_codes_and_fields_the_client_maps_exist(document: Dict[str, Any]) -> None:
    codes = set(schema(document, "ProblemCode")["enum"])
    assert set(ERRORS_BY_CODE) <= codes, set(ERRORS_BY_CODE) - codes
    properties = schema(document, "Problem")["properties"]
    assert set(PROBLEM_FIELDS) <= set(properties), set(PROBLEM_FIELDS) - set(properties)


def test_the_paths_the_client_calls_exist(document: Dict[str, Any]) -> None:
    missing = [
        f"{method.upper()} {path}"
        for method, path in CLIENT_PATHS
        if method not in document["paths"].get(path, {})
    ]
    assert not missing, missing
    job_get = document["paths"]["/v1/accounts/{account_id}/jobs/{request_id}"]["get"]
    wait = [p for p in job_get["parameters"] if p["name"] == "wait_seconds"]
    assert wait and wait[0]["schema"].get("maximum") == 30, wait
    # watch() starts at "now" or an instant with the feed's `start`.
    events = document["paths"]["/v1/events"]["get"]["parameters"]
    assert [p for p in events if p["name"] == "start"], events


def test_terminal_job_statuses_are_the_services(document: Dict[str, Any]) -> None:
    status = resolve(document, schema(document, "JobView")["properties"]["status"])
    assert set(JOB_TERMINAL_STATUSES) <= set(status["enum"]), status


def test_the_event_types_are_the_services(document: Dict[str, Any]) -> None:
    """The client's list of event types is the document's: one schema per
    type in the ``oneOf`` of ``EventView``, mapped by its discriminator."""
    union = schema(document, "EventView")
    mapped = set(union["discriminator"]["mapping"])
    listed = set()
    for variant in union["oneOf"]:
        (value,) = resolve(document, variant)["properties"]["type"]["enum"]
        listed.add(value)
    assert mapped == listed
    assert set(EVENT_TYPES) == listed, (set(EVENT_TYPES) ^ listed)
    assert len(EVENT_TYPES) == len(set(EVENT_TYPES))


def typed_dict_problems(
    document: Dict[str, Any], typed: Any, spec: Dict[str, Any], where: str
) -> List[str]:
    """A TypedDict against an object schema: the same members, the same
    required ones, each of a JSON type the schema allows, nullable exactly
    where the schema is; nested TypedDicts likewise."""
    problems: List[str] = []
    properties = spec.get("properties", {})
    hints = typing.get_type_hints(typed)
    if set(hints) != set(properties):
        problems.append(f"{where}: members {sorted(hints)}, schema {sorted(properties)}")
    if set(typed.__required_keys__) != set(spec.get("required", [])):
        problems.append(f"{where}: required {sorted(typed.__required_keys__)}, "
                        f"schema {sorted(spec.get('required', []))}")
    for name in set(hints) & set(properties):
        inner, optional = python_type(hints[name])
        types, nullable = json_types(document, properties[name])
        if optional != nullable:
            problems.append(f"{where}.{name}: nullable {optional}, schema {nullable}")
        origin = typing.get_origin(inner) or inner
        wanted = {int: {"integer"}, str: {"string"}, dict: {"object"}, list: {"array"}}.get(
            origin, {"object"}
        )
        if not types & wanted:
            problems.append(f"{where}.{name}: schema types {types}, client has {inner}")
        if hasattr(inner, "__required_keys__"):
            problems += typed_dict_problems(
                document, inner, resolve(document, properties[name]), f"{where}.{name}"
            )
    return problems


def test_each_event_types_data_is_the_documents(document: Dict[str, Any]) -> None:
    """EVENT_DATA's TypedDict for each type has the members of that type's
    ``data`` in the document (``EventView``'s ``oneOf``), typed alike."""
    union = schema(document, "EventView")
    problems: List[str] = []
    seen = set()
    for variant in union["oneOf"]:
        spec = resolve(document, variant)
        (event_type,) = spec["properties"]["type"]["enum"]
        seen.add(event_type)
        if event_type not in EVENT_DATA:
            problems.append(f"{event_type}: no TypedDict in EVENT_DATA")
            continue
        data = resolve(document, spec["properties"]["data"])
        problems += typed_dict_problems(
            document, EVENT_DATA[event_type], data, f"{event_type} data"
        )
    assert set(EVENT_DATA) == seen, set(EVENT_DATA) ^ seen
    assert not problems, "\n".join(problems)
