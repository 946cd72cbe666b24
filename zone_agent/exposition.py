"""The samples the zone agent reads, taken out of a Prometheus text exposition.

Two forms give the same samples (``tests/unit/zone_agent/test_exposition.py`` pins them
together on generated expositions, every engine fixture and each emulator flavour):

* the reference: :func:`relevant` keeps the lines of the families read, and
  prometheus_client's own text parser reads them — lax, general, and costly per line
  (its label parser walks every character in Python);
* :class:`SampleReader`, the form the scraper uses: the same line selection in one pass,
  each kept line matched whole by one compiled expression of the usual shape
  (``name{label="value",...} value [timestamp]``, ``# HELP``/``# TYPE`` lines), labels
  split out only for the samples read whose table needs a label.

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
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

#: A sample line of the usual shape: name, label block (validated, not split), value,
#: optional integer timestamp, single spaces. Label names starting ``__`` are the
#: reference's to reject (reserved) or read (``__name__``).
_LABEL_NAME = r"(?:[a-zA-Z]|_[a-zA-Z0-9])[a-zA-Z0-9_]*|_"
_LABEL_VALUE = r'"(?:[^"\\]|\\.)*"'
_LABEL = rf"(?:{_LABEL_NAME})={_LABEL_VALUE}"
_VALUE = r"[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|Inf|inf|NaN)"
_SAMPLE = re.compile(
    rf"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{((?:{_LABEL}(?:,{_LABEL})*,?)?)\}})? ({_VALUE})"
    r"(?: -?[0-9]{1,18})?"
)
#: One label of a block the line expression accepted, and its escapes.
_LABEL_PAIR = re.compile(r'([a-zA-Z0-9_]+)="((?:[^"\\]|\\.)*)"')
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
    of other samples are validated but not split out.
    """

    prefixes: tuple[str, ...]
    wanted: Mapping[str, bool]

    def read(self, text: str) -> list[Sample] | StepAside:
        """The wanted samples in line order, or where the reader steps aside."""
        out: list[Sample] = []
        prefixes, sample_match, comment_match = self.prefixes, _SAMPLE.fullmatch, _COMMENT.match
        # The reference's family state: its name, type, the sample names it owns, and
        # its samples not yet given out (a counter's are renamed when the family ends).
        family, kind = "", "untyped"
        owned: tuple[str, ...] = ("",)  # nothing: no sample is named ""
        pending: list[_Pending] = []
        for line in text.splitlines():
            if line.startswith("#"):
                found = comment_match(line)
                if found is None or (found.group(1) == "TYPE" and found.group(3) is None):
                    if _kept_comment(line, prefixes):
                        return StepAside(line, "comment not of the usual shape")
                    continue
                name = found.group(2)
                if not name.startswith(prefixes):
                    continue
                if found.group(1) == "HELP":
                    if name != family:
                        if pending and (aside := self._flush(out, family, kind, pending)):
                            return aside
                        family, kind, owned = name, "untyped", (name,)
                    continue
                if name != family:
                    if pending and (aside := self._flush(out, family, kind, pending)):
                        return aside
                    family = name
                kind = found.group(3)
                owned = tuple(name + s for s in _SUFFIXES.get(kind, ("",)))
                continue
            if "_bucket" in line or "_created" in line or not line.startswith(prefixes):
                continue
            sample = sample_match(line)
            if sample is None:
                return StepAside(line, "sample line not of the usual shape")
            name, block, token = sample.groups()
            if block is not None and block.count('="') > 1:
                pairs = _LABEL_PAIR.findall(block)
                if len(dict(pairs)) != len(pairs):
                    return StepAside(line, "a label name twice")
            if name in owned:
                pending.append(_Pending(line, name, block, token))
                continue
            if pending and (aside := self._flush(out, family, kind, pending)):
                return aside
            family, kind, owned = "", "untyped", ("",)
            if not self._give(out, name, block, token):
                return StepAside(line, _TOO_LARGE)
        if pending and (aside := self._flush(out, family, kind, pending)):
            return aside
        return out

    def _flush(
        self, out: list[Sample], family: str, kind: str, pending: list[_Pending]
    ) -> StepAside | None:
        """Give out a family's samples (a counter's renamed as the reference does)."""
        rename = kind == "counter" and not family.endswith("_total")
        for line, name, block, token in pending:
            if not self._give(out, name + "_total" if rename else name, block, token):
                return StepAside(line, _TOO_LARGE)
        pending.clear()
        return None

    def _give(self, out: list[Sample], name: str, block: str | None, token: str) -> bool:
        """Append the sample if it is wanted; False if its value is not a float."""
        needs_labels = self.wanted.get(name)
        if needs_labels is None:
            return True
        value = float(token)
        # The reference reads an integer as int, then float: -0 is 0.0, and an integer
        # beyond a float's range its error (float() of the text would be infinity).
        if (value == 0.0 or math.isinf(value)) and token.lstrip("+-").isdigit():
            try:
                value = float(int(token))
            except OverflowError:
                return False
        if needs_labels and block:
            labels: Mapping[str, str] = {k: _unescape(v) for k, v in _LABEL_PAIR.findall(block)}
        else:
            labels = _NO_LABELS
        out.append((name, labels, value))
        return True


class _Pending(NamedTuple):
    line: str
    name: str
    block: str | None
    token: str


_TOO_LARGE = "integer value too large for a float"
