"""zone_agent.upstream's header fields: an all-ASCII head (decoded once, split as text)
reads as the byte-by-byte form reads it, field for field and refusal for refusal."""

from __future__ import annotations

import pytest

from zone_agent.upstream import (
    UpstreamProtocolError,
    _ascii_fields,
    _byte_fields,
    _fields,
)

LINES = [
    b"Content-Type: application/json",
    b"content-length:2",
    b"X-Odd:   spaced \t",
    b"X-Empty:",
    b"X-Colon: a:b:c",
    b"X-Dup: 1",
    b"x-dup: 2",
    b"X-Ctl: \x1c\x1dvalue\x1f",  # str.strip() would take these; bytes.strip() does not
    b"X-Vt: \x0bv\x0c",
]
BAD = [
    b"no colon here",
    b": no name",
    b" X-Lead: space",
    b"X-Trail : space",
    b"X-Tab\t: tab",
    b"\x0bX-Vt: name",
    b"X-Ff\x0c: name",
]


@pytest.mark.parametrize("line", LINES)
def test_an_ascii_field_reads_as_the_byte_form_reads_it(line: bytes) -> None:
    assert _ascii_fields([line.decode("ascii")]) == _byte_fields([line])


def test_a_name_ending_in_a_control_character_str_strips_is_kept_as_bytes_keep_it() -> None:
    line = b"X-Fs\x1c: v"
    assert _ascii_fields([line.decode("ascii")]) == _byte_fields([line]) == [("X-Fs\x1c", "v")]


@pytest.mark.parametrize("line", BAD)
def test_a_bad_ascii_line_is_refused_with_the_byte_forms_message(line: bytes) -> None:
    with pytest.raises(UpstreamProtocolError) as ascii_error:
        _ascii_fields([line.decode("ascii")])
    with pytest.raises(UpstreamProtocolError) as byte_error:
        _byte_fields([line])
    assert str(ascii_error.value) == str(byte_error.value)


def test_a_head_with_other_bytes_takes_the_byte_form() -> None:
    head = b"HTTP/1.1 200 OK\r\nX-Name: caf\xc3\xa9 \xff\r\nX-Plain: a"
    assert _fields(head, head.split(b"\r\n")) == [
        ("X-Name", "café \udcff"),
        ("X-Plain", "a"),
    ]


def test_a_whole_ascii_head_reads_field_for_field() -> None:
    head = b"\r\n".join([b"HTTP/1.1 200 OK", *LINES])
    assert _fields(head, head.split(b"\r\n")) == _byte_fields(LINES)
