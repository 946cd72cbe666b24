"""``--state`` URLs with TLS and authentication options (etcdctl's names, in the query)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gtm.errors import ConfigError
from gtm.state.url import EtcdAuth, EtcdTls, parse_state_url


def test_tls_and_auth_options_parse_and_round_trip() -> None:
    text = (
        "etcd://10.0.0.1:2379,10.0.0.2?cacert=/etc/gtm/ca.pem&cert=/etc/gtm/c.pem"
        "&key=/etc/gtm/k.pem&user=gtm&password-file=/run/secrets/etcd"
    )
    url = parse_state_url(text)
    assert url.tls == EtcdTls(
        Path("/etc/gtm/ca.pem"), Path("/etc/gtm/c.pem"), Path("/etc/gtm/k.pem")
    )
    assert url.auth == EtcdAuth("gtm", Path("/run/secrets/etcd"))
    assert [str(e) for e in url.endpoints] == ["10.0.0.1:2379", "10.0.0.2:2379"]
    assert parse_state_url(str(url)) == url


def test_plain_url_has_no_tls_or_auth() -> None:
    url = parse_state_url("etcd://127.0.0.1:2379")
    assert url.tls is None
    assert url.auth is None
    assert str(url) == "etcd://127.0.0.1:2379"


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("password=hunter2", "never goes in the URL"),
        ("user=gtm&password=hunter2", "password-file=PATH or \\$GTM_ETCD_PASSWORD"),
        ("cacert=a&cacert=b", "given twice"),
        ("cacert=", "is empty"),
        ("tls=1", "unknown option 'tls'"),
        ("cacert=ca&cert=c", "needs both cert= and key="),
        ("cert=c&key=k", "need cacert="),
        ("password-file=p", "needs user="),
        ("cacert", "is not NAME=VALUE"),
    ],
)
def test_bad_options_are_refused_with_the_reason(query: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_state_url(f"etcd://127.0.0.1:2379?{query}")


def test_password_comes_from_the_file_or_the_environment(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\nignored\n")
    assert EtcdAuth("gtm", secret).password() == "s3cret"
    assert EtcdAuth("gtm").password({"GTM_ETCD_PASSWORD": "from-env"}) == "from-env"
    with pytest.raises(ConfigError, match=r"needs a password.*GTM_ETCD_PASSWORD"):
        EtcdAuth("gtm").password({})
    with pytest.raises(ConfigError, match="cannot read the etcd password file"):
        EtcdAuth("gtm", tmp_path / "missing").password()
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        EtcdAuth("gtm", tmp_path / "empty").password()
