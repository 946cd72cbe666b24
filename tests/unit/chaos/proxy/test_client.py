import pytest

from chaos.proxy import errors
from chaos.proxy.client import ToxiproxyClient, raise_for_status
from gtm.errors import ConfigError


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, errors.ToxiproxyBadRequest),
        (404, errors.ToxiproxyNotFound),
        (409, errors.ToxiproxyConflict),
        (503, errors.ToxiproxyUnavailable),
        (500, errors.ToxiproxyServerError),
        (403, errors.ToxiproxyServerError),
        (405, errors.ToxiproxyServerError),
    ],
)
def test_every_failure_status_raises_a_typed_error(
    status: int, error: type[errors.ToxiproxyError]
) -> None:
    with pytest.raises(error) as caught:
        raise_for_status("POST /proxies", status, b'{"error":"boom","status":0}\n')
    assert caught.value.status == status
    assert caught.value.message == "boom"
    assert str(caught.value) == f"POST /proxies: HTTP {status}: boom"


def test_non_json_and_empty_bodies_are_reported_verbatim() -> None:
    with pytest.raises(errors.ToxiproxyServerError, match="User agent not allowed"):
        raise_for_status("GET /proxies", 403, b"User agent not allowed\n")
    with pytest.raises(errors.ToxiproxyUnavailable, match="empty body"):
        raise_for_status("GET /proxies", 503, b"")


@pytest.mark.parametrize("status", [200, 201, 204])
def test_success_passes(status: int) -> None:
    raise_for_status("GET /version", status, b"")


@pytest.mark.parametrize("url", ["https://127.0.0.1:8474", "127.0.0.1:8474", "http://"])
def test_only_plain_http_urls(url: str) -> None:
    with pytest.raises(ConfigError):
        ToxiproxyClient(url)


def test_url_parts() -> None:
    with ToxiproxyClient("http://[::1]:9000", timeout=1.5) as client:
        assert (client.host, client.port, client.timeout) == ("::1", 9000, 1.5)
