"""Request and response shapes of the Toxiproxy 2.x API, as pydantic models.

Requests are validated strictly, field by field, the way Go's ``encoding/json`` fills a
struct: wrong JSON types are refused (``"enabled": "yes"``, ``"latency": 1.5``), integers
must fit int64, ``toxicity`` must fit float32, unknown keys are ignored and ``null`` keeps
the default. A refusal becomes :func:`~chaos.proxy.errors.bad_request_body` with a
message in Go's words (``json: cannot unmarshal string into Go struct field
Proxy.enabled of type bool``), so clients see what a real Toxiproxy would tell them.

Responses keep Toxiproxy's key order: a proxy is ``name, listen, upstream, enabled,
toxics`` and a toxic ``attributes, name, type, stream, toxicity``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from chaos.proxy import errors, gojson


class GoType:
    """Field metadata naming the Go type that Toxiproxy decodes the field into."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


GoString = Annotated[str, GoType("string")]
GoBool = Annotated[bool, GoType("bool")]
GoInt64 = Annotated[int, GoType("int64"), Field(ge=gojson.INT64_MIN, le=gojson.INT64_MAX)]
GoFloat32 = Annotated[
    float,
    GoType("float32"),
    Field(ge=-gojson.FLOAT32_MAX, le=gojson.FLOAT32_MAX, allow_inf_nan=False),
]
GoObject = Annotated[dict[str, Any], GoType("toxics.NoopToxic")]


class Direction(StrEnum):
    """Which way bytes flow: ``upstream`` is client → server, ``downstream`` the reverse."""

    UPSTREAM = "upstream"
    DOWNSTREAM = "downstream"


def parse_direction(stream: str) -> Direction:
    """Toxiproxy parses ``stream`` case-insensitively (``stream/direction.go``)."""
    try:
        return Direction(stream.lower())
    except ValueError:
        raise errors.invalid_stream() from None


class GoStruct(BaseModel):
    """A request body decoded like a Go struct: strict types, unknown keys ignored."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class ProxyFields(GoStruct):
    """``POST /proxies`` and each ``/populate`` item (Go struct ``Proxy``)."""

    name: GoString = ""
    listen: GoString = ""
    upstream: GoString = ""
    enabled: GoBool = True


class ProxyPatch(GoStruct):
    """``PATCH``/``POST /proxies/{p}``: absent fields keep the proxy's current value."""

    listen: GoString | None = None
    upstream: GoString | None = None
    enabled: GoBool | None = None


class ToxicFields(GoStruct):
    """``POST /proxies/{p}/toxics`` (Go struct ``ToxicWrapper``); attributes come later."""

    name: GoString = ""
    type: GoString = ""
    stream: GoString = Direction.DOWNSTREAM.value
    toxicity: GoFloat32 = 1.0
    attributes: GoObject | None = None


class ToxicPatch(GoStruct):
    """``PATCH``/``POST /proxies/{p}/toxics/{t}``: attributes merge onto the current ones."""

    toxicity: GoFloat32 | None = None
    attributes: GoObject | None = None


M = TypeVar("M", bound=BaseModel)


def without_nulls(data: Mapping[str, Any]) -> dict[str, Any]:
    """Go leaves a field unchanged when its JSON value is ``null``."""
    return {key: value for key, value in data.items() if value is not None}


def parse_struct(model: type[M], value: object, go_struct: str) -> M:
    """Validate a decoded JSON value (keys lower-cased) as ``model``, or raise a 400."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise errors.bad_request_body(
            f"json: cannot unmarshal {gojson.json_kind(value)} into Go value of type "
            f"toxiproxy.{go_struct}"
        )
    try:
        return model.model_validate(without_nulls(value))
    except ValidationError as exc:
        raise errors.bad_request_body(go_error(exc, model, go_struct)) from None


def go_error(exc: ValidationError, model: type[BaseModel], go_struct: str) -> str:
    """Go's wording for the first validation error of ``exc``."""
    first = exc.errors()[0]
    if first["type"] == "value_error":
        return str(first["msg"]).removeprefix("Value error, ")
    field = str(first["loc"][0]) if first["loc"] else ""
    value = first["input"]
    kind = gojson.json_kind(value)
    if kind == "number" and _go_type(model, field) in {"int64", "float32"}:
        kind = f"number {value}"
    return (
        f"json: cannot unmarshal {kind} into Go struct field {go_struct}.{field} "
        f"of type {_go_type(model, field)}"
    )


def _go_type(model: type[BaseModel], field: str) -> str:
    info = model.model_fields.get(field)
    if info is None:
        return "interface {}"
    # ``GoX | None`` keeps the metadata inside the union's Annotated member.
    candidates = list(info.metadata)
    for member in get_args(info.annotation):
        candidates.extend(getattr(member, "__metadata__", ()))
    return next((m.name for m in candidates if isinstance(m, GoType)), "interface {}")


AttributeValue = int | float | str | bool


class ToxicView(BaseModel):
    """A toxic as the API shows it. Every attribute of the type is always present."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    attributes: dict[str, AttributeValue] = Field(default_factory=dict)
    name: str
    type: str
    stream: str
    toxicity: float

    def to_wire(self) -> dict[str, object]:
        return {
            "attributes": dict(self.attributes),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": gojson.float32_value(self.toxicity),
        }


class ProxyView(BaseModel):
    """A proxy as the API shows it, with its toxics (upstream chain first)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    listen: str
    upstream: str
    enabled: bool
    toxics: tuple[ToxicView, ...] = ()

    def to_wire(self) -> dict[str, object]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [toxic.to_wire() for toxic in self.toxics],
        }
