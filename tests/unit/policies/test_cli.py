from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from policies.apikeys import parse_hash, verify_key
from policies.audit import AuditWriter, FsyncPolicy, chain_files
from policies.cli import main
from tests.unit.policies.test_audit import record


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_check_valid(examples: Path) -> None:
    code, out, _ = run("policy", "check", str(examples))
    assert code == 0
    assert out.startswith("OK: 6 documents, 6 regions, 6 rules, 3 tenants, 4 routing profiles")


def test_check_invalid_prints_one_problem_per_line(examples: Path) -> None:
    text = (examples / "regions.yaml").read_text().replace('country: "JP"', "country: JPN")
    (examples / "regions.yaml").write_text(text)
    (examples / "zz.yaml").write_text("kind: Tenants\nfoo: [\n")
    code, out, err = run("policy", "check", str(examples))
    assert code == 1
    assert out.splitlines() == [
        f"{examples / 'regions.yaml'}:33: spec.regions[4].country: expected an ISO 3166-1 "
        "alpha-2 country code in upper case (e.g. 'DE'), got 'JPN'",
        f"{examples / 'zz.yaml'}:3: <root>: malformed YAML: while parsing a flow node; "
        "expected the node content, but found '<stream end>' (line 3, column 1)",
    ]
    assert "2 problem(s); nothing was loaded" in err


def test_schema() -> None:
    code, out, _ = run("policy", "schema", "Residency")
    assert code == 0
    assert json.loads(out)["properties"]["kind"]["const"] == "Residency"
    code, out, _ = run("policy", "schema")
    assert len(json.loads(out)["oneOf"]) == 5
    code, _, err = run("policy", "schema", "Nope")
    assert code == 2
    assert "'Nope' is not one of" in err


def test_explain_by_country() -> None:
    code, out, _ = run(
        "policy", "explain", "--tenant", "acme-health", "--country", "de", "--model", "m"
    )
    assert code == 1  # REFUSED
    lines = out.splitlines()
    assert lines[0] == "query: tenant=acme-health model=m data_class=default client_country=DE"
    assert "verdict: REFUSED (denied) regions: none" in lines
    decided = next(line for line in lines if "← decides the allowed set" in line)
    assert decided.startswith("  allow healthcare-us [tenant] → {us-east, us-west}")
    assert "residency.yaml:" in decided
    assert any("gdpr-stays-in-eea" in line and "(deny wins)" in line for line in lines)


def test_explain_private_address_means_unknown_location() -> None:
    code, out, _ = run(
        "policy", "explain", "--tenant", "demo-eu", "--client-ip", "10.1.2.3", "--model", "m"
    )
    assert code == 0  # ALLOWED
    assert "client: 10.1.2.3 → unknown (a private address: location unknown)" in out
    assert "client location unknown: assumed 'world'" in out
    assert "verdict: ALLOWED (allowed) regions: eu-central, eu-west" in out


def test_explain_refuses_public_addresses_and_bad_input() -> None:
    code, _, err = run(
        "policy", "explain", "--tenant", "t", "--client-ip", "8.8.8.8", "--model", "m"
    )
    assert code == 2
    assert "no GeoIP database; use `gtm policy explain`" in err
    code, _, err = run(
        "policy",
        "explain",
        "--tenant",
        "t",
        "--country",
        "DE",
        "--client-ip",
        "10.0.0.1",
        "--model",
        "m",
    )
    assert (code, "give --country or --client-ip, not both" in err) == (2, True)
    code, _, err = run("policy", "explain", "--tenant", "t", "--country", "Germany", "--model", "m")
    assert (code, "not a two-letter country code" in err) == (2, True)
    code, _, err = run("policy", "explain", "--tenant", "t", "--client-ip", "nope", "--model", "m")
    assert (code, "not an IP address" in err) == (2, True)


def test_explain_notes_models_the_tenant_may_not_use(examples: Path) -> None:
    text = (
        (examples / "tenants.yaml")
        .read_text()
        .replace(
            "    - id: acme-health\n", "    - id: acme-health\n      allowed_models: [llama]\n"
        )
    )
    (examples / "tenants.yaml").write_text(text)
    code, out, _ = run("policy", "explain", "--policies", str(examples), "--tenant", "acme-health",
                       "--country", "US", "--model", "gpt")  # fmt: skip
    assert code == 0  # the residency verdict is ALLOWED; the note is about the model
    assert "note: tenant 'acme-health' may not use model 'gpt'" in out


