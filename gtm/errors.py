"""The gtm exception tree. Every error gtm raises on purpose is a :class:`GtmError`.

Library errors (grpc/aetcd, aiohttp, pydantic, yaml) are translated into this tree at
the boundary where the library is called — e.g. etcd errors only in
:mod:`gtm.state.etcd` — so callers catch one root and never a library type::

    GtmError
    ├── ConfigError                 bad configuration or command-line input
    │   └── MissingExtra            an optional dependency is not installed (names the extra)
    ├── NotAvailableYet             a subcommand/feature that is not built yet
    ├── StateError                  anything about the state store
    │   ├── StateUnavailable        store unreachable or a call timed out (retryable)
    │   ├── CompactedError          a watch asked for a revision already compacted
    │   ├── LeaseNotFound           the lease expired or was revoked
    │   ├── StateAccessDenied       etcd refused our credentials or a key (auth, roles)
    │   └── CodecError              a stored value is not a valid record
    ├── RoutingError                anything about a routing decision
    │   ├── NoEligibleCandidate     filtering removed every candidate (names the filter)
    │   └── PluginError             unknown plugin type or invalid plugin parameters
    ├── RelayError                  anything about carrying a request to an upstream
    │   ├── UpstreamError           an upstream's connection or response failed
    │   └── AttemptFailed           one attempt failed before the first byte (retryable)
    └── SimulationError             a fleet simulation could not run (a worker failed)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from gtm.models import DecisionTrace


class GtmError(Exception):
    """Root of every error gtm raises on purpose."""


class ConfigError(GtmError):
    """Configuration or command-line input is invalid; the message says what to change."""


class MissingExtra(ConfigError):
    """An optional dependency a command needs is not installed; the message is the
    ``pip install '…[extra]'`` line that brings it (:mod:`gtm.extras`)."""


class NotAvailableYet(GtmError):
    """A subcommand or feature that is registered but not built yet."""


class StateError(GtmError):
    """Base for state-store errors."""


class StateUnavailable(StateError):
    """The store could not be reached or did not answer in time. Safe to retry."""


class StateAccessDenied(StateError):
    """etcd refused the credentials or the access (not retryable: fix the configuration)."""


class CompactedError(StateError):
    """A watch asked for history older than the store's compaction revision.

    The watcher must re-list (``range``) and watch again from the listed revision.
    """

    def __init__(self, requested_revision: int, compact_revision: int) -> None:
        super().__init__(
            f"revision {requested_revision} is compacted (oldest kept: {compact_revision}); "
            "re-list and watch again"
        )
        self.requested_revision = requested_revision
        self.compact_revision = compact_revision


class LeaseNotFound(StateError):
    """The lease does not exist: it expired, was revoked, or never was granted."""

    def __init__(self, lease_id: int) -> None:
        super().__init__(f"lease {lease_id:#x} not found (expired or revoked)")
        self.lease_id = lease_id


class CodecError(StateError):
    """A stored value could not be decoded into its record type."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"value at {key!r} is not a valid record: {reason}")
        self.key = key
        self.reason = reason


class RoutingError(GtmError):
    """Base for routing-decision errors."""


class NoEligibleCandidate(RoutingError):
    """Filtering removed every candidate. ``filter_name`` names the filter that emptied the set.

    ``trace`` is the partial decision trace up to that filter (who removed what and why),
    when the error comes from a routing profile, so callers can log and audit the refusal.
    The raiser may give a function that builds it: it is then built when first read (most
    refusals — a full region's queued requests tried again — are never logged).
    """

    def __init__(
        self,
        filter_name: str,
        reason: str = "",
        *,
        trace: DecisionTrace | Callable[[], DecisionTrace] | None = None,
    ) -> None:
        detail = f": {reason}" if reason else ""
        super().__init__(f"no eligible candidate left after filter {filter_name!r}{detail}")
        self.filter_name = filter_name
        self.reason = reason
        self._trace = trace

    @property
    def trace(self) -> DecisionTrace | None:
        if callable(self._trace):
            self._trace = self._trace()
        return self._trace


class PluginError(RoutingError):
    """A plugin type is unknown or its parameters are invalid."""


class RelayError(GtmError):
    """Base for errors of the data path (:mod:`gtm.relay`)."""


class UpstreamError(RelayError):
    """An upstream's connection or response failed (reset, closed early, not HTTP).

    Each upstream client translates its library's errors into this at its boundary
    (:mod:`gtm.relay` for aiohttp, :mod:`zone_agent.upstream` for the zone's own)."""


class AttemptFailed(RelayError):
    """One attempt of a relay failed before its first byte reached the client, so the
    request may be tried on another target. ``kind`` says how (a
    :class:`gtm.relay.Failure` value); ``status`` and ``body`` are the upstream's when
    it answered with a status the tier retries."""

    def __init__(
        self, kind: str, detail: str, *, status: int | None = None, body: bytes = b""
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.status = status
        self.body = body
        #: The id of the target that failed (set by the relay).
        self.target = ""

    @property
    def reason(self) -> str:
        """The metric label of the failure: ``connect``, ``timeout``, ``reset``, ``http_503``."""
        return self.kind if self.status is None else f"http_{self.status}"


class SimulationError(GtmError):
    """A fleet simulation could not run to its end (e.g. one of its worker processes
    failed; the message carries the worker's traceback)."""
