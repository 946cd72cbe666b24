"""gtm against a real etcd with TLS, ``--client-cert-auth`` and authentication enabled
(root user, a ``gtm`` role with readwrite on ``/gtm/`` only): the right identity works
(put, get, range, CAS, watch, leases), every wrong one is refused with an error that says
what to check."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from gtm.clock import SystemClock
from gtm.errors import GtmError, StateAccessDenied, StateError, StateUnavailable
from gtm.metrics import new_registry
from gtm.pki import CertificateAuthority
from gtm.state.etcd_server import EtcdServer, EtcdServerTls
from gtm.state.store import StateStore
from gtm.state.url import EtcdTls, open_store

pytestmark = [pytest.mark.integration, pytest.mark.etcd]

PASSWORD = "correct horse battery staple"


@dataclass(frozen=True)
class SecureEtcd:
    server: EtcdServer
    directory: Path
    ca: Path
    other_ca: Path
    cert: Path  # CN=gtm: the gtm etcd user
    key: Path
    stranger_cert: Path  # CN=stranger: signed by the right CA, not an etcd user
    stranger_key: Path
    foreign_cert: Path  # CN=gtm, signed by another CA
    foreign_key: Path
    password_file: Path

    def url(self, query: str) -> str:
        return f"etcd://{self.server.host}:{self.server.port}?{query}"

    @property
    def tls_query(self) -> str:
        return f"cacert={self.ca}&cert={self.cert}&key={self.key}"


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    d = tmp_path_factory.mktemp("secure-etcd")
    ca, other = CertificateAuthority.create("etcd test CA"), CertificateAuthority.create("other")
    ca_path, other_path = ca.write(d / "ca.pem"), other.write(d / "other-ca.pem")
    server_cert, server_key = ca.issue(None, common_name="etcd").write(
        d / "etcd.pem", d / "etcd-key.pem"
    )
    cert, key = ca.issue(None, common_name="gtm").write(d / "gtm.pem", d / "gtm-key.pem")
    root_cert, root_key = ca.issue(None, common_name="root").write(
        d / "root.pem", d / "root-key.pem"
    )
    stranger = ca.issue(None, common_name="stranger").write(d / "s.pem", d / "s-key.pem")
    foreign = other.issue(None, common_name="gtm").write(d / "f.pem", d / "f-key.pem")
    password_file = d / "password"
    password_file.write_text(PASSWORD + "\n")
    try:
        server = EtcdServer(
            d / "data", fsync=False, tls=EtcdServerTls(ca_path, server_cert, server_key)
        )
        server.start()
        server.enable_auth(
            root_password="root-secret",
            user="gtm",
            password=PASSWORD,
            client=EtcdTls(ca_path, root_cert, root_key),
        )
    except GtmError as exc:
        pytest.fail(f"cannot start a TLS etcd with auth for this test: {exc}", pytrace=False)
    yield SecureEtcd(server, d, ca_path, other_path, cert, key, *stranger, *foreign, password_file)
    server.stop()


@asynccontextmanager
async def _store(url: str) -> AsyncIterator[StateStore]:
    store = open_store(url, clock=SystemClock(), registry=new_registry(), timeout=2.0)
    try:
        yield store
    finally:
        await store.aclose()


async def _exercise(store: StateStore, prefix: str) -> None:
    """put, get, range, CAS, watch and a lease, all under ``prefix``."""
    revision = await store.put(f"{prefix}/a", b"1")
    assert (await store.get(f"{prefix}/a")) is not None
    result = await store.compare_and_swap(f"{prefix}/a", b"2", expected_mod_revision=revision)
    assert result.succeeded
    watch = store.watch(f"{prefix}/", start_revision=result.revision)
    batch = await asyncio.wait_for(anext(watch), 5)
    assert batch.events[0].kv.value == b"2"
    await watch.aclose()
    lease = await store.grant_lease(5)
    await store.put(f"{prefix}/leased", b"x", lease=lease.id)
    assert await store.keep_alive(lease.id) > 0
    await store.revoke_lease(lease.id)
    listed = await store.range(f"{prefix}/")
    assert [kv.key for kv in listed.kvs] == [f"{prefix}/a"]
    assert await store.current_revision() >= listed.revision


async def test_user_and_password_over_mtls_work_under_gtm(secure_etcd: SecureEtcd) -> None:
    url = secure_etcd.url(
        f"{secure_etcd.tls_query}&user=gtm&password-file={secure_etcd.password_file}"
    )
    async with _store(url) as store:
        await _exercise(store, "/gtm/test/password")


async def test_password_from_the_environment(
    secure_etcd: SecureEtcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GTM_ETCD_PASSWORD", PASSWORD)
    async with _store(secure_etcd.url(f"{secure_etcd.tls_query}&user=gtm")) as store:
        await store.put("/gtm/test/env/a", b"1")
        assert (await store.get("/gtm/test/env/a")) is not None


async def test_client_certificate_alone_is_the_gtm_user(secure_etcd: SecureEtcd) -> None:
    async with _store(secure_etcd.url(secure_etcd.tls_query)) as store:
        await _exercise(store, "/gtm/test/cert")


@pytest.mark.parametrize("query", ["", "&user=gtm&password-file={pw}"])
async def test_keys_outside_gtm_are_refused(secure_etcd: SecureEtcd, query: str) -> None:
    url = secure_etcd.url(secure_etcd.tls_query + query.format(pw=secure_etcd.password_file))
    async with _store(url) as store:
        with pytest.raises(StateAccessDenied, match=r"readwrite on the /gtm/ prefix"):
            await store.put("/other/key", b"x")
        with pytest.raises(StateAccessDenied, match="permission denied"):
            await store.range("/")
        with pytest.raises(StateAccessDenied):
            await store.get("/gtmx")  # a sibling of the prefix, not inside it


async def test_wrong_password_is_refused(secure_etcd: SecureEtcd) -> None:
    wrong = secure_etcd.directory / "wrong-password"
    wrong.write_text("guess\n")
    url = secure_etcd.url(f"{secure_etcd.tls_query}&user=gtm&password-file={wrong}")
    async with _store(url) as store:
        with pytest.raises(StateAccessDenied, match=r"refused user 'gtm'.*password-file"):
            await store.get("/gtm/test/x")


async def test_certificate_of_no_etcd_user_is_refused(secure_etcd: SecureEtcd) -> None:
    url = secure_etcd.url(
        f"cacert={secure_etcd.ca}&cert={secure_etcd.stranger_cert}&key={secure_etcd.stranger_key}"
    )
    async with _store(url) as store:
        with pytest.raises(StateAccessDenied):
            await store.get("/gtm/test/x")


async def test_wrong_ca_is_refused(secure_etcd: SecureEtcd) -> None:
    url = secure_etcd.url(
        f"cacert={secure_etcd.other_ca}&cert={secure_etcd.cert}&key={secure_etcd.key}"
    )
    async with _store(url) as store:
        with pytest.raises(StateUnavailable, match=r"TLS handshake failed.*cacert="):
            await store.get("/gtm/test/x")


@pytest.mark.parametrize("which", ["foreign client certificate", "no client certificate"])
async def test_client_certificate_etcd_does_not_trust_is_refused(
    secure_etcd: SecureEtcd, which: str
) -> None:
    query = f"cacert={secure_etcd.ca}"
    if which.startswith("foreign"):
        query += f"&cert={secure_etcd.foreign_cert}&key={secure_etcd.foreign_key}"
    async with _store(secure_etcd.url(query)) as store:
        with pytest.raises(StateError):
            await store.put("/gtm/test/x", b"x")


async def test_plaintext_client_is_refused(secure_etcd: SecureEtcd) -> None:
    async with _store(f"etcd://{secure_etcd.server.host}:{secure_etcd.server.port}") as store:
        with pytest.raises(StateUnavailable):
            await store.get("/gtm/test/x")
