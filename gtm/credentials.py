"""Credentials that stop at a tier: which request headers carry a client's secret.

A tenant's API key authenticates the tenant to gtm, not to a GPU worker. The tiers
that authenticate tenants (the front door and the regional LB, each from
``Authorization: Bearer <key>``, :mod:`gtm.inbound`) pass it on only to a tier that
authenticates it again: the front door to a regional LB, a regional LB to a peer
region it spills to. Towards a zone agent nothing needs it — the zone places by model
and load, never by tenant — so the regional LB drops it there, and the zone agent
drops whatever a client sent it directly and speaks to each worker with the worker's
own key (:mod:`zone_agent.credentials`). A worker therefore never sees (nor logs) a
tenant's key, and a vLLM started with ``--api-key`` accepts the zone's requests.

:data:`CLIENT_CREDENTIALS` is every header an OpenAI-compatible client sends its key
in: ``Authorization`` (the OpenAI SDKs), ``api-key`` (Azure OpenAI's SDK),
``x-api-key`` (Anthropic-style clients), and ``Proxy-Authorization`` (already
hop-by-hop: :data:`gtm.relay.HOP_BY_HOP`). gtm reads only the first; the others are
dropped all the same, as a key sent in them is a secret too.

A worker's own key is named by a :class:`KeyRef` (``file:PATH`` or ``env:NAME``, never
the key) and read by :func:`read_key` into a :class:`WorkerKey`, whose ``repr`` hides it;
errors name the file or the variable, never a value. Which worker gets which key is the
zone agent's (:mod:`zone_agent.credentials`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum

from pydantic import Field

from gtm.errors import ConfigError
from gtm.models import Frozen

#: Request headers that carry a client's credential (lower case).
CLIENT_CREDENTIALS: frozenset[str] = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key"}
)

#: The header a worker's key travels in, as vLLM's ``--api-key`` expects it.
WORKER_AUTHORIZATION = "Authorization"
#: The environment variable vLLM reads its key from when ``--api-key`` is not given
#: (``gtm gpu-sim`` too).
VLLM_API_KEY_ENV = "VLLM_API_KEY"

#: Longest key file read (a key is a line; anything larger is not one).
MAX_KEY_BYTES = 4096
#: What an environment variable's name may be.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class KeySource(StrEnum):
    FILE = "file"
    ENV = "env"


class KeyRef(Frozen):
    """Where a key is read: ``file:PATH`` or ``env:NAME`` — never the key itself."""

    source: KeySource
    name: str = Field(min_length=1, max_length=4096)

    def __str__(self) -> str:
        return f"{self.source.value}:{self.name}"

    def describe(self) -> str:
        """``file /run/keys/w1`` or ``environment variable NAME``, for messages."""
        if self.source is KeySource.FILE:
            return f"file {self.name}"
        return f"environment variable {self.name}"


def parse_ref(text: str, *, where: str) -> KeyRef:
    """``file:PATH`` or ``env:NAME``; :class:`ConfigError` naming ``where`` otherwise
    (without the value: it may be a key pasted in by mistake)."""
    source, sep, name = text.partition(":")
    if not sep or not name or source not in (KeySource.FILE, KeySource.ENV):
        raise ConfigError(
            f"{where}: expected file:PATH or env:NAME (the value is not shown: it may be a key)"
        )
    if source == KeySource.ENV and not ENV_NAME.match(name):
        raise ConfigError(f"{where}: env: takes a variable's name (letters, digits, _)")
    return KeyRef(source=KeySource(source), name=name)


class WorkerKey:
    """A worker's key and the header that carries it; its ``repr`` hides both."""

    __slots__ = ("header",)

    def __init__(self, value: str, *, origin: KeyRef) -> None:
        key = value.strip()
        if not key:
            raise ConfigError(f"worker API key: {origin.describe()} is empty")
        if not key.isprintable() or any(c.isspace() for c in key):
            raise ConfigError(
                f"worker API key: {origin.describe()} holds more than one printable word"
            )
        #: ``("Authorization", "Bearer <key>")``, ready to append to a request's headers.
        self.header: tuple[str, str] = (WORKER_AUTHORIZATION, f"Bearer {key}")

    def secret(self) -> str:
        """The key itself (to hand to the worker it belongs to, e.g. ``gtm up``'s)."""
        return self.header[1].removeprefix("Bearer ")

    def __repr__(self) -> str:
        return "WorkerKey(<hidden>)"

    __str__ = __repr__


def read_key(ref: KeyRef, environ: Mapping[str, str]) -> WorkerKey:
    """The key ``ref`` names; :class:`ConfigError` naming the file or variable."""
    if ref.source is KeySource.ENV:
        value = environ.get(ref.name, "")
        if not value:
            raise ConfigError(f"worker API key: environment variable {ref.name} is not set")
        return WorkerKey(value, origin=ref)
    try:
        with open(ref.name, "rb") as f:
            raw = f.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"worker API key: cannot read file {ref.name}: {exc.strerror}") from None
    if len(raw) > MAX_KEY_BYTES:
        raise ConfigError(f"worker API key: file {ref.name} is larger than a key")
    try:
        return WorkerKey(raw.decode("utf-8"), origin=ref)
    except UnicodeDecodeError:
        raise ConfigError(f"worker API key: file {ref.name} is not UTF-8 text") from None


__all__ = [
    "CLIENT_CREDENTIALS",
    "ENV_NAME",
    "MAX_KEY_BYTES",
    "VLLM_API_KEY_ENV",
    "WORKER_AUTHORIZATION",
    "KeyRef",
    "KeySource",
    "WorkerKey",
    "parse_ref",
    "read_key",
]
