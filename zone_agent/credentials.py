"""Each worker's own API key: where the zone agent reads it and the header it sends.

A client's credential never reaches a worker (:mod:`gtm.credentials`): the zone agent
drops it and sends each worker ``Authorization: Bearer <worker key>``, the header a vLLM
started with ``--api-key`` (or ``VLLM_API_KEY``) checks on ``/v1/*``. vLLM leaves
``/metrics`` and ``/health`` open, and those are the only paths the agent calls on its
own (scrapes and active checks), so only the proxied requests carry the key.

**Where a worker's key comes from**, first match wins:

1. its own reference: a static worker's ``--worker URL,…,api-key-from=file:PATH`` (or
   ``env:NAME``), or a registered worker's record label ``api-key-from``;
2. the file named by its id in ``--worker-api-key-dir`` (a Kubernetes Secret mounted as
   a directory: one key per worker);
3. the zone's key: ``--worker-api-key-file`` or ``--worker-api-key-env`` (one key for
   every worker);
4. none: the request goes without ``Authorization``.

**A record names a key, never holds one.** Worker records live in the state store, which
anyone who may register a worker can write, so a record may only point inside what the
operator set aside: ``file:NAME`` is a plain file name resolved in
``--worker-api-key-dir``, ``env:NAME`` a variable whose name starts with
:data:`RECORD_ENV_PREFIX`. Otherwise a record could send the agent's other secrets (the
tiers' key, a service-account token) to a worker URL of its choosing. A reference that
is not ``file:…``/``env:…`` is refused without echoing it (it may be a key pasted in).

**Reading**: the zone's key at start (a missing file or variable stops the agent with an
error naming it); a worker's when it joins. Files are re-read when they change — checked
every :data:`RELOAD_INTERVAL_S` and whenever the inventory changes, as
:mod:`gtm.tls` does for certificates (inode, mtime, size), so a rotated Secret takes
effect without a restart; a file that cannot be read then keeps its last good key and is
logged once. Environment variables are read once (a process's environment does not
change). Per request the agent only looks the header up (:attr:`WorkerKeys.header`).

**Never shown**: a key's ``repr`` is hidden (:class:`WorkerKey`), errors name the file or
variable, never the value; the access log and traces never carry request headers.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from pydantic import Field, model_validator

from gtm.credentials import (
    ENV_NAME,
    KeyRef,
    KeySource,
    WorkerKey,
    parse_ref,
    read_key,
)
from gtm.errors import ConfigError
from gtm.models import Frozen, GpuWorker

log = logging.getLogger(__name__)

#: Label of a worker record that names where its key is read (``file:NAME`` in
#: ``--worker-api-key-dir``, or ``env:GTM_WORKER_KEY_…``).
KEY_LABEL = "api-key-from"
#: Environment variables a worker record may name start so.
RECORD_ENV_PREFIX = "GTM_WORKER_KEY_"
#: Seconds between checks of the key files for a change (a Kubernetes Secret volume is
#: refreshed by the kubelet within about a minute; gtm.tls checks its files as often).
RELOAD_INTERVAL_S = 60.0
#: A file name a worker record may give (no directory part).
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def record_ref(worker: GpuWorker, directory: Path | None) -> KeyRef | None:
    """The key reference of a registered worker's record (its :data:`KEY_LABEL`), held
    to what a record may name; ``None`` without one. :class:`ConfigError` if it names
    something else."""
    text = dict(worker.labels).get(KEY_LABEL)
    if text is None:
        return None
    where = f"worker {worker.id}: label {KEY_LABEL}"
    ref = parse_ref(text, where=where)
    if ref.source is KeySource.ENV:
        if not ref.name.startswith(RECORD_ENV_PREFIX):
            raise ConfigError(
                f"{where}: a worker record may only name variables {RECORD_ENV_PREFIX}*"
            )
        return ref
    if not _FILE_NAME.match(ref.name):
        raise ConfigError(f"{where}: a worker record may only name a file in the key directory")
    if directory is None:
        raise ConfigError(f"{where}: names file {ref.name} but no --worker-api-key-dir is set")
    return KeyRef(source=KeySource.FILE, name=str(directory / ref.name))


class WorkerKeyConfig(Frozen):
    """The zone agent's worker-key options (``gtm zone --worker-api-key-*``)."""

    #: The key of every worker without its own, from a file...
    file: Path | None = None
    #: ... or from an environment variable (not both).
    env: str | None = Field(default=None, pattern=ENV_NAME.pattern)
    #: A directory of per-worker keys: a file named by the worker's id, or the file a
    #: worker record's ``api-key-from=file:NAME`` names.
    directory: Path | None = None

    @model_validator(mode="after")
    def _one_zone_key(self) -> WorkerKeyConfig:
        if self.file is not None and self.env is not None:
            raise ValueError("give the zone's worker key as a file or a variable, not both")
        return self

    @property
    def zone_ref(self) -> KeyRef | None:
        if self.file is not None:
            return KeyRef(source=KeySource.FILE, name=str(self.file))
        if self.env is not None:
            return KeyRef(source=KeySource.ENV, name=self.env)
        return None


