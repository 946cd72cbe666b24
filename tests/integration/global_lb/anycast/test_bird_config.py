"""BIRD 2 itself accepts every include file gtm writes (`bird -p`: parse only)."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest

from global_lb.anycast.policy import (
    Announcement,
    AnycastPrefix,
    Decision,
    DrainBehaviour,
    DrainPolicy,
    Plan,
)
from global_lb.anycast.speaker import Attributes, Neighbour, Sessions, bird_include

pytestmark = pytest.mark.anycast

V4 = AnycastPrefix(ipaddress.ip_network("198.51.100.0/24"))
V6 = AnycastPrefix(ipaddress.ip_network("2001:db8:53::/48"))


@pytest.mark.parametrize("behaviour", list(DrainBehaviour))
@pytest.mark.parametrize("state", list(Announcement))
def test_bird_parses_the_include(
    tmp_path: Path, behaviour: DrainBehaviour, state: Announcement
) -> None:
    plan = Plan((Decision(V4, state, "t"), Decision(V6, state, "t")))
    sessions = Sessions(
        (Neighbour.parse("192.0.2.1,64512"), Neighbour.parse("2001:db8::1,64512")), 3, bfd=True
    )
    include = tmp_path / "gtm-anycast.conf"
    include.write_text(bird_include(plan, Attributes(65001, DrainPolicy(behaviour)), sessions))
    conf = tmp_path / "bird.conf"
    conf.write_text(
        f'router id 192.0.2.2;\nprotocol device {{}}\nprotocol bfd {{}}\ninclude "{include}";\n'
    )
    done = subprocess.run(["bird", "-p", "-c", str(conf)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + include.read_text()
