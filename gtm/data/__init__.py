"""Package data: what the product reads at run time, shipped in the wheel.

* ``example-topology.yaml`` and ``load-tenant.yaml``: ``gtm up``'s example deployment.
* ``profiles/``: GPU performance profiles, one YAML file per GPU type
  (:mod:`gtm.profile_files`; not affected by ``$GTM_DATA_DIR``: an operator's own
  profiles come with ``--gpu-profiles``).
* ``cities.csv``: the 500 client cities of ``gtm load`` and ``gtm up``'s geo map.
* ``traces/``: the request traces ``gtm load``, ``gtm sim`` and the game days replay
  (Azure LLM inference 2023, CC BY 4.0; Mooncake FAST'25, Apache-2.0), xz-compressed.
* ``geo/cities_top5000.csv.xz``: the simulator's client places (GeoNames, CC BY 4.0).

Licences and sources sit beside each file (``README.md`` lists them). Data that only the
tests and benchmarks read (MaxMind test databases, measured RTT tables, jurisdiction
tables, ServeGen rates) lives in the repository's ``data/`` folder and is not shipped.

:func:`data_dir` is this folder, or ``$GTM_DATA_DIR`` (a folder of the same layout, e.g.
uncompressed or larger copies); :func:`read_text` reads a file of it whether it is stored
plain, ``.xz`` or ``.gz``, so a caller names the plain file and never its compression.
"""

from __future__ import annotations

import gzip
import lzma
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

#: A folder that replaces this one (same layout) for every data file the product reads.
DATA_DIR_ENV = "GTM_DATA_DIR"
#: How a stored file may be compressed, tried in this order after the plain name.
COMPRESSED_SUFFIXES = (".xz", ".gz")


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$GTM_DATA_DIR`` when set, else this package's folder (in a checkout or a wheel)."""
    env = os.environ if environ is None else environ
    override = env.get(DATA_DIR_ENV)
    if override:
        return Path(override)
    return Path(str(resources.files(__name__)))


def origin(environ: Mapping[str, str] | None = None) -> str:
    """Where :func:`data_dir` comes from, for messages about a missing file."""
    env = os.environ if environ is None else environ
    if env.get(DATA_DIR_ENV):
        return f"${DATA_DIR_ENV} = {env[DATA_DIR_ENV]}"
    return "the data shipped with gtm"


def find(path: Path) -> Path:
    """``path`` itself if it exists, else its first compressed form that does; ``path``
    when none does (so the caller's error names the file it asked for)."""
    if path.exists():
        return path
    for suffix in COMPRESSED_SUFFIXES:
        candidate = path.with_name(path.name + suffix)
        if candidate.exists():
            return candidate
    return path


def read_bytes(path: Path) -> bytes:
    """The content of ``path`` (or of its compressed form, see :func:`find`),
    decompressed. Raises ``OSError`` (also for a corrupt archive)."""
    file = find(path)
    raw = file.read_bytes()
    try:
        if file.suffix == ".xz":
            return lzma.decompress(raw)
        if file.suffix == ".gz":
            return gzip.decompress(raw)
    except (lzma.LZMAError, gzip.BadGzipFile, EOFError) as exc:
        raise OSError(f"{file}: corrupt archive ({exc})") from None
    return raw


def read_text(path: Path, encoding: str = "utf-8-sig") -> str:
    """:func:`read_bytes` decoded (a leading byte-order mark dropped)."""
    try:
        return read_bytes(path).decode(encoding)
    except UnicodeDecodeError as exc:
        raise OSError(f"{find(path)}: not {encoding} text ({exc.reason})") from None
