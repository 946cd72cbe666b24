"""The samples the zone agent reads, taken out of a Prometheus text exposition.

Two forms give the same samples (``tests/unit/zone_agent/test_exposition.py`` pins them
together on generated expositions, every engine fixture and each emulator flavour):

* the reference: :func:`relevant` keeps the lines of the families read, and
  prometheus_client's own text parser reads them — lax, general, and costly per line
  (its label parser walks every character in Python);
* :class:`SampleReader`, the form the scraper uses: the same line selection in one pass,
  each kept line matched whole by one compiled expression of the usual shape
  (``name{label="value",...} value [timestamp]``, ``# HELP``/``# TYPE`` lines), labels
  split out only for the samples read whose table needs a label (and for a line of
  several labels, to find a name given twice). Its line loop runs in C
  (``zone_agent/_exposition.c``: the same selection, the expressions written out, the
  same family rules) on an ASCII text, and as Python on any other or without a C
  compiler; the test pins the two loops together, line for line.

The reader's grammar is a strict subset of what the reference accepts, on which the two
agree. A kept line outside it — legal but unusual spacing, a quoted name, an exemplar,
or garbage — makes the reader step aside (:class:`StepAside`, naming the line) and the
caller parses the text with the reference, which either reads it or rejects it as it
always did: an exposition is never read differently, only more slowly.

The reference's own rules the reader keeps: a counter family whose ``# TYPE`` name lacks
``_total`` has its bare samples read as ``name_total``; a label name may appear once in a
line, and never as ``__name__`` or another ``__`` name; values are read as ``float``
would (``NaN``, ``+Inf``, exponents), an integer too large for a float being the
reference's error, not infinity.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: A sample line of the usual shape: name, label block (validated, not split), value,
#: optional integer timestamp, single spaces. Label names starting ``__`` are the
#: reference's to reject (reserved) or read (``__name__``).
_LABEL_NAME = r"(?:[a-zA-Z]|_[a-zA-Z0-9])[a-zA-Z0-9_]*|_"
_LABEL_VALUE = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_LABEL = rf"(?:{_LABEL_NAME})={_LABEL_VALUE}"
_VALUE = r"[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|Inf|inf|NaN)"
_SAMPLE = re.compile(
    rf"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{((?:{_LABEL}(?:,{_LABEL})*,?)?)\}})? ({_VALUE})"
    r"(?: -?[0-9]{1,18})?"
)
#: One label of a block the line expression accepted, and its escapes.
_LABEL_PAIR = re.compile(r'([a-zA-Z0-9_]+)="([^"\\]*(?:\\.[^"\\]*)*)"')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = MappingProxyType({"\\\\": "\\", "\\n": "\n", '\\"': '"'})
#: ``# HELP name [text]`` and ``# TYPE name type``: what the reference reads of them.
_COMMENT = re.compile(
    r"# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:$| (counter|gauge|histogram|summary|untyped|unknown|info|stateset|gaugehistogram)$| )"
)
#: The sample names a family of each type owns (the reference's rule).
_SUFFIXES = MappingProxyType(
    {
        "summary": ("_count", "_sum", ""),
        "histogram": ("_count", "_sum", "_bucket"),
    }
)

#: One sample read: name, labels (empty when its table needs none), value.
Sample = tuple[str, Mapping[str, str], float]
_NO_LABELS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class StepAside:
    """The reader's answer for a text it leaves to the reference: the line and why."""

    line: str
    reason: str


def relevant(text: str, prefixes: tuple[str, ...]) -> str:
    """Only the sample and metadata lines of the families read (the reference's input)."""
    keep: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            if _kept_comment(line, prefixes):
                keep.append(line)
        # Buckets first: most of an exposition's lines, dropped by one substring test
        # before they would be tried against every engine's prefixes.
        elif "_bucket" not in line and "_created" not in line and line.startswith(prefixes):
            keep.append(line)
    keep.append("")
    return "\n".join(keep)


def _kept_comment(line: str, prefixes: tuple[str, ...]) -> bool:
    parts = line.split(" ", 3)
    return len(parts) >= 3 and parts[2].startswith(prefixes)


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _UNESCAPED[m.group(0)], value) if "\\" in value else value


