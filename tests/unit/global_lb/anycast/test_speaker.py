"""What the speakers are told: ExaBGP's process-API lines, BIRD's include file, and the
ExaBGP acknowledgement handling (a verified fake of ExaBGP's pipe: a StreamReader fed
the answers ExaBGP gives, `done` or `error`)."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from global_lb.anycast.policy import (
    Announcement,
    AnycastPrefix,
    Decision,
    DrainBehaviour,
    DrainPolicy,
    Plan,
)
from global_lb.anycast.speaker import (
    Attributes,
    ExaBgpSpeaker,
    Neighbour,
    Sessions,
    SpeakerError,
    bird_include,
    exabgp_changes,
    exabgp_config,
    exabgp_line,
)

V4 = AnycastPrefix(ipaddress.ip_network("198.51.100.0/24"))
V6 = AnycastPrefix(ipaddress.ip_network("2001:db8:53::/48"))
PREPEND = Attributes(65001, DrainPolicy(prepend=2))
LOCAL_PREF = Attributes(65001, DrainPolicy(behaviour=DrainBehaviour.LOCAL_PREF, local_pref=40))


def plan(*states: tuple[AnycastPrefix, Announcement]) -> Plan:
    return Plan(tuple(Decision(p, a, "test") for p, a in states))


def test_exabgp_lines() -> None:
    net = V4.network
    assert exabgp_line(net, Announcement.ANNOUNCE, PREPEND) == (
        "announce route 198.51.100.0/24 next-hop self"
    )
    assert exabgp_line(net, Announcement.DRAINING, PREPEND) == (
        "announce route 198.51.100.0/24 next-hop self as-path [ 65001 65001 ]"
    )
    assert exabgp_line(net, Announcement.DRAINING, LOCAL_PREF) == (
        "announce route 198.51.100.0/24 next-hop self local-preference 40"
    )
    assert exabgp_line(net, Announcement.WITHDRAW, PREPEND) == (
        "withdraw route 198.51.100.0/24 next-hop self"
    )


def test_exabgp_changes_write_only_what_changed() -> None:
    first = plan((V4, Announcement.ANNOUNCE), (V6, Announcement.WITHDRAW))
    # A prefix never announced is not withdrawn.
    assert exabgp_changes({}, first, PREPEND) == ["announce route 198.51.100.0/24 next-hop self"]
    before = {V4.network: Announcement.ANNOUNCE, V6.network: Announcement.WITHDRAW}
    second = plan((V4, Announcement.DRAINING), (V6, Announcement.WITHDRAW))
    assert exabgp_changes(before, second, PREPEND) == [
        "announce route 198.51.100.0/24 next-hop self as-path [ 65001 65001 ]"
    ]
    assert exabgp_changes(before, first, PREPEND) == []


class RecordingWriter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_line(self, line: str) -> None:
        self.lines.append(line)


async def test_exabgp_speaker_waits_for_each_acknowledgement() -> None:
    reader, writer = asyncio.StreamReader(), RecordingWriter()
    speaker = ExaBgpSpeaker(reader, writer, PREPEND, timeout_s=1.0)
    reader.feed_data(b"done\ndone\n")
    await speaker.apply(plan((V4, Announcement.ANNOUNCE), (V6, Announcement.ANNOUNCE)))
    assert len(writer.lines) == 2
    reader.feed_data(b"error\n")
    with pytest.raises(SpeakerError, match="answered 'error'"):
        await speaker.apply(plan((V4, Announcement.WITHDRAW), (V6, Announcement.ANNOUNCE)))
    # Not taken: the same change is written again next time.
    reader.feed_data(b"done\n")
    await speaker.apply(plan((V4, Announcement.WITHDRAW), (V6, Announcement.ANNOUNCE)))
    assert writer.lines[-1] == "withdraw route 198.51.100.0/24 next-hop self"


async def test_exabgp_speaker_fails_when_exabgp_goes_away() -> None:
    reader = asyncio.StreamReader()
    reader.feed_eof()
    speaker = ExaBgpSpeaker(reader, RecordingWriter(), PREPEND, timeout_s=1.0)
    with pytest.raises(SpeakerError, match="closed"):
        await speaker.apply(plan((V4, Announcement.ANNOUNCE)))


def test_exabgp_config_quotes_what_its_tokeniser_would_split() -> None:
    sessions = Sessions((Neighbour.parse("192.0.2.1,64512,192.0.2.2"),), hold_time_s=9)
    text = exabgp_config(
        router_id="192.0.2.2",
        local_address=None,
        local_as=65001,
        sessions=sessions,
        process=["/usr/bin/python3", "-m", "gtmctl", "--prefix", "203.0.113.0/24,jurisdiction=eu"],
    )
    assert 'run /usr/bin/python3 -m gtmctl --prefix "203.0.113.0/24,jurisdiction=eu";' in text
    assert "local-address 192.0.2.2;" in text
    assert "hold-time 9;" in text
    assert "ipv4 unicast;" in text
    assert "ipv6 unicast;" not in text


def test_bird_include_holds_the_announced_prefixes_with_their_drain_attributes() -> None:
    text = bird_include(plan((V4, Announcement.DRAINING), (V6, Announcement.ANNOUNCE)), PREPEND)
    assert (
        "route 198.51.100.0/24 blackhole { bgp_path.prepend(65001); bgp_path.prepend(65001); };"
        in text
    )
    assert "route 2001:db8:53::/48 blackhole;" in text
    text = bird_include(plan((V4, Announcement.DRAINING)), LOCAL_PREF)
    assert "route 198.51.100.0/24 blackhole { bgp_local_pref = 40; };" in text


def test_bird_include_withdrawn_prefixes_leave_empty_static_protocols() -> None:
    text = bird_include(plan((V4, Announcement.WITHDRAW)), PREPEND)
    assert "route" not in text.replace("routes", "")
    assert "protocol static gtm_anycast4 {" in text
    assert "protocol static gtm_anycast6 {" in text


def test_bird_include_writes_sessions_per_address_family() -> None:
    sessions = Sessions(
        (Neighbour.parse("192.0.2.1,64512"), Neighbour.parse("2001:db8::1,64513")), 3, bfd=True
    )
    text = bird_include(plan((V4, Announcement.ANNOUNCE)), PREPEND, sessions)
    assert "neighbor 192.0.2.1 as 64512;" in text
    assert 'ipv4 { import none; export where proto = "gtm_anycast4"; };' in text
    assert 'ipv6 { import none; export where proto = "gtm_anycast6"; };' in text
    assert text.count("bfd on;") == 2


@pytest.mark.parametrize("text", ["192.0.2.1", "192.0.2.1,x", "nope,64512", "1,2,3,4"])
def test_neighbour_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        Neighbour.parse(text)
