"""Bearer tokens, roles and the audit trail of gtm's admin APIs.

Admin surfaces (the drain API of ``gtm up``'s status page, the emulator's
``/admin/faults`` and ``/admin/lag``, the fault proxy's Toxiproxy API when tokens are
turned on) share one :class:`AdminGuard`, installed as an aiohttp middleware over the
admin routes only (:func:`admin_middleware`).

**Tokens.** ``gtma-<id>-<secret>``: ``id`` is 8 public base32 characters (what the audit
log and errors show as "who"), ``secret`` 32 bytes from the OS CSPRNG. The token file
(JSON, mode 0600) keeps, per token, its id, role, a 16-byte salt and
``sha256(salt ‖ token)``; never the token. Why SHA-256 and not scrypt, unlike tenant API
keys (:mod:`policies.apikeys`): an admin token is always generated, with 256 bits of
entropy, so an offline search over the file is hopeless whatever the hash speed (NIST
SP 800-63B §5.1.1.2 asks for a slow hash only for memorised, low-entropy secrets); and a
fast hash keeps a flood of bad tokens from costing a deliberately slow hash each. The comparison is
:func:`hmac.compare_digest` (constant time); a token whose id is unknown is refused
without hashing.

**Roles.** ``read-only`` may call safe methods (GET, HEAD); ``operator`` may also change
things (POST, PUT, PATCH, DELETE). A missing or bad token is 401 with
``WWW-Authenticate: Bearer`` (RFC 6750 §3); a token whose role is too low is 403. Both
have a JSON body in the same shape as every other gtm error.

**Without a token file** a surface trusts loopback clients only (the historical
behaviour): who is ``loopback``. :func:`check_admin_bind` refuses to listen on a
non-loopback address unless the operator both asked for it and configured a token file.

**Audit.** Every admin call that reaches a handler, or is refused, becomes one
:class:`AdminAuditRecord` (time, who, role, method, route, target, status, client) — in
an :class:`policies.audit.AuditWriter` chain (same hash-chain format and verifier as the
residency audit log: ``gtm audit verify DIR``) when a directory is configured, and
always in the ``gtm.admin.audit`` log. No token, body or free text is ever recorded.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gtm.clock import Clock
from gtm.errors import ConfigError, GtmError
from gtm.openai_errors import ApiError, ErrorType
from policies.errors import AuditError

log = logging.getLogger(__name__)
audit_log = logging.getLogger("gtm.admin.audit")

TOKEN_PREFIX = "gtma-"
_TOKEN = re.compile(r"^gtma-([a-z2-7]{8})-([A-Za-z0-9_-]{43})$")
_SALT_BYTES = 16  # NIST SP 800-132 §5.1: at least 128 bits
_FILE_VERSION = 1
#: Who the audit log names for a loopback client when no token file is configured.
LOOPBACK_PRINCIPAL = "loopback"
#: Methods that change nothing (RFC 9110 §9.2.1) — allowed to ``read-only`` tokens.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_AUDIT_FIELD = re.compile(r"^[A-Za-z0-9._:/{}\[\]%@+-]{0,256}$")


class AdminAuthError(GtmError):
    """A token file cannot be read or written, or a token cannot be created."""


class Role(StrEnum):
    READ_ONLY = "read-only"
    OPERATOR = "operator"

    def allows(self, method: str) -> bool:
        return self is Role.OPERATOR or method.upper() in SAFE_METHODS


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """One admin token as stored: never the token itself."""

    id: str
    role: Role
    salt: bytes
    digest: bytes
    created: float

    def matches(self, token: str) -> bool:
        return hmac.compare_digest(_digest(self.salt, token), self.digest)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role.value,
            "salt": _b64(self.salt),
            "sha256": _b64(self.digest),
            "created": self.created,
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> TokenRecord:
        if not isinstance(data, dict):
            raise AdminAuthError(f"{where}: expected an object with id, role, salt, sha256")
        try:
            record = cls(
                id=str(data["id"]),
                role=Role(data["role"]),
                salt=_unb64(str(data["salt"])),
                digest=_unb64(str(data["sha256"])),
                created=float(data.get("created", 0.0)),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise AdminAuthError(f"{where}: invalid token entry ({exc!s})") from None
        if len(record.digest) != 32 or len(record.salt) < 8:
            raise AdminAuthError(f"{where}: sha256 must be 32 bytes and salt at least 8")
        return record


def _digest(salt: bytes, token: str) -> bytes:
    return hashlib.sha256(salt + token.encode()).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def token_id(token: str) -> str | None:
    """The public id inside ``gtma-<id>-<secret>``, or None if it is not a token."""
    match = _TOKEN.match(token)
    return match.group(1) if match else None


def new_token() -> str:
    ident = base64.b32encode(secrets.token_bytes(5)).decode().lower()
    return f"{TOKEN_PREFIX}{ident}-{secrets.token_urlsafe(32)}"


# ---------------------------------------------------------------------------- the file


class TokenFile:
    """The token file at ``path``: read on demand and re-read when it changes on disk
    (so ``gtm admin token create`` / ``revoke`` take effect without a restart)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._records: Mapping[str, TokenRecord] = {}

    def records(self) -> Mapping[str, TokenRecord]:
        """id → record, reloaded if the file changed; raises :class:`AdminAuthError`."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise AdminAuthError(f"{self.path}: {exc.strerror}") from None
        stamp = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if stamp != self._stamp:
                self._records = _parse(self.path)
                self._stamp = stamp
            return self._records

    def authenticate(self, token: str) -> TokenRecord | None:
        ident = token_id(token)
        if ident is None:
            return None
        record = self.records().get(ident)
        return record if record is not None and record.matches(token) else None

    def create(self, role: Role, *, now: float) -> tuple[str, TokenRecord]:
        """Add a new token; returns it (the only time it exists in clear) and its record."""
        token = new_token()
        ident = token_id(token)
        assert ident is not None
        salt = secrets.token_bytes(_SALT_BYTES)
        record = TokenRecord(ident, role, salt, _digest(salt, token), now)
        with self._edit() as records:
            records[ident] = record
        return token, record

    def revoke(self, ident: str) -> bool:
        with self._edit() as records:
            return records.pop(ident, None) is not None

    @contextlib.contextmanager
    def _edit(self) -> Any:
        """Read-modify-write under an exclusive lock; the new file replaces the old
        atomically (write to a temporary file, fsync, rename), mode 0600."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            lock_fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise AdminAuthError(f"{self.path}: cannot write: {exc.strerror}") from None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            records = dict(_parse(self.path)) if self.path.exists() else {}
            yield records
            _write(self.path, records)
        finally:
            os.close(lock_fd)


