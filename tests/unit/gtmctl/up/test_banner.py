from __future__ import annotations

import pytest

from gtm.topology import Deployment, load_topology, resolve
from gtmctl.up.banner import Listeners, demo_keys, examples, render
from gtmctl.up.config import HostPort
from gtmctl.up.fleet import load_policies
from policies import load_examples


@pytest.fixture(scope="module")
def deployment() -> Deployment:
    return resolve(load_topology(), load_examples().regions)


def test_demo_keys_are_those_the_policies_accept() -> None:
    keys = demo_keys(load_policies(()))
    assert [(k, t) for k, t, _ in keys] == [
        ("gtm-demo-global", "demo-global"),
        ("gtm-demo-eu", "demo-eu"),
        ("gtm-load-test", "load-test"),
    ]
    assert [k for k, _, _ in demo_keys(load_examples())] == ["gtm-demo-global", "gtm-demo-eu"]


def test_banner_lists_listeners_keys_and_three_examples(deployment: Deployment) -> None:
    listeners = Listeners(
        dns=HostPort("127.0.0.1", 5353),
        http=HostPort("127.0.0.1", 8080),
        status_url="http://127.0.0.1:8080/status",
        mode="in-process",
        state="memory",
        ready_s=4.2,
        run_dir="/tmp/x",
    )
    text = render(listeners, deployment, demo_keys(load_examples()))
    assert text.startswith("gtm up: 6 regions, 12 zones, 24 emulated GPUs ready in 4.2 s")
    assert "http://127.0.0.1:8080/status" in text
    assert "region eu-west" in text
    assert "http://127.0.1.3:8080" in text
    assert "gtm-demo-eu" in text
    assert "dig @127.0.0.1 -p 5353 api.inference.example A +subnet=81.2.69.0/24" in text
    assert "curl -si http://127.0.0.1:8080/v1/chat/completions" in text
    assert 'OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="gtm-demo-global")' in text
    assert text.endswith("Ctrl-C stops everything.")


def test_python_example_is_valid_python() -> None:
    lines = examples(HostPort("127.0.0.1", 8080), HostPort("127.0.0.1", 8080), "k", "m")
    start = next(i for i, line in enumerate(lines) if "<<'EOF'" in line)
    end = next(i for i, line in enumerate(lines) if line.strip() == "EOF")
    source = "\n".join(line[2:] for line in lines[start + 1 : end])
    compile(source, "example", "exec")