def test_hash_key_generates_or_reads_stdin() -> None:
    code, out, err = run("policy", "hash-key", "--scrypt-n", "1024")
    assert code == 0
    key = err.split(": ")[-1].strip()
    ident, hashed = (line.split(": ", 1)[1] for line in out.splitlines())
    assert key.startswith(f"gtm-{ident}-")
    assert verify_key(key, parse_hash(hashed))
    code, out, _ = run("policy", "hash-key", "--stdin", "--scrypt-n", "1024", stdin="gtm-demo-eu\n")
    assert code == 0
    assert out.startswith("- id: demo\n  hash: scrypt$1024$8$1$")
    assert verify_key("gtm-demo-eu", parse_hash(out.split("hash: ")[1].strip()))
    code, _, err = run("policy", "hash-key", "--stdin", stdin="sk-not-ours\n")
    assert (code, "malformed API key" in err) == (2, True)
    code, _, err = run("policy", "hash-key", "--scrypt-n", "1000")
    assert (code, "power of two" in err) == (2, True)


def test_audit_verify(tmp_path: Path) -> None:
    with AuditWriter(tmp_path, fsync=FsyncPolicy.NEVER) as writer:
        for i in range(5):
            head = writer.append(record(i))
    code, out, _ = run("audit", "verify", str(tmp_path))
    assert (code, out.strip()) == (0, f"OK: 5 records in 1 file(s); head seq 5 hash {head.hash}")
    (path,) = chain_files(tmp_path)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:3]))
    code, out, err = run("audit", "verify", str(path), "--expect-head", f"5:{head.hash}")
    assert code == 1
    assert out.strip() == (
        f"{path}: chain ends at seq 3 but the head says seq 5: 2 record(s) missing at the end "
        "(truncated)"
    )
    assert "FAILED: 1 problem(s) in 3 records" in err
    code, out, _ = run("audit", "verify", str(path), "--head", str(tmp_path / "audit.head"))
    assert code == 1
    code, _, err = run("audit", "verify", str(path), "--expect-head", "nope")
    assert (code, "expected SEQ:HASH" in err) == (2, True)
    code, out, _ = run("audit", "verify", "--check-records", "--allow-partial", str(path))
    assert (code, out.startswith("OK: 3 records")) == (0, True)


def test_audit_verify_finds_every_chain_of_a_run_directory(tmp_path: Path) -> None:
    # gtm up's layout: one directory per writer, each with a prefix of its own.
    layout = {
        "audit/global": "global",
        "audit/regional-eu-west": "regional",
        "admin-audit": "admin",
    }
    for directory, prefix in layout.items():
        with AuditWriter(tmp_path / directory, prefix=prefix, fsync=FsyncPolicy.NEVER) as w:
            for i in range(3):
                w.append(record(i))
    code, out, err = run("audit", "verify", str(tmp_path))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-1] == "verified 3 chain(s): 3 OK, 0 FAILED"
    for directory, prefix in layout.items():
        assert any(
            line.startswith(f"OK: {tmp_path / directory} ({prefix} chain): 3 records in 1 file(s)")
            for line in lines
        ), (directory, out)
    # Tampering with one chain fails the run and names that chain.
    (path,) = chain_files(tmp_path / "audit/regional-eu-west", "regional")
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:2]))
    code, out, err = run("audit", "verify", str(tmp_path))
    assert code == 1
    assert f"FAILED: {tmp_path / 'audit/regional-eu-west'} (regional chain): 1 problem(s)" in err
    assert out.splitlines()[-1] == "verified 3 chain(s): 2 OK, 1 FAILED"
    code, _, err = run("audit", "verify", str(tmp_path), "--expect-head", f"3:{'0' * 64}")
    assert (code, "give that chain's directory" in err) == (2, True)
    # One chain found below the directory given is named too.
    code, out, _ = run("audit", "verify", str(tmp_path / "audit"))
    assert code == 1
    assert out.splitlines()[-1] == "verified 2 chain(s): 1 OK, 1 FAILED"
    code, out, _ = run("audit", "verify", str(tmp_path / "admin-audit"))
    assert (code, out.startswith("OK: 3 records in 1 file(s)")) == (0, True)
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run("audit", "verify", str(empty))
    assert (code, f"FAILED: no audit chain in {empty}" in err) == (1, True)


def test_audit_verify_without_a_store_warns_that_a_cut_tail_cannot_be_seen(
    tmp_path: Path,
) -> None:
    with AuditWriter(tmp_path, fsync=FsyncPolicy.NEVER) as writer:
        writer.append(record(1))
    code, out, err = run("audit", "verify", str(tmp_path))
    assert code == 0
    assert out.startswith("OK: 1 records in 1 file(s)")
    assert err.splitlines() == [
        "warning: no state store given (--state or GTM_STATE): a tail cut together with its "
        ".head file cannot be seen; verifying the files alone"
    ]
    # `python -m policies` reads no store: asked to, it says where to go instead.
    code, _, err = run("audit", "verify", str(tmp_path), "--state", "etcd://127.0.0.1:2379")
    assert code == 2
    assert "use `gtm audit verify --state`" in err
