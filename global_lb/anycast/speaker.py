"""The BGP speakers gtm drives: ExaBGP (default) and BIRD 2, behind :class:`Speaker`.

gtm does not implement BGP. A speaker is told the whole plan (:class:`~global_lb.anycast.
policy.Plan`) each time and returns once it has *taken* it — so a withdrawal on SIGTERM
is known to have reached the speaker before the front door stops listening.

* :class:`ExaBgpSpeaker` — ExaBGP's process API: ExaBGP runs ``gtm anycast`` as one of its
  processes; gtm writes ``announce route …`` / ``withdraw route …`` lines to its standard
  output and reads ExaBGP's acknowledgement (``done`` / ``error``, one per line) from its
  standard input. Only changes are written (ExaBGP keeps the announced set).
* :class:`BirdSpeaker` — BIRD 2's control socket: gtm writes an include file holding two
  static protocols (``gtm_anycast4``, ``gtm_anycast6``) with one route per announced
  prefix, a draining one carrying its AS-path prepend or lower local preference as route
  attributes; then ``birdc configure`` (a soft reconfiguration: the static protocols change
  their routes, sessions stay up), then polls ``birdc show route protocol …`` until the
  table holds exactly the announced set. The operator's ``bird.conf`` includes the file
  and exports ``where proto ~ "gtm_anycast*"`` to its BGP neighbours.

Rendering (the lines, the file) is pure and unit-tested; the I/O is the thin rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from global_lb.anycast.policy import (
    Announcement,
    DrainBehaviour,
    DrainPolicy,
    IPNetwork,
    Plan,
)
from global_lb.errors import GlobalError

#: How long a speaker may take to acknowledge a plan before it is an error.
DEFAULT_TIMEOUT_S = 10.0


class SpeakerError(GlobalError):
    """The speaker refused a command or did not take it in time."""


class Speaker(Protocol):
    """What the controller needs of a BGP speaker."""

    name: str

    async def apply(self, plan: Plan) -> None:
        """Make the speaker announce what ``plan`` says; return once it has taken it."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Attributes:
    """What a draining route carries (from :class:`DrainPolicy`) and whose AS it is."""

    local_as: int
    drain: DrainPolicy

    def prepends(self, announcement: Announcement) -> int:
        if announcement is not Announcement.DRAINING:
            return 0
        return self.drain.prepend if self.drain.behaviour is DrainBehaviour.PREPEND else 0

    def local_pref(self, announcement: Announcement) -> int | None:
        if announcement is not Announcement.DRAINING:
            return None
        behaviour = self.drain.behaviour
        return self.drain.local_pref if behaviour is DrainBehaviour.LOCAL_PREF else None


# ---------------------------------------------------------------------------- ExaBGP


def exabgp_line(network: IPNetwork, announcement: Announcement, attrs: Attributes) -> str:
    """One process-API command for ``network`` in state ``announcement``."""
    if announcement is Announcement.WITHDRAW:
        return f"withdraw route {network} next-hop self"
    line = f"announce route {network} next-hop self"
    if prepends := attrs.prepends(announcement):
        line += " as-path [ " + " ".join([str(attrs.local_as)] * prepends) + " ]"
    if (pref := attrs.local_pref(announcement)) is not None:
        line += f" local-preference {pref}"
    return line


def exabgp_changes(
    previous: Mapping[IPNetwork, Announcement], plan: Plan, attrs: Attributes
) -> list[str]:
    """The commands that take ExaBGP from ``previous`` to ``plan``: one per prefix whose
    state changed (a prefix never announced is not withdrawn)."""
    lines = []
    for decision in plan.decisions:
        network, state = decision.prefix.network, decision.announcement
        before = previous.get(network, Announcement.WITHDRAW)
        if state is not before:
            lines.append(exabgp_line(network, state, attrs))
    return lines