@dataclass(frozen=True, slots=True)
class SampleReader:
    """Reads the samples named in ``wanted`` from the lines :func:`relevant` keeps.

    ``wanted`` maps each sample name read to whether its labels are needed; the labels
    of other samples are validated but not split out. Stateless: one reader serves
    every scrape.
    """

    prefixes: tuple[str, ...]
    wanted: Mapping[str, bool]
    #: Whether the line loop runs compiled when it can (False: its Python form, for the
    #: benchmark's comparison).
    compiled: bool = True
    #: The prefixes by their first ``_head`` characters: a name's head finds the few it
    #: may start with (a name shorter than every prefix starts with none).
    _heads: Mapping[str, tuple[str, ...]] = field(init=False)
    _head: int = field(init=False)

    def __post_init__(self) -> None:
        head = min(map(len, self.prefixes), default=0)
        heads: dict[str, tuple[str, ...]] = {}
        for prefix in self.prefixes:
            heads[prefix[:head]] = (*heads.get(prefix[:head], ()), prefix)
        object.__setattr__(self, "_heads", MappingProxyType(heads))
        object.__setattr__(self, "_head", head)

    def read(self, text: str) -> list[Sample] | StepAside:
        """The wanted samples in line order, or where the reader steps aside."""
        compiled = _kept(text, self.prefixes) if self.compiled and _kept is not None else None
        kept: list[_Kept] | StepAside
        if compiled is None:  # not compiled, or a text outside the compiled form (not ASCII)
            kept = self._kept(text)
        elif isinstance(compiled, tuple):
            kept = StepAside(*compiled)
        else:
            kept = compiled
        if isinstance(kept, StepAside):
            return kept
        out: list[Sample] = []
        wanted = self.wanted
        for name, block, token, line, several in kept:
            needs_labels = wanted.get(name)
            if needs_labels is None:
                continue
            value = float(token)
            # The reference reads an integer as int, then float: -0 is 0.0, and an
            # integer beyond a float's range is its error (float() would give infinity).
            if (value == 0.0 or value in _INFINITIES) and token.lstrip("+-").isdigit():
                try:
                    value = float(int(token))
                except OverflowError:
                    return StepAside(line, "integer value too large for a float")
            if not needs_labels or not block:
                out.append((name, _NO_LABELS, value))
            elif "\\" in block:
                out.append((name, {k: _unescape(v) for k, v in _LABEL_PAIR.findall(block)}, value))
            elif several is not None:
                out.append((name, several, value))
            else:
                # One label, no escapes (the usual model label): no quote inside it.
                label, _, quoted = block.partition('="')
                out.append((name, {label: quoted.removesuffix(",")[:-1]}, value))
        return out

    def _kept(self, text: str) -> list[_Kept] | StepAside:
        """Every kept sample line's name (as the reference names it), label block and
        value, in line order; comments followed for the reference's family rules. (The
        Python form of ``zone_agent/_exposition.c``: the two are pinned together.)"""
        kept: list[_Kept] = []
        sample_match, comment_match = _SAMPLE.fullmatch, _COMMENT.match
        heads, head = self._heads, self._head
        # The reference's family state: its name, type and the sample names it owns;
        # its samples are ``kept[start:]`` (a counter's are renamed when it ends).
        family, kind, start = "", "untyped", 0
        owned: tuple[str, ...] = ("",)  # nothing: no sample is named ""
        for line in text.splitlines():
            # Buckets first: most of an exposition's lines.
            if "_bucket" in line or "_created" in line:
                if line[0] != "#":
                    continue
            elif line[:1] != "#":
                prefixes = heads.get(line[:head])
                if prefixes is None or not line.startswith(prefixes):
                    continue
                sample = sample_match(line)
                if sample is None:
                    return StepAside(line, "sample line not of the usual shape")
                name, block, token = sample.groups()
                several = None
                if block and block.count('="') > 1:  # (a value holds no bare quote)
                    pairs = _LABEL_PAIR.findall(block)
                    several = dict(pairs)
                    if len(several) != len(pairs):
                        return StepAside(line, "a label name twice")
                if name not in owned:  # the family ends; the sample is one on its own
                    if kind == "counter":
                        _end_counter(kept, family, start)
                    family, kind, owned, start = "", "untyped", ("",), len(kept) + 1
                kept.append((name, block, token, line, several))
                continue
            found = comment_match(line)
            if found is None:
                # Kept as ``relevant`` keeps comments: by the third space-separated word.
                parts = line.split(" ", 3)
                if len(parts) < 3:
                    continue
                prefixes = heads.get(parts[2][:head])
                if prefixes is not None and parts[2].startswith(prefixes):
                    return StepAside(line, "comment not of the usual shape")
                continue
            verb, name, declared = found.groups()
            # (the third space-separated word of a usual comment is its name)
            prefixes = heads.get(name[:head])
            if prefixes is None or not name.startswith(prefixes):
                continue
            if verb == "HELP":
                if name != family:
                    if kind == "counter":
                        _end_counter(kept, family, start)
                    family, kind, owned, start = name, "untyped", (name,), len(kept)
                continue
            if declared is None:
                return StepAside(line, "# TYPE without a type")
            if name != family:
                if kind == "counter":
                    _end_counter(kept, family, start)
                family, start = name, len(kept)
            kind = declared
            suffixes = _SUFFIXES.get(kind)
            owned = (name,) if suffixes is None else tuple([name + s for s in suffixes])
        if kind == "counter":
            _end_counter(kept, family, start)
        return kept


#: A kept sample line: name, label block (None: no braces), value text, the line, and
#: the labels (escapes not undone) of a block of several.
_Kept = tuple[str, str | None, str, str, dict[str, str] | None]
_INFINITIES = frozenset({math.inf, -math.inf})


_Compiled = Callable[[str, tuple[str, ...]], "list[_Kept] | tuple[str, str] | None"]
_kept: _Compiled | None
try:  # the compiled form of SampleReader._kept (setup.py builds it when it can)
    from zone_agent._exposition import kept as _kept
except ImportError:  # pragma: no cover - an install without a C compiler
    _kept = None

#: Whether the reader's line loop runs compiled (``gtm --version`` says so too, and the
#: zone agent warns at start when it does not: :mod:`gtm.native`).
COMPILED = _kept is not None


def _end_counter(kept: list[_Kept], family: str, start: int) -> None:
    """A counter family ends: the reference names its samples ``family_total`` when the
    declared name lacks the suffix (its samples are then all named ``family``)."""
    if not family.endswith("_total"):
        kept[start:] = [(n + "_total", b, v, line, d) for n, b, v, line, d in kept[start:]]
