"""Field types shared by every policy kind, and by every record of :mod:`gtm.models`.

This is the one definition of an id, a country code and a model name: ``gtm`` imports
them from here (policies is the bottom layer), so an id valid in a policy file is valid
as a region, tenant or etcd key segment, and the reverse. Each type validates with a
message that says what was expected, and still publishes its pattern in the JSON Schema
for editors. The whole value must match (``fullmatch``: a trailing newline, which ``$``
alone lets through, is refused).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

_IDENTIFIER = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_COUNTRY = re.compile(r"^[A-Z]{2}$")
_MODEL = re.compile(r"^[A-Za-z0-9._:/@+-]+$")
_PLUGIN_TYPE = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")


class Frozen(BaseModel):
    """Base for every policy model: immutable, and unknown fields are errors (a typo in
    a compliance rule must never be silently ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def _checker(pattern: re.Pattern[str], max_len: int, what: str) -> AfterValidator:
    def check(value: str) -> str:
        if len(value) > max_len or not pattern.fullmatch(value):
            raise ValueError(f"expected {what}, got {value!r}")
        return value

    return AfterValidator(check)


def _schema(pattern: re.Pattern[str], max_len: int, what: str) -> WithJsonSchema:
    schema: dict[str, Any] = {
        "type": "string",
        "pattern": pattern.pattern,
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