class ExaBgpSpeaker:
    """gtm as an ExaBGP process: commands out on ``writer``, acknowledgements in on
    ``reader`` (the process's stdout and stdin; ExaBGP's ``api.ack`` is on by default)."""

    name = "exabgp"

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: _LineWriter,
        attrs: Attributes,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._attrs = attrs
        self._timeout_s = timeout_s
        self._state: dict[IPNetwork, Announcement] = {}

    async def apply(self, plan: Plan) -> None:
        for line in exabgp_changes(self._state, plan, self._attrs):
            self._writer.write_line(line)
            answer = await self._ack(line)
            if answer != "done":
                raise SpeakerError(f"exabgp answered {answer!r} to {line!r}")
        self._state = {d.prefix.network: d.announcement for d in plan.decisions}

    async def _ack(self, line: str) -> str:
        try:
            raw = await asyncio.wait_for(self._reader.readline(), self._timeout_s)
        except TimeoutError:
            raise SpeakerError(f"exabgp did not acknowledge {line!r}") from None
        if not raw:
            raise SpeakerError("exabgp closed the process pipe")
        return raw.decode(errors="replace").strip()

    async def close(self) -> None:
        return None


class _LineWriter(Protocol):
    def write_line(self, line: str) -> None: ...


@dataclass(frozen=True, slots=True)
class FileLineWriter:
    """Writes each command as one line on a file descriptor (the process's stdout)."""

    fd: int = 1

    def write_line(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())


def exabgp_config(
    *,
    router_id: str,
    local_address: str | None,
    local_as: int,
    sessions: Sessions,
    process: Sequence[str],
) -> str:
    """An ExaBGP configuration that peers with the ``sessions``' neighbours and runs
    ``process`` (``gtm anycast … --speaker exabgp``) with the text encoder."""
    quoted = " ".join(_exabgp_word(arg) for arg in process)
    blocks = [f"process gtm {{\n    run {quoted};\n    encoder text;\n}}\n"]
    for peer in sessions.neighbours:
        address, peer_as = peer.address, peer.asn
        local = peer.local or local_address
        if local is None:
            raise ValueError(f"neighbour {address}: no local address")
        blocks.append(
            f"neighbor {address} {{\n"
            f"    router-id {router_id};\n"
            f"    local-address {local};\n"
            f"    local-as {local_as};\n"
            f"    peer-as {peer_as};\n"
            f"    hold-time {sessions.hold_time_s};\n"
            f"    family {{\n        ipv{address.version} unicast;\n    }}\n"
            "    api {\n        processes [ gtm ];\n    }\n"
            "}\n"
        )
    return "\n".join(blocks)


def _exabgp_word(arg: str) -> str:
    """``arg`` as one token of ExaBGP's configuration: its tokeniser splits on spaces,
    commas, brackets and semicolons outside quotes, so such an argument is quoted."""
    if re.fullmatch(r"[A-Za-z0-9_./:=@+%-]+", arg):
        return arg
    if '"' in arg or "\\" in arg or "\n" in arg:
        raise ValueError(f"{arg!r}: cannot be passed through an ExaBGP configuration")
    return f'"{arg}"'


# ---------------------------------------------------------------------------- BIRD 2

STATIC4 = "gtm_anycast4"
STATIC6 = "gtm_anycast6"


@dataclass(frozen=True, slots=True)
class Neighbour:
    """A BGP neighbour of the speaker: its address and AS."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    asn: int
    #: The speaker's own address on the session (ExaBGP's ``local-address``).
    local: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None

    @classmethod
    def parse(cls, text: str) -> Neighbour:
        """``ADDRESS,AS[,LOCAL_ADDRESS]`` (``192.0.2.1,64512`` or
        ``2001:db8::1,64512,2001:db8::2``)."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) not in (2, 3):
            raise ValueError(f"{text!r}: expected ADDRESS,AS[,LOCAL_ADDRESS]")
        try:
            local = ipaddress.ip_address(parts[2]) if len(parts) == 3 else None
            return cls(ipaddress.ip_address(parts[0]), int(parts[1]), local)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Sessions:
    """BGP sessions gtm writes for its speaker (for BIRD, empty: the operator's bird.conf
    has its own)."""

    neighbours: tuple[Neighbour, ...] = ()
    hold_time_s: int = 3
    bfd: bool = False


NO_SESSIONS = Sessions()


