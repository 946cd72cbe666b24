"""What a response really used: the OpenAI ``usage`` object read from relayed bytes.

A tier that relays a response and wants its token counts (the regional LB reconciles
quotas and fair-queue counters with them; the front door counts tokens per region and
model) feeds each relayed chunk to a :class:`UsageTap`. It reads a JSON body's
``usage`` (bodies up to :data:`USAGE_BODY_BYTES`; a larger one is relayed but not
parsed) or, for an event stream, the chunk that carries ``usage`` (when the client
asked for it, ``stream_options.include_usage``); without one, a stream's completion
tokens are estimated as one per content chunk. Work and memory per response are
bounded; the bytes are never changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Bytes of a non-streamed body kept to read its ``usage`` (larger bodies are relayed
#: but not parsed: their usage is unknown and the estimate stands).
USAGE_BODY_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Usage:
    """What a finished request actually used (from the response's ``usage``)."""

    input_tokens: int
    output_tokens: int


class UsageTap:
    """Reads the usage of a response from the bytes relayed (bounded work and memory)."""

    def __init__(self, streaming: bool) -> None:
        self._streaming = streaming
        self._body = bytearray()
        self._line = bytearray()
        self._chunks = 0
        self._usage: Usage | None = None
        self._overflow = False
        self.relayed_any = False

    def feed(self, data: bytes) -> None:
        self.relayed_any = True
        if not self._streaming:
            if len(self._body) + len(data) > USAGE_BODY_BYTES:
                self._overflow = True
            else:
                self._body += data
            return
        self._line += data
        while (cut := self._line.find(b"\n")) >= 0:
            line = bytes(self._line[:cut]).strip()
            del self._line[: cut + 1]
            self._sse_line(line)
        if len(self._line) > USAGE_BODY_BYTES:
            self._line.clear()

    def _sse_line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        if b'"usage"' in payload:
            found = usage_of(payload)
            if found is not None:
                self._usage = found
                return
        if b'"choices"' in payload and b'"choices":[]' not in payload.replace(b" ", b""):
            self._chunks += 1

    def usage(self, input_tokens: int) -> Usage | None:
        """The reported usage; else (streams) ``input_tokens`` and one token per chunk."""
        if self._usage is not None:
            return self._usage
        if not self._streaming:
            return None if self._overflow else usage_of(bytes(self._body))
        return Usage(input_tokens, self._chunks) if self._chunks else None


def usage_of(payload: bytes) -> Usage | None:
    """The ``usage`` of one JSON document (a body or an SSE chunk), if it has a valid one."""
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return Usage(max(0, prompt), max(0, completion))


__all__ = ["USAGE_BODY_BYTES", "Usage", "UsageTap", "usage_of"]
