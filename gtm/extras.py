"""Optional dependencies: which extra brings each, and what a command says without it.

A plain ``pip install gtm-traffic-manager`` brings what every command needs to run; a
few libraries only draw or test things and come with an extra (pyproject.toml
``[project.optional-dependencies]``). The rule for code that uses one:

* where the library only adds to a result (a report's plots), import it with
  :func:`optional`: ``None`` when it is missing, and the result says what it left out
  with :func:`install_line` (a game day is not lost for want of a figure);
* anywhere else a missing optional module ends the command with one line naming the
  extra and exit status 2, never a traceback: the ``gtm`` command turns a
  :class:`ModuleNotFoundError` of a module in :data:`EXTRA_OF` into
  :class:`~gtm.errors.MissingExtra` (:func:`missing_extra`).

The table is the one place that pairs a module with its extra; a test checks it against
pyproject.toml.
"""

from __future__ import annotations

import importlib
from enum import StrEnum
from types import ModuleType

from gtm._version import DISTRIBUTION
from gtm.errors import MissingExtra


class Extra(StrEnum):
    """The extras of pyproject.toml that bring a module product code may import."""

    #: matplotlib: the plots of ``gtm sim``, ``gtm bench routing`` and game-day reports.
    REPORT = "report"
    #: The OTLP span exporter of ``--trace-exporter otlp`` (gtm.tracing; its module lives
    #: in the ``opentelemetry`` namespace the runtime API and SDK share, so gtm.tracing
    #: names the extra itself rather than through :data:`EXTRA_OF`).
    OTLP = "otlp"
    #: A model's tokenizer and chat template for ``gtm zone --kv-events-tokenizer``.
    KV_EVENTS_TOKENIZER = "kv-events-tokenizer"


#: Top-level module → the extra whose install brings it.
EXTRA_OF: dict[str, Extra] = {
    "matplotlib": Extra.REPORT,
    "tokenizers": Extra.KV_EVENTS_TOKENIZER,
    "jinja2": Extra.KV_EVENTS_TOKENIZER,
}


def install_line(extra: Extra) -> str:
    """The command that installs ``extra``: ``pip install 'gtm-traffic-manager[report]'``."""
    return f"pip install '{DISTRIBUTION}[{extra.value}]'"


def optional(module: str) -> ModuleType | None:
    """``module`` imported, or ``None`` when it is not installed (a module of
    :data:`EXTRA_OF`, whose extra the caller names when it says what it left out)."""
    top = module.partition(".")[0]
    if top not in EXTRA_OF:
        raise ValueError(f"{module!r} is not an optional dependency (gtm.extras.EXTRA_OF)")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.partition(".")[0] == top:
            return None
        raise


def missing_extra(exc: ModuleNotFoundError) -> MissingExtra | None:
    """The one-line error for ``exc`` when the missing module is an optional one, else
    ``None`` (a missing runtime dependency is a broken install: let it show)."""
    top = (exc.name or "").partition(".")[0]
    extra = EXTRA_OF.get(top)
    if extra is None:
        return None
    return MissingExtra(f"{top} is not installed (extra '{extra.value}'): {install_line(extra)}")


__all__ = ["EXTRA_OF", "Extra", "install_line", "missing_extra", "optional"]
