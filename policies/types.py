"""Field types shared by every policy kind, and by every record of :mod:`gtm.models`.

This is the one definition of an id, a country code and a model name: ``gtm`` imports
them from here (policies is the bottom layer), so an id valid in a policy file is valid
as a region, tenant or etcd key segment, and the reverse. Each type is checked by
pydantic's own string constraints (compiled, and run on every request record the tiers
build), and any failure is reported as one error of type :data:`FORMAT_ERROR` whose
message says what was expected; the pattern is published in the JSON Schema for
editors. The whole value must match: a trailing newline is refused.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, GetPydanticSchema, WithJsonSchema
from pydantic_core import core_schema

#: The pydantic error type of a value that is not in one of these formats; its message
#: is "expected <what the format is>" (the loader adds the value it got).
FORMAT_ERROR = "format"

_IDENTIFIER = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"
_COUNTRY = r"^[A-Z]{2}$"
_MODEL = r"^[A-Za-z0-9._:/@+-]+$"
_PLUGIN_TYPE = r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$"


class Frozen(BaseModel):
    """Base for every policy model: immutable, and unknown fields are errors (a typo in
    a compliance rule must never be silently ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def _checker(pattern: str, max_len: int, what: str) -> GetPydanticSchema:
    def schema(_source: Any, _handler: Any) -> core_schema.CoreSchema:
        return core_schema.custom_error_schema(
            core_schema.str_schema(pattern=pattern, max_length=max_len),
            custom_error_type=FORMAT_ERROR,
            custom_error_message=f"expected {what}",
        )

    return GetPydanticSchema(get_pydantic_core_schema=schema)


def _schema(pattern: str, max_len: int, what: str) -> WithJsonSchema:
    schema: dict[str, Any] = {
        "type": "string",
        "pattern": pattern,
        "maxLength": max_len,
        "description": what,
    }
    return WithJsonSchema(schema)


_ID_WHAT = "a lowercase id (a-z, 0-9 and '-', at most 63 characters, e.g. 'eu-west')"
#: Region, zone, GPU, tenant, jurisdiction, rule, plugin ids: DNS-label-like, so they
#: appear in DNS names (``eu-west.api.<zone>``), etcd keys and Prometheus labels unescaped.
Identifier = Annotated[str, _checker(_IDENTIFIER, 63, _ID_WHAT), _schema(_IDENTIFIER, 63, _ID_WHAT)]

_CC_WHAT = "an ISO 3166-1 alpha-2 country code in upper case (e.g. 'DE')"
CountryCode = Annotated[str, _checker(_COUNTRY, 2, _CC_WHAT), _schema(_COUNTRY, 2, _CC_WHAT)]

# The same formats for values read outside a model (headers, command-line options):
# whole-string matches, so a trailing newline is refused here too.
_IDENTIFIER_RE = re.compile(_IDENTIFIER.removeprefix("^").removesuffix("$"))
_COUNTRY_RE = re.compile(_COUNTRY.removeprefix("^").removesuffix("$"))


def is_identifier(value: str) -> bool:
    """Whether ``value`` is an :data:`Identifier`."""
    return len(value) <= 63 and _IDENTIFIER_RE.fullmatch(value) is not None


def is_country_code(value: str) -> bool:
    """Whether ``value`` is a :data:`CountryCode`."""
    return _COUNTRY_RE.fullmatch(value) is not None


_MODEL_WHAT = "a model name as clients send it (e.g. 'meta-llama/Llama-3.1-8B-Instruct')"
ModelName = Annotated[str, _checker(_MODEL, 256, _MODEL_WHAT), _schema(_MODEL, 256, _MODEL_WHAT)]

_TYPE_WHAT = "a plugin type name (a-z, 0-9, '.', '_', '-', e.g. 'residency-filter')"
PluginType = Annotated[
    str, _checker(_PLUGIN_TYPE, 128, _TYPE_WHAT), _schema(_PLUGIN_TYPE, 128, _TYPE_WHAT)
]

Description = Annotated[str, Field(max_length=1024)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]
Weight = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Share = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