def bird_sessions(sessions: Sessions, local_as: int) -> list[str]:
    """One ``protocol bgp`` per neighbour, exporting only gtm's static routes of its
    address family (BFD needs a ``protocol bfd`` in bird.conf)."""
    out = []
    for index, peer in enumerate(sessions.neighbours, start=1):
        family = peer.address.version
        static = STATIC4 if family == 4 else STATIC6
        out += [
            f"protocol bgp gtm_peer{index} {{",
            f"    local as {local_as};",
            f"    neighbor {peer.address} as {peer.asn};",
            f"    hold time {sessions.hold_time_s};",
            "    connect retry time 1;",
            *(["    bfd on;"] if sessions.bfd else []),
            f'    ipv{family} {{ import none; export where proto = "{static}"; }};',
            "}",
        ]
    return out


def bird_include(plan: Plan, attrs: Attributes, sessions: Sessions = NO_SESSIONS) -> str:
    """The include file for ``plan``: both static protocols, always present (an empty one
    withdraws everything), one route per announced prefix; then ``sessions``."""
    routes: dict[int, list[str]] = {4: [], 6: []}
    for decision in plan.announced():
        network, state = decision.prefix.network, decision.announcement
        actions = [f"bgp_path.prepend({attrs.local_as});"] * attrs.prepends(state)
        if (pref := attrs.local_pref(state)) is not None:
            actions.append(f"bgp_local_pref = {pref};")
        body = " { " + " ".join(actions) + " }" if actions else ""
        routes[network.version].append(f"    route {network} blackhole{body};")
    out = ["# Written by gtm anycast: do not edit (rewritten on every change)."]
    for version, name in ((4, STATIC4), (6, STATIC6)):
        out += [f"protocol static {name} {{", f"    ipv{version};", *routes[version], "}"]
    out += bird_sessions(sessions, attrs.local_as)
    return "\n".join(out) + "\n"


class BirdSpeaker:
    """BIRD 2 through ``birdc``: rewrite the include file, reconfigure, confirm."""

    name = "bird"

    def __init__(
        self,
        include: Path,
        attrs: Attributes,
        *,
        sessions: Sessions = NO_SESSIONS,
        control_socket: Path | None = None,
        birdc: str = "birdc",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._include = include
        self._attrs = attrs
        self._sessions = sessions
        self._base = [birdc] + ([] if control_socket is None else ["-s", str(control_socket)])
        self._timeout_s = timeout_s
        self._written: str | None = None

    async def apply(self, plan: Plan) -> None:
        text = bird_include(plan, self._attrs, self._sessions)
        if text != self._written:
            tmp = self._include.with_name(self._include.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(self._include)  # atomic: BIRD never reads half a file
            out = await self._birdc("configure")
            if "Reconfigured" not in out and "Reconfiguration in progress" not in out:
                raise SpeakerError(f"birdc configure: {out.strip()}")
            self._written = text
        await self._confirm({d.prefix.network for d in plan.announced()})

    async def _confirm(self, expected: set[IPNetwork]) -> None:
        """Until BIRD's table holds exactly ``expected`` from the static protocols."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            held = await self.routes()
            if held == expected:
                return
            if time.monotonic() > deadline:
                raise SpeakerError(f"bird holds {sorted(map(str, held))}, expected {expected}")
            await asyncio.sleep(0.02)

    async def routes(self) -> set[IPNetwork]:
        """The prefixes BIRD holds from gtm's static protocols."""
        held: set[IPNetwork] = set()
        for name in (STATIC4, STATIC6):
            for line in (await self._birdc("show", "route", "protocol", name)).splitlines():
                word = line.split(maxsplit=1)[0] if line.strip() else ""
                with contextlib.suppress(ValueError):
                    if "/" in word:
                        held.add(ipaddress.ip_network(word))
        return held

    async def _birdc(self, *command: str) -> str:
        try:
            process = await asyncio.create_subprocess_exec(
                *self._base,
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as exc:
            raise SpeakerError(f"cannot run {self._base[0]}: {exc}") from None
        try:
            out, _ = await asyncio.wait_for(process.communicate(), self._timeout_s)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise SpeakerError(f"birdc {' '.join(command)}: no answer") from None
        text = out.decode(errors="replace")
        if process.returncode != 0:
            raise SpeakerError(f"birdc {' '.join(command)}: {text.strip()}")
        return text

    async def close(self) -> None:
        return None
