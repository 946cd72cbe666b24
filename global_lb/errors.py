"""Errors of the global tier::

    GtmError
    └── GlobalError
        ├── BadRequest                400: a body or header the front door cannot route
        ├── UpstreamUnavailable       502: no regional LB took the request (every attempt
        │                             failed before the first byte)
        └── WireError                 a DNS query that gets an error response (or none)

The front door answers refusals of a decision (451 residency, 404 model, 503 no region)
in OpenAI's shape with the decision's id and allowed regions (:mod:`global_lb.api`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gtm import openai_errors
from gtm.errors import GtmError
from gtm.openai_errors import ErrorType

if TYPE_CHECKING:
    from global_lb.dns.wire import Rcode


class GlobalError(GtmError):
    """Root of the global tier's errors."""


class BadRequest(openai_errors.BadRequest, GlobalError, ValueError):
    """400: the body or a header is not a request we can route; the message and
    ``param`` say why, in OpenAI's shape (:class:`gtm.openai_errors.BadRequest`)."""


class UpstreamUnavailable(openai_errors.ApiError, GlobalError):
    """502: every regional LB tried failed before its first byte."""

    def __init__(self, message: str) -> None:
        super().__init__(502, message, type=ErrorType.SERVER, code="upstream_unavailable")


class WireError(GlobalError):
    """A query that gets an error response (``rcode``) or, without ``header``, none."""

    def __init__(
        self,
        rcode: Rcode,
        why: str,
        *,
        header: tuple[int, int] | None = None,
        question: bytes = b"",
        edns: bool = False,
    ) -> None:
        super().__init__(why)
        self.rcode = rcode
        self.header = header  # (id, flags) when the header could be read
        self.question = question
        self.edns = edns