_Stamp = tuple[int, int, int]


def _stamp(path: Path) -> _Stamp:
    st = path.stat()
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class WorkerKeys:
    """Every worker's key, kept current: :meth:`header` per request, :meth:`update` when
    the inventory changes, :meth:`reload` on a timer (files that changed are re-read).

    The zone's own key is read by the constructor: :class:`ConfigError` if it cannot be.
    """

    def __init__(
        self,
        config: WorkerKeyConfig,
        *,
        static: Mapping[str, KeyRef] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self._static = dict(static or {})
        self._environ = os.environ if environ is None else environ
        self._loaded: dict[KeyRef, tuple[_Stamp | None, WorkerKey]] = {}
        #: References that failed (logged once until they read again).
        self._failing: set[str] = set()
        self._workers: tuple[GpuWorker, ...] = ()
        self._headers: dict[str, tuple[str, str]] = {}
        #: The ``Authorization`` header for a worker id, or ``None`` (no key): the
        #: headers' own ``get`` (per request a C call; :meth:`update` refills that dict).
        self.header: Callable[[str], tuple[str, str] | None] = self._headers.get
        zone = config.zone_ref
        self._zone_key = self._load(zone, strict=True) if zone is not None else None

    def __repr__(self) -> str:
        return f"WorkerKeys(<{len(self._headers)} workers, keys hidden>)"

    @property
    def enabled(self) -> bool:
        """Whether any key can come from the options (a record may still name one)."""
        cfg = self.config
        return bool(self._static) or cfg.zone_ref is not None or cfg.directory is not None

    def update(self, workers: Iterable[GpuWorker]) -> None:
        """Resolve the key of each of ``workers`` (the zone's whole inventory)."""
        self._workers = tuple(workers)
        headers: dict[str, tuple[str, str]] = {}
        for worker in self._workers:
            key = self._key_of(worker)
            if key is not None:
                headers[worker.id] = key.header
        # Refilled in place (readers hold its get), with no await in between: requests,
        # on the same loop, see the old keys or the new ones.
        self._headers.clear()
        self._headers.update(headers)

    def reload(self) -> None:
        """Re-read the files that changed, then re-resolve every worker's key."""
        zone = self.config.zone_ref
        if zone is not None:
            self._zone_key = self._load(zone, strict=False) or self._zone_key
        self.update(self._workers)

    # ------------------------------------------------------------------ internals

    def _key_of(self, worker: GpuWorker) -> WorkerKey | None:
        directory = self.config.directory
        ref = self._static.get(worker.id)
        if ref is None:
            try:
                ref = record_ref(worker, directory)
            except ConfigError as exc:
                self._fail(f"record:{worker.id}", str(exc))
                return None
        if ref is None and directory is not None:
            own = directory / worker.id
            if _FILE_NAME.match(worker.id) and own.is_file():
                ref = KeyRef(source=KeySource.FILE, name=str(own))
        if ref is None:
            return self._zone_key
        return self._load(ref, strict=False)

    def _load(self, ref: KeyRef, *, strict: bool) -> WorkerKey | None:
        """``ref``'s key: the one loaded already unless its file changed. Not ``strict``:
        a failure is logged once and the last good key (or ``None``) is kept."""
        loaded = self._loaded.get(ref)
        try:
            stamp = _stamp(Path(ref.name)) if ref.source is KeySource.FILE else None
            if loaded is not None and loaded[0] == stamp:
                return loaded[1]
            key = read_key(ref, self._environ)
        except (ConfigError, OSError) as exc:
            if strict:
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(
                    f"worker API key: cannot read {ref.describe()}: {exc.strerror}"
                ) from None
            self._fail(str(ref), str(exc))
            return None if loaded is None else loaded[1]
        if str(ref) in self._failing:
            self._failing.discard(str(ref))
            log.info("worker API key: %s reads again", ref.describe())
        elif loaded is not None:
            log.info("worker API key: reloaded %s", ref.describe())
        self._loaded[ref] = (stamp, key)
        return key

    def _fail(self, what: str, message: str) -> None:
        if what not in self._failing:
            self._failing.add(what)
            log.error("%s", message)


__all__ = [
    "KEY_LABEL",
    "RECORD_ENV_PREFIX",
    "RELOAD_INTERVAL_S",
    "KeyRef",
    "KeySource",
    "WorkerKey",
    "WorkerKeyConfig",
    "WorkerKeys",
    "parse_ref",
    "read_key",
    "record_ref",
]