def _parse(path: Path) -> dict[str, TokenRecord]:
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise AdminAuthError(f"{path}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise AdminAuthError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
        raise AdminAuthError(f'{path}: expected {{"version": 1, "tokens": [...]}}')
    records = {}
    for index, entry in enumerate(data["tokens"]):
        record = TokenRecord.from_json(entry, f"{path}: tokens[{index}]")
        records[record.id] = record
    return records


def _write(path: Path, records: Mapping[str, TokenRecord]) -> None:
    document = {"version": _FILE_VERSION, "tokens": [r.to_json() for r in records.values()]}
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            json.dump(document, stream, indent=2)
            stream.write("\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise AdminAuthError(f"{path}: cannot write: {exc.strerror}") from None


def default_admin_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``gtm up`` and ``gtm admin`` keep tokens: ``$GTM_ADMIN_DIR``, else
    ``$XDG_CONFIG_HOME/gtm/admin``, else ``~/.config/gtm/admin``."""
    env = os.environ if environ is None else environ
    if env.get("GTM_ADMIN_DIR"):
        return Path(env["GTM_ADMIN_DIR"])
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "gtm" / "admin"


TOKEN_FILE_NAME = "tokens.json"
#: The operator token ``gtm up`` creates for itself, kept for the local client
#: (``gtm drain --api``) like an SSH key: readable by its owner only.
LOCAL_TOKEN_NAME = "operator.token"


def ensure_local_operator_token(directory: Path, *, now: float) -> tuple[Path, bool]:
    """The path of ``directory``'s local operator token, creating it (and its hash in
    the token file) on first use. Returns (path, created)."""
    token_path = directory / LOCAL_TOKEN_NAME
    tokens = TokenFile(directory / TOKEN_FILE_NAME)
    if token_path.exists():
        existing = token_path.read_text("utf-8").strip()
        if tokens.authenticate(existing) is not None:
            return token_path, False
    token, _ = tokens.create(Role.OPERATOR, now=now)
    fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as stream:
        stream.write(token + "\n")
    return token_path, True


def read_token(path: str | Path) -> str:
    try:
        return Path(path).read_text("utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the admin token {path}: {exc.strerror}") from None


# ---------------------------------------------------------------------------- binding


def is_loopback_host(host: str) -> bool:
    """Whether a listen host is loopback-only (``localhost``, 127/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_peer(peer: str | None) -> bool:
    """Whether an aiohttp ``request.remote`` is loopback (IPv4-mapped IPv6 included)."""
    try:
        address = ipaddress.ip_address((peer or "").partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def check_admin_bind(host: str, *, allow_remote: bool, token_file: Path | None) -> None:
    """Refuse to expose admin APIs beyond loopback unless asked to *and* protected."""
    if is_loopback_host(host):
        return
    if not allow_remote or token_file is None:
        raise ConfigError(
            f"{host} is not a loopback address and this server has admin APIs: listen on "
            "127.0.0.1, or pass both --allow-remote-admin and --admin-token-file FILE "
            "(create tokens with `gtm admin token create --role operator`)"
        )


# ---------------------------------------------------------------------------- auditing


@dataclass(frozen=True, slots=True)
class AdminAuditRecord:
    """One admin action. Only these fields exist, each a short token (no free text)."""

    time: float
    who: str
    role: str
    method: str
    route: str
    target: str
    status: int
    client: str

    def __post_init__(self) -> None:
        if not math.isfinite(self.time) or self.time < 0:
            raise ValueError("time must be a finite, non-negative Unix timestamp")
        for name in ("who", "role", "method", "route", "target", "client"):
            if not _AUDIT_FIELD.match(getattr(self, name)):
                raise ValueError(f"{name}: {getattr(self, name)!r} is not a short token")

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "admin",
            "time": self.time,
            "who": self.who,
            "role": self.role,
            "method": self.method,
            "route": self.route,
            "target": self.target,
            "status": self.status,
            "client": self.client,
        }


class AuditSink(Protocol):
    def append(self, record: AdminAuditRecord) -> object: ...


def _clean(text: str) -> str:
    """Reduce a client-chosen string (a path) to the audit alphabet, bounded."""
    return re.sub(r"[^A-Za-z0-9._:/{}\[\]%@+-]", "_", text)[:256]


# ---------------------------------------------------------------------------- the guard


class Unauthorized(ApiError):
    """401 with the ``WWW-Authenticate: Bearer`` challenge (RFC 6750 §3)."""

    def __init__(self, realm: str, message: str, code: str) -> None:
        super().__init__(401, message, type=ErrorType.AUTHENTICATION, code=code)
        error = ', error="invalid_token"' if code == "invalid_token" else ""
        self.challenge = f'Bearer realm="{realm}"{error}'

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "WWW-Authenticate": self.challenge}


@dataclass(frozen=True, slots=True)
class Principal:
    who: str
    role: Role


#: Where :func:`admin_middleware` leaves the :class:`Principal` for the handler.
PRINCIPAL_KEY = web.RequestKey("gtm.admin.principal", Principal)


class AdminGuard:
    """Authenticates admin requests and audits every one.

    ``tokens=None`` is loopback-trust mode (no token file configured).
    """

    def __init__(
        self,
        *,
        tokens: TokenFile | None,
        clock: Clock,
        audit: AuditSink | None = None,
        realm: str = "gtm-admin",
    ) -> None:
        self.tokens = tokens
        self._clock = clock
        self._audit = audit
        self._realm = realm

    @classmethod
    def from_options(
        cls, *, token_file: Path | None, audit_dir: Path | None, clock: Clock
    ) -> AdminGuard:
        """The guard a CLI builds from ``--admin-token-file`` / ``--admin-audit-dir``."""
        audit: AuditSink | None = None
        if audit_dir is not None:
            # Here, not at module level: the audit chain brings the residency engine and
            # the policy documents, which a process without an admin audit directory (an
            # emulated GPU worker) does not need; this runs at start-up.
            from policies.audit import AuditWriter

            try:
                audit = AuditWriter(audit_dir, prefix="admin")
            except (AuditError, OSError) as exc:
                raise ConfigError(f"--admin-audit-dir {audit_dir}: {exc}") from None
        tokens = TokenFile(token_file) if token_file is not None else None
        if tokens is not None:
            try:
                tokens.records()
            except AdminAuthError as exc:
                raise ConfigError(f"--admin-token-file: {exc}") from None
        return cls(tokens=tokens, clock=clock, audit=audit)

    def close(self) -> None:
        if self._audit is None:
            return
        from policies.audit import AuditWriter  # loaded when from_options made one

        if isinstance(self._audit, AuditWriter):
            self._audit.close()

    def authenticate(self, request: web.Request) -> Principal:
        """Who is calling, or an :class:`ApiError` (401/403) saying why not."""
        if self.tokens is None:
            if is_loopback_peer(request.remote):
                return Principal(LOOPBACK_PRINCIPAL, Role.OPERATOR)
            raise ApiError(
                403,
                "admin APIs accept loopback clients only (no admin token file is configured)",
                type=ErrorType.PERMISSION,
                code="loopback_only",
            )
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized(
                self._realm,
                "missing admin token: send 'Authorization: Bearer <token>' (create one with "
                "`gtm admin token create --role operator`)",
                "missing_token",
            )
        try:
            record = self.tokens.authenticate(token.strip())
        except AdminAuthError as exc:
            log.error("admin token file unreadable: %s", exc)
            raise ApiError(
                503, "admin tokens unavailable", type=ErrorType.UNAVAILABLE, code="tokens"
            ) from None
        if record is None:
            raise Unauthorized(self._realm, "invalid or revoked admin token", "invalid_token")
        return Principal(record.id, record.role)

    def authorize(self, request: web.Request) -> Principal:
        principal = self.authenticate(request)
        if not principal.role.allows(request.method):
            raise ApiError(
                403,
                f"the {principal.role.value} role may not {request.method} here; an "
                "operator token is needed",
                type=ErrorType.PERMISSION,
                code="insufficient_role",
            )
        return principal

    def record(self, request: web.Request, principal: Principal | None, status: int) -> None:
        """Audit one call; an audit failure is logged, never hidden and never fatal to
        the response already decided."""
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else request.path
        entry = AdminAuditRecord(
            time=self._clock.wall(),
            who=_clean(principal.who) if principal else "-",
            role=principal.role.value if principal else "-",
            method=_clean(request.method),
            route=_clean(route),
            target=_clean(request.path),
            status=status,
            client=_clean(request.remote or "-"),
        )
        audit_log.info(
            "admin who=%s role=%s method=%s target=%s status=%d client=%s",
            entry.who,
            entry.role,
            entry.method,
            entry.target,
            entry.status,
            entry.client,
        )
        if self._audit is not None:
            try:
                self._audit.append(entry)
            except AuditError as exc:
                log.error("cannot append to the admin audit log: %s", exc)


def admin_middleware(
    guard: AdminGuard,
    is_admin: Callable[[web.Request], bool],
    *,
    render: Callable[[ApiError], web.StreamResponse] | None = None,
) -> Middleware:
    """Guard and audit the requests ``is_admin`` selects; others pass untouched.

    ``render`` answers a refusal (default: the JSON error with its headers), for a
    surface with its own error shape.
    """

    answer = render or ApiError.response

    @web.middleware
    async def admin(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_admin(request):
            return await handler(request)
        principal: Principal | None = None
        status = 500
        try:
            principal = guard.authorize(request)
        except ApiError as exc:
            guard.record(request, principal, exc.status)
            return answer(exc)
        request[PRINCIPAL_KEY] = principal
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except ApiError as exc:
            status = exc.status
            raise
        finally:
            guard.record(request, principal, status)

    return admin


def path_prefix(*prefixes: str) -> Callable[[web.Request], bool]:
    """An ``is_admin`` selector: the path starts with one of ``prefixes``."""
    return lambda request: request.path.startswith(prefixes)
