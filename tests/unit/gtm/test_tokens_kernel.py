"""The compiled pre-tokenizer (gtm/_tokens.c) pinned to gtm.tokens' patterns.

Three forms must give the same tokens on ASCII text: the kernel, the ASCII pattern
(``_count_text_regex``, ``_extend_text_regex``, span by span) and the reference
(the Unicode pattern on the whole text). Ids are compared as well as counts: a piece
cut at another place can cost the same tokens (``"0850" "5"`` against ``"085" "05"``)
and still change every prefix hash.
"""

from __future__ import annotations

import os
import zlib
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtm import native
from gtm import tokens as gtm_tokens
from gtm.testing.kernels import expected_state
from gtm.tokens import (
    CHARS_PER_PIECE_TOKEN,
    ORDINARY_VOCAB,
    SPAN_CHARS,
    ChatMessage,
    _count_text_regex,
    _extend_text_regex,
    _spans,
    count_chat_tokens,
    count_text_tokens,
    count_text_tokens_reference,
    encode_chat,
    encode_chat_ids,
    encode_text_ids,
    split_text_tokens_reference,
)

#: Every ASCII whitespace character ``re`` knows (``\x1c``-``\x1f`` included).
SPACES = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "
CONTRACTIONS = ("'s", "'d", "'m", "'t", "'ll", "'ve", "'re")


def _reference_ids(text: str) -> tuple[int, ...]:
    return tuple(
        zlib.crc32(piece.encode("ascii")) % ORDINARY_VOCAB
        for piece in split_text_tokens_reference(text)
    )


def _regex_ids(text: str) -> tuple[int, ...]:
    out = array("I")
    _extend_text_regex(out, text)
    return tuple(out)


def _assert_forms_agree(text: str) -> None:
    assert text.isascii()
    count = count_text_tokens_reference(text)
    ids = _reference_ids(text)
    assert len(ids) == count
    assert _count_text_regex(text) == count
    assert _regex_ids(text) == ids
    assert count_text_tokens(text) == count
    assert tuple(encode_text_ids(text)) == ids
    if gtm_tokens.COMPILED:
        from gtm._tokens import ascii_token_ids, count_ascii

        assert count_ascii(text) == count
        kernel_ids = array("I")
        kernel_ids.frombytes(ascii_token_ids(text))
        assert tuple(kernel_ids) == ids


def test_the_kernel_is_built() -> None:
    # Without it every prompt is counted by the patterns: CI must not pass on that quietly.
    expected = expected_state()
    assert native.kernel("gtm._tokens").state is expected
    assert gtm_tokens.COMPILED is (expected is not native.KernelState.PYTHON)


# Hard cases: each alternative of the pattern, with and without a leading space, the
# contractions (lower case only: ``'S`` is a punctuation run then a letter run),
# digit runs past 3, whitespace runs before a non-space, ``_`` (in no piece), pieces
# of 256+ characters (no byte holds their length in the regex form), control bytes.
HARD_TEXTS = (
    "",
    "_",
    " ",
    "  ",
    "a",
    " a",
    "'",
    "''",
    "'s",
    " 's",
    "it's we'll they've you're I'd I'm don't",
    "IT'S WE'LL THEY'VE YOU'RE I'D I'M DON'T 'S 'Ll 'lL",
    "'ll'' 've're'sss '''d '_s '",
    "1 12 123 1234 12345678901 a1234b ' 1234'",
    "x    y\t\t\tz\n\n\nw \n x\x0b\x0c\ry" + SPACES + "k" + SPACES,
    "a \x1c b\x1f_ c  _d   _",
    "!!! ?!.,;: --> ' !' !!!'s (x) [y] {z} \x00\x01\x7f \x7f",
    "snake_case __init__ _ a_1_b __",
    "a" * 300 + " " + "!" * 257 + "\n" * 260 + "b" + " " * 256 + "7" * 300,
    "trailing spaces   ",
    "\n",
)


@pytest.mark.parametrize("text", HARD_TEXTS)
def test_kernel_equals_the_patterns_on_hard_texts(text: str) -> None:
    _assert_forms_agree(text)


_atoms = st.sampled_from(
    [
        *CONTRACTIONS,
        *(c.upper() for c in CONTRACTIONS),
        *SPACES,
        "'",
        "_",
        "a",
        "Z",
        "word",
        " word",
        "7",
        "1234",
        " 98765",
        "!",
        "?!.",
        " ...",
        "\x00",
        "\x7f",
    ]
)
#: ASCII text built from the hard cases' atoms, and any ASCII at all.
_hard_ascii = st.lists(_atoms, max_size=40).map("".join)
_any_ascii = st.text(alphabet=st.characters(max_codepoint=127), max_size=80)


@given(st.one_of(_hard_ascii, _any_ascii))
@settings(max_examples=1500, deadline=None)
def test_kernel_equals_the_patterns(text: str) -> None:
    _assert_forms_agree(text)


@given(st.lists(st.one_of(_atoms, st.just(" letters"), st.just("x")), min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_kernel_equals_the_patterns_across_span_boundaries(atoms: list[str]) -> None:
    # The regex forms cut text into spans at letter-space-letter; the kernel does not cut:
    # a text long enough for several spans, its hard atoms around every cut.
    unit = "".join(atoms)
    text = (unit + " ab cd ") * (SPAN_CHARS // max(1, len(unit)) + 2)
    assert len(list(_spans(text))) > 1
    _assert_forms_agree(text)


def test_long_pieces_cost_a_token_per_six_characters() -> None:
    for length in (1, 5, 6, 7, 12, 13, 255, 256, 257, 1000):
        text = "x" * length
        assert count_text_tokens(text) == -(-length // CHARS_PER_PIECE_TOKEN)
        _assert_forms_agree(text)


def test_chat_ids_take_the_kernel_for_ascii_and_the_patterns_for_the_rest() -> None:
    ascii_text = "Summarise: it's 12345 items_total.\n\n  done"
    other = "naïve café 汉字 it's"
    for text in (ascii_text, other):
        assert count_text_tokens(text) == count_text_tokens_reference(text)
        assert tuple(encode_text_ids(text)) == tuple(
            zlib.crc32(p.encode("utf-8", "surrogatepass")) % ORDINARY_VOCAB
            for p in split_text_tokens_reference(text)
        )
    chat = [ChatMessage("system", ascii_text, name="ops"), ChatMessage("user", other)]
    assert tuple(encode_chat_ids(chat)) == encode_chat(chat)
    assert len(encode_chat(chat)) == count_chat_tokens(chat)


def test_the_kernel_refuses_what_it_does_not_cover() -> None:
    if not gtm_tokens.COMPILED:  # an install without a compiler, asked for
        assert os.environ.get("GTM_PURE_PYTHON")
        return
    from gtm._tokens import ascii_token_ids, count_ascii

    for function in (count_ascii, ascii_token_ids):
        with pytest.raises(ValueError, match="not ASCII"):
            function("café")
        with pytest.raises(TypeError, match="expected str"):
            function(b"bytes")  # type: ignore[arg-type]
