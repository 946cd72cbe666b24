"""``gtm admin token``: every command names the file and token it changed, a missing
file or an unknown id is refused in one line (exit 2), and ``create`` prints its undo."""

from __future__ import annotations

import shlex
from pathlib import Path

from click.testing import CliRunner

from gtm.admin_auth import TokenFile
from gtmctl.cli import cli


def gtm(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), prog_name="gtm")
    return result.exit_code, result.stdout, result.stderr


def test_a_missing_token_file_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "tokens.json"
    for command in (("list",), ("revoke", "abc")):
        code, out, err = gtm("admin", "token", *command, "--token-file", str(missing))
        assert code == 2, (command, out, err)
        [line] = err.splitlines()
        assert f"{missing}: no such token file (`gtm admin token create` makes one)" in line
        assert not missing.exists()
    # An existing file without tokens is not an error.
    missing.write_text('{"version": 1, "tokens": []}\n')
    code, out, err = gtm("admin", "token", "list", "--token-file", str(missing))
    assert (code, out, err.strip()) == (0, "", f"no tokens in {missing}")


def test_create_names_the_file_and_prints_the_revoke_that_undoes_it(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    code, out, err = gtm(
        "admin", "token", "create", "--role", "operator", "--token-file", str(path)
    )
    assert code == 0
    record = TokenFile(path).authenticate(out.strip())
    assert record is not None
    assert err.startswith(f"created operator token {record.id} in {path} (a new file); ")
    undo = shlex.split(err.split("undo: ", 1)[1])
    assert undo == ["gtm", "admin", "token", "revoke", record.id, "--token-file", str(path)]
    code, out, err = gtm(*undo[1:])
    assert code == 0, err
    assert out.startswith(f"revoked operator token {record.id} (created ")
    assert f"from {path}; a revoked token cannot be restored" in out
    replace = shlex.split(out.split("create a new one: ", 1)[1])
    assert replace == ["gtm", "admin", "token", "create", "--role", "operator",
                       "--token-file", str(path)]  # fmt: skip
    assert not TokenFile(path).records()


def test_revoke_refuses_an_id_the_file_does_not_hold(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    code, out, _ = gtm("admin", "token", "create", "--role", "read-only", "--token-file", str(path))
    assert code == 0
    record = TokenFile(path).authenticate(out.strip())
    assert record is not None
    code, _, err = gtm("admin", "token", "revoke", "nope", "--token-file", str(path))
    assert code == 2
    [line] = err.splitlines()
    assert f"no token with id 'nope' in {path} (its ids: {record.id})" in line
    assert record.id in TokenFile(path).records()
