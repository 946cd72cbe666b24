"""Admin tokens: stored hashed, verified in constant time, roles, reload, audit records."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from gtm.admin_auth import (
    LOOPBACK_PRINCIPAL,
    AdminAuditRecord,
    AdminAuthError,
    AdminGuard,
    Role,
    TokenFile,
    check_admin_bind,
    default_admin_dir,
    ensure_local_operator_token,
    is_loopback_host,
    is_loopback_peer,
    token_id,
)
from gtm.clock import FakeClock
from gtm.errors import ConfigError
from gtm.openai_errors import ApiError
from policies.audit import AuditWriter, verify


def _request(method: str, token: str | None = None, peer: str = "127.0.0.1") -> object:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default
    )
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return make_mocked_request(method, "/admin/faults", headers=headers, transport=transport)


def test_the_file_holds_a_salted_hash_never_the_token(tmp_path: Path) -> None:
    tokens = TokenFile(tmp_path / "tokens.json")
    token, record = tokens.create(Role.OPERATOR, now=1.0)
    text = (tmp_path / "tokens.json").read_text()
    assert token not in text
    assert token.split("-", 2)[2] not in text  # not even the secret part (it may hold "-")
    assert token_id(token) == record.id
    assert record.id in text
    assert stat.S_IMODE(os.stat(tmp_path / "tokens.json").st_mode) == 0o600
    # Two tokens get different salts, so equal secrets would not give equal hashes.
    _, other = tokens.create(Role.OPERATOR, now=2.0)
    assert other.salt != record.salt
    entry = json.loads(text)["tokens"][0]
    assert set(entry) == {"id", "role", "salt", "sha256", "created"}


def test_authenticate_accepts_the_token_and_nothing_close_to_it(tmp_path: Path) -> None:
    tokens = TokenFile(tmp_path / "tokens.json")
    token, record = tokens.create(Role.READ_ONLY, now=0.0)
    assert tokens.authenticate(token) == record
    flipped = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert tokens.authenticate(flipped) is None
    assert tokens.authenticate("gtma-aaaaaaaa-" + "x" * 43) is None  # unknown id
    for garbage in ("", "gtma-", "Bearer", token + "x", "gtm-demo-global", "ü" * 60):
        assert tokens.authenticate(garbage) is None


def test_verification_uses_a_constant_time_comparison(tmp_path: Path) -> None:
    tokens = TokenFile(tmp_path / "tokens.json")
    token, _ = tokens.create(Role.OPERATOR, now=0.0)
    with mock.patch("gtm.admin_auth.hmac.compare_digest", return_value=True) as compare:
        assert tokens.authenticate(token) is not None
    compare.assert_called_once()


def test_created_and_revoked_tokens_take_effect_without_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    server_view = TokenFile(path)  # what a running server holds
    assert server_view.records() == {}
    token, record = TokenFile(path).create(Role.OPERATOR, now=0.0)  # another process
    assert server_view.authenticate(token) == record
    assert TokenFile(path).revoke(record.id)
    assert server_view.authenticate(token) is None
    assert not TokenFile(path).revoke(record.id)


def test_a_broken_token_file_names_the_file_and_entry(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text("{not json")
    with pytest.raises(AdminAuthError, match=r"tokens\.json: not valid JSON"):
        TokenFile(path).records()
    path.write_text(json.dumps({"version": 1, "tokens": [{"id": "x", "role": "root"}]}))
    with pytest.raises(AdminAuthError, match=r"tokens\[0\]: invalid token entry"):
        TokenFile(path).records()
    with pytest.raises(ConfigError, match="--admin-token-file"):
        AdminGuard.from_options(token_file=path, audit_dir=None, clock=FakeClock())


def test_roles() -> None:
    assert Role.READ_ONLY.allows("GET")
    assert Role.READ_ONLY.allows("head")
    assert not Role.READ_ONLY.allows("POST")
    assert not Role.READ_ONLY.allows("DELETE")
    assert all(Role.OPERATOR.allows(m) for m in ("GET", "POST", "PUT", "PATCH", "DELETE"))


def test_guard_401_403_and_success(tmp_path: Path) -> None:
    tokens = TokenFile(tmp_path / "tokens.json")
    reader, _ = tokens.create(Role.READ_ONLY, now=0.0)
    operator, op_record = tokens.create(Role.OPERATOR, now=0.0)
    guard = AdminGuard(tokens=tokens, clock=FakeClock())
    with pytest.raises(ApiError) as missing:
        guard.authorize(_request("GET"))  # type: ignore[arg-type]
    assert missing.value.status == 401
    assert missing.value.headers()["WWW-Authenticate"] == 'Bearer realm="gtm-admin"'
    assert missing.value.body()["error"]["type"] == "authentication_error"
    with pytest.raises(ApiError) as bad:
        guard.authorize(_request("GET", "gtma-aaaaaaaa-" + "b" * 43))  # type: ignore[arg-type]
    assert bad.value.status == 401
    assert 'error="invalid_token"' in bad.value.headers()["WWW-Authenticate"]
    with pytest.raises(ApiError) as low:
        guard.authorize(_request("POST", reader))  # type: ignore[arg-type]
    assert low.value.status == 403
    assert low.value.body()["error"]["code"] == "insufficient_role"
    assert guard.authorize(_request("GET", reader)).role is Role.READ_ONLY  # type: ignore[arg-type]
    principal = guard.authorize(_request("POST", operator, peer="192.0.2.1"))  # type: ignore[arg-type]
    assert principal.who == op_record.id
    # Tokens are required even from loopback once a token file is configured.
    with pytest.raises(ApiError):
        guard.authorize(_request("GET", peer="127.0.0.1"))  # type: ignore[arg-type]


def test_without_a_token_file_only_loopback_is_trusted() -> None:
    guard = AdminGuard(tokens=None, clock=FakeClock())
    assert guard.authorize(_request("POST")).who == LOOPBACK_PRINCIPAL  # type: ignore[arg-type]
    with pytest.raises(ApiError) as refused:
        guard.authorize(_request("GET", peer="198.51.100.7"))  # type: ignore[arg-type]
    assert refused.value.status == 403


def test_loopback_checks_and_bind_refusal(tmp_path: Path) -> None:
    assert is_loopback_host("localhost")
    assert is_loopback_host("127.0.0.2")
    assert is_loopback_host("[::1]")
    assert not is_loopback_host("0.0.0.0")
    assert is_loopback_peer("::ffff:127.0.0.1")
    assert not is_loopback_peer("::ffff:10.0.0.1")
    assert not is_loopback_peer(None)
    assert not is_loopback_peer("garbage")
    check_admin_bind("127.0.0.1", allow_remote=False, token_file=None)
    with pytest.raises(ConfigError, match="not a loopback address"):
        check_admin_bind("0.0.0.0", allow_remote=False, token_file=tmp_path / "t.json")
    with pytest.raises(ConfigError, match="--admin-token-file"):
        check_admin_bind("0.0.0.0", allow_remote=True, token_file=None)
    check_admin_bind("0.0.0.0", allow_remote=True, token_file=tmp_path / "t.json")


def test_local_operator_token_is_created_once(tmp_path: Path) -> None:
    path, created = ensure_local_operator_token(tmp_path, now=0.0)
    assert created
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    token = path.read_text().strip()
    again, created_again = ensure_local_operator_token(tmp_path, now=1.0)
    assert (again, created_again) == (path, False)
    assert path.read_text().strip() == token
    record = TokenFile(tmp_path / "tokens.json").authenticate(token)
    assert record is not None
    assert record.role is Role.OPERATOR
    # A revoked local token is replaced on the next run.
    TokenFile(tmp_path / "tokens.json").revoke(record.id)
    _, replaced = ensure_local_operator_token(tmp_path, now=2.0)
    assert replaced
    assert path.read_text().strip() != token


def test_default_admin_dir_follows_the_environment(tmp_path: Path) -> None:
    assert default_admin_dir({"GTM_ADMIN_DIR": str(tmp_path)}) == tmp_path
    assert default_admin_dir({"XDG_CONFIG_HOME": "/x"}) == Path("/x/gtm/admin")


def test_audit_records_chain_and_verify(tmp_path: Path) -> None:
    with AuditWriter(tmp_path, prefix="admin") as writer:
        for status in (200, 401, 403):
            writer.append(
                AdminAuditRecord(
                    time=1.5,
                    who="abcdefgh",
                    role="operator",
                    method="POST",
                    route="/admin/faults",
                    target="/admin/faults",
                    status=status,
                    client="127.0.0.1",
                )
            )
    report = verify([tmp_path])
    assert report.ok
    assert report.records == 3
    (chain_file,) = tmp_path.glob("admin-*.jsonl")
    lines = chain_file.read_text().splitlines()
    assert json.loads(lines[1])["record"]["status"] == 401
    with pytest.raises(ValueError, match="who"):
        AdminAuditRecord(1.0, "bad who\n", "-", "GET", "/", "/", 200, "-")
