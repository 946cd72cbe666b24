"""What every tier reads from a client request: the API key and the request id."""

from __future__ import annotations

import pytest

from gtm.inbound import MAX_REQUEST_ID, bearer_key, request_id


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("Bearer gtm-key", "gtm-key"),
        ("bearer  gtm-key ", "gtm-key"),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer ", None),
        ("", None),
    ],
)
def test_only_a_bearer_scheme_with_a_key_gives_a_key(header: str, key: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    assert bearer_key(headers) == key


def test_a_sane_client_request_id_is_kept_and_others_replaced() -> None:
    assert request_id({"x-request-id": "abc-123"}, lambda: "new") == "abc-123"
    assert request_id({}, lambda: "new") == "new"
    assert request_id({"x-request-id": "a" * (MAX_REQUEST_ID + 1)}, lambda: "new") == "new"
    assert request_id({"x-request-id": "line\nbreak"}, lambda: "new") == "new"
    assert len(request_id({})) == 32  # a uuid4 in hex by default
