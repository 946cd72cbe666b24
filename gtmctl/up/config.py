"""``gtm up``'s options (ARCHITECTURE §9), validated once at start-up."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from global_lb.dns.zone_config import ZoneConfig
from gtm.cli_types import host_port
from gtm.errors import ConfigError
from gtm.models import Frozen
from gtm.profile_files import operator_catalog
from gtm.state.url import StoreKind, parse_state_url
from gtmctl.up.control import LinkKind
from gtmctl.up.policy_profile import TierPolicy, tier_policy

#: ARCHITECTURE §9 defaults: DNS on 5353 (UDP and TCP; 53 needs privileges), the front
#: door on 8080.
DEFAULT_DNS_LISTEN = "127.0.0.1:5353"
DEFAULT_HTTP_LISTEN = "127.0.0.1:8080"

#: The local deployment's proxies: the loopback address local tools connect from
#: (``gtm load`` sends its clients' places in X-Forwarded-For), trusted by the front
#: door and the regional LBs alike; on a real deployment only the anycast LBs are. The
#: rest of 127/8 is not: a client bound to 127.0.0.2 is an untrusted peer whose
#: X-Forwarded-For is not believed (the users' paths tests are such clients). Here, not
#: in ``inprocess`` (which re-exports it), so ``--processes`` never imports the tiers.
LOCAL_PROXIES = (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("::1/128"))

#: How long ``gtm up`` waits for every region to answer before giving up, s. The
#: acceptance bound for ``make up`` on a 2-core machine is 60 s; a slower machine gets
#: the same, and a clear error naming what is not ready.
DEFAULT_READY_TIMEOUT_S = 90.0


class Mode(StrEnum):
    IN_PROCESS = "in-process"
    PROCESSES = "processes"


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self}"


def parse_listen(value: str, what: str) -> HostPort:
    """``HOST:PORT`` (IPv6 in brackets); ConfigError naming ``what`` when malformed."""
    try:
        host, port = host_port(value, example=DEFAULT_HTTP_LISTEN, ip_only=True)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    return HostPort(host, port)


class UpConfig(Frozen):
    """Everything ``gtm up`` is configured with."""

    topology: str | None = None  # None: the shipped example
    policies: tuple[str, ...] = ()  # empty: the examples shipped with gtm
    state: str = "memory"
    dns_listen: str = DEFAULT_DNS_LISTEN
    http_listen: str = DEFAULT_HTTP_LISTEN
    #: Where the status page listens when the front door cannot serve it (--processes).
    status_listen: str | None = None
    geoip_db: str | None = None
    speedup: float = Field(default=1.0, gt=0.0, le=1000.0, allow_inf_nan=False)
    processes: bool = False
    #: Scrape interval of the zone agents, s (their default, 250 ms, as issue 5 asks).
    scrape_interval_s: float = Field(default=0.25, gt=0.0, le=60.0)
    ready_timeout_s: float = Field(default=DEFAULT_READY_TIMEOUT_S, gt=0.0)
    #: Keep logs and the audit trail here (default: a temporary directory, removed).
    run_dir: str | None = None
    #: Members of the private etcd (--processes without --state etcd://…): 1, or 3 so
    #: that a leader can be lost without losing the store.
    etcd_members: Literal[1, 3] = 1
    #: Inter-tier connections routed through fault-proxy links (--processes only).
    chaos_links: tuple[LinkKind, ...] = ()
    #: Mutual TLS between every tier (gtmctl/up/tls.py); certificates in ``tls_dir``
    #: (default: ~/.local/state/gtm/tls), made on first run and reused.
    tls: bool = False
    tls_dir: str | None = None
    #: Run a simulator policy at every tier (:mod:`gtmctl.up.policy_profile`; None: the
    #: tiers' defaults).
    policy_profile: str | None = None
    #: The GeoDNS zone's NS set and SOA (``--dns-ns``, ``--dns-soa-*``; None: the defaults).
    dns_zone: ZoneConfig | None = None
    #: The emulated workers' API key (vLLM's --api-key), given to every zone agent as
    #: ``gtm zone --worker-api-key-file`` (None: workers take requests without a key).
    worker_api_key_file: str | None = None
    #: Operator's GPU profile files or directories, given to every zone agent
    #: (``gtm zone --gpu-profiles``); empty: the shipped profiles alone.
    gpu_profiles: tuple[str, ...] = ()
    #: Every emulated GPU publishes vLLM's KV events on ipc:// sockets of its own in the
    #: run directory and registers them; every zone agent reads them (--processes only).
    kv_events: bool = False

    # ConfigError becomes ValueError: pydantic reports it as a validation error of the
    # field (one line naming the option), not an exception escaping the model.
    @field_validator("state")
    @classmethod
    def _state(cls, value: str) -> str:
        try:
            return str(parse_state_url(value))
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("gpu_profiles")
    @classmethod
    def _gpu_profiles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        try:
            operator_catalog([Path(p) for p in value])
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("dns_listen", "http_listen", "status_listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        try:
            return None if value is None else str(parse_listen(value, "listen address"))
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("policy_profile")
    @classmethod
    def _policy_profile(cls, value: str | None) -> str | None:
        try:
            tier_policy(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def tiers(self) -> TierPolicy:
        """What each tier runs (--policy-profile, else the defaults)."""
        return tier_policy(self.policy_profile)

    @model_validator(mode="after")
    def _processes_only(self) -> UpConfig:
        if not self.processes and (self.etcd_members != 1 or self.chaos_links):
            raise ValueError(
                "--etcd-members and --chaos-links need --processes (the in-process "
                "deployment has one in-memory store and no connections to put links on)"
            )
        if self.kv_events and not self.processes:
            raise ValueError(
                "--kv-events needs --processes (the in-process deployment's emulated GPUs "
                "publish no KV events)"
            )
        if self.etcd_members != 1 and self.uses_etcd:
            raise ValueError(
                "--etcd-members sizes gtm up's private etcd; with --state etcd://… the "
                "cluster is yours (list its members in --state)"
            )
        return self

    @model_validator(mode="after")
    def _tls_dir_needs_tls(self) -> UpConfig:
        if self.tls_dir is not None and not self.tls:
            raise ValueError("--tls-dir needs --tls")
        return self

    @property
    def mode(self) -> Mode:
        return Mode.PROCESSES if self.processes else Mode.IN_PROCESS

    @property
    def uses_etcd(self) -> bool:
        return parse_state_url(self.state).kind is StoreKind.ETCD

    @property
    def dns(self) -> HostPort:
        return parse_listen(self.dns_listen, "--dns-listen")

    @property
    def http(self) -> HostPort:
        return parse_listen(self.http_listen, "--http-listen")

    def status(self) -> HostPort | None:
        """Where the status page gets a listener of its own (None: on the front door)."""
        if self.status_listen is not None:
            return parse_listen(self.status_listen, "--status-listen")
        if self.processes:
            http = self.http
            return HostPort(http.host, 0 if http.port == 0 else http.port + 1)
        return None
