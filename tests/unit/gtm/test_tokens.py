from __future__ import annotations

import itertools
import re
import struct
import tracemalloc
import zlib
from array import array
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtm.errors import GtmError
from gtm.tokens import (
    DEFAULT_BLOCK_SIZE,
    IMAGE_PART_TOKENS,
    ORDINARY_VOCAB,
    REPLY_PRIMING_TOKENS,
    SPAN_CHARS,
    TOKENS_PER_MESSAGE,
    ChatMessage,
    PromptError,
    PromptTokens,
    _pieces,
    _spans,
    block_hashes,
    chat_prompt,
    count_chat_tokens,
    count_text_tokens,
    count_text_tokens_reference,
    encode_chat,
    encode_chat_ids,
    encode_text,
    encode_text_ids,
    parse_chat_messages,
    prefix_root,
    split_text_tokens,
    split_text_tokens_reference,
    token_bytes,
)

ENGLISH = (
    "In computer science, a hash table is a data structure that implements an associative "
    "array, also called a dictionary or simply map; an associative array is an abstract data "
    "type that maps keys to values. A hash table uses a hash function to compute an index, "
    "also called a hash code, into an array of buckets or slots, from which the desired value "
    "can be found. During lookup, the key is hashed and the resulting hash indicates where the "
    "corresponding value is stored. Most hash table designs employ an imperfect hash function."
)


def test_english_prose_is_about_four_characters_per_token() -> None:
    # OpenAI's rule of thumb: ~4 characters of English per token.
    ratio = len(ENGLISH) / count_text_tokens(ENGLISH)
    assert 3.6 <= ratio <= 4.6


def test_encoding_is_deterministic_and_stable_across_processes() -> None:
    # Golden values: CRC-32 based ids must never change (routers and workers must agree).
    assert encode_text("Hello, world!") == (8578, 878, 85707, 85971)
    assert split_text_tokens("Hello, world!") == ("Hello", ",", " world", "!")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a",
        "internationalization",
        "12345678",
        "x = y + 1;\n\tz",
        "日本語のテキスト",
        "  spaced  ",
    ],
)
def test_count_matches_encoding_and_pieces_rebuild_the_text(text: str) -> None:
    ids = encode_text(text)
    assert count_text_tokens(text) == len(ids)
    assert "".join(split_text_tokens(text)) == text
    assert all(0 <= i < ORDINARY_VOCAB for i in ids)


def test_long_words_cost_more_tokens() -> None:
    assert count_text_tokens(" cat") == 1
    assert count_text_tokens(" internationalization") == 4  # 21 chars / 6 per token
    assert count_text_tokens("1234567") == 3  # digits in runs of at most 3


def test_chat_count_follows_openai_cookbook_overheads() -> None:
    one = [ChatMessage("user", "hi")]
    # 3 per message + role (1 special token) + content (1) + 3 priming the reply
    assert count_chat_tokens(one) == TOKENS_PER_MESSAGE + 1 + 1 + REPLY_PRIMING_TOKENS == 8
    named = [ChatMessage("user", "hi", name="bob")]
    assert count_chat_tokens(named) == 8 + 1 + count_text_tokens("bob")


@pytest.mark.parametrize(
    "messages",
    [
        [ChatMessage("system", "You are terse."), ChatMessage("user", "Summarise: " + ENGLISH)],
        [ChatMessage("user", "look", images=2), ChatMessage("assistant", "ok", name="a1")],
        [ChatMessage("custom-role", "text")],
    ],
)
def test_chat_count_equals_rendered_length(messages: list[ChatMessage]) -> None:
    assert count_chat_tokens(messages) == len(encode_chat(messages))


def test_images_cost_a_flat_amount() -> None:
    plain = count_chat_tokens([ChatMessage("user", "x")])
    assert count_chat_tokens([ChatMessage("user", "x", images=1)]) == plain + IMAGE_PART_TOKENS


def test_parse_chat_messages_accepts_openai_shapes() -> None:
    parsed = parse_chat_messages(
        [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is"},
                    {"type": "image_url", "image_url": {"url": "data:..."}},
                    {"type": "text", "text": "this"},
                ],
                "name": "ann",
            },
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        ]
    )
    assert parsed[0] == ChatMessage("system", "be brief")
    assert parsed[1] == ChatMessage("user", "what is\nthis", name="ann", images=1)
    assert parsed[2].text == "[{'id': 'c1'}]"


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("hello", "non-empty array"),
        ([], "non-empty array"),
        (["x"], "messages[0] must be an object"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "audio"}]}], "not supported"),
        ([{"role": "user", "content": [{"type": "text", "text": 1}]}], "content[0].text"),
        ([{"role": "user", "content": ["x"]}], "content[0] must be an object"),
        ([{"role": "user", "content": "x", "name": 5}], "name must be a string"),
    ],
)
def test_parse_chat_messages_names_the_problem(raw: object, needle: str) -> None:
    pattern = needle.replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(PromptError, match=pattern) as info:
        parse_chat_messages(raw)
    assert isinstance(info.value, GtmError)
    with pytest.raises(PromptError, match=pattern):  # the one pass refuses alike
        chat_prompt(raw)


_JSON_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
_PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _JSON_TEXT}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_image", "image"])}),
)
_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool"]), _JSON_TEXT),
        "content": st.one_of(st.none(), _JSON_TEXT, st.lists(_PART, max_size=3)),
    },
    optional={
        "name": st.one_of(st.none(), _JSON_TEXT),
        "tool_calls": st.lists(st.fixed_dictionaries({"id": _JSON_TEXT}), max_size=2),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_MESSAGE, min_size=1, max_size=6))
def test_chat_prompt_is_the_two_pass_reading_in_one(raw: list[dict[str, object]]) -> None:
    try:
        messages = parse_chat_messages(raw)
    except PromptError as refused:
        with pytest.raises(PromptError, match=re.escape(str(refused))):
            chat_prompt(raw)
        return
    text = "".join(f"{m.role}\n{m.name or ''}\n{m.text}\n" for m in messages)
    assert chat_prompt(raw) == (count_chat_tokens(messages), text)
    assert chat_prompt(raw)[0] == len(encode_chat(messages))


def test_block_hashes_are_prefix_chained() -> None:
    base = list(range(40))
    other = [*range(20), 999, *range(21, 40)]  # differs in block 1 (tokens 16..31)
    a, b = block_hashes(base), block_hashes(other)
    assert len(a) == 2  # the trailing 8 tokens do not make a full block
    assert a[0] == b[0]
    assert a[1] != b[1]
    # A change in block 0 changes every later hash, even with identical later tokens.
    c = block_hashes([7, *range(1, 40)])
    assert c[0] != a[0]
    assert c[1] != a[1]


def test_block_hashes_golden_values_and_options() -> None:
    assert block_hashes(list(range(32)))[:2] == (10251598853290956434, 14413796365232270483)
    assert block_hashes(list(range(32)), salt="tenant-a") != block_hashes(list(range(32)))
    assert prefix_root() == 0
    assert prefix_root("x") != 0
    assert len(block_hashes(list(range(32)), 4)) == 8
    assert block_hashes(list(range(15))) == ()
    with pytest.raises(PromptError):
        block_hashes([1, 2], 0)


def test_prompt_tokens_wraps_ids_and_hashes() -> None:
    prompt = PromptTokens.from_text(ENGLISH)
    assert prompt.count == count_text_tokens(ENGLISH)
    assert prompt.block_hashes() == block_hashes(prompt.ids, DEFAULT_BLOCK_SIZE)
    chat = PromptTokens.from_chat([ChatMessage("user", ENGLISH)])
    assert chat.count == count_chat_tokens([ChatMessage("user", ENGLISH)])


# -- the fast forms pinned to the reference forms (every prompt is counted with them)

#: ASCII text where the ASCII pattern could part from the Unicode one: every space
#: character (``\x1c``-``\x1f`` are whitespace to ``re``), the underscore (no piece
#: takes it), contractions, digit runs, runs longer than a byte can count.
EDGE_TEXTS = (
    ENGLISH,
    "",
    "\x1c\x1d\x1e\x1f \t\n\x0b\x0c\r  x",
    "snake_case __init__ _ a_1_b",
    "don't we'll they've you're I'd 'S 'sss ''ll",
    "1234567 12 3 0000 x1y22z333",
    "a" * 300 + " " + "!" * 257 + "\n" * 260 + "b",
    "  trailing   spaces \n\n  \tand tabs\t",
)
UNICODE_EDGE_TEXTS = ("naïve café ², ½ ٣٤٥ 汉字 ü\u00a0x\u2028y 😀!!", "_\u0301é")

_ascii_text = st.text(alphabet=st.characters(max_codepoint=127))
_weighted_ascii = st.text(alphabet="ab sdmtlvre'_1234567890.!,\t\n\x1c\x0b")


def _reference_ids(text: str) -> tuple[int, ...]:
    """Token ids as the reference forms give them: CRC-32 of each token's UTF-8."""
    return tuple(
        zlib.crc32(piece.encode("utf-8", "surrogatepass")) % ORDINARY_VOCAB
        for piece in split_text_tokens_reference(text)
    )


@pytest.mark.parametrize("text", EDGE_TEXTS + UNICODE_EDGE_TEXTS)
def test_fast_count_and_pieces_equal_the_reference_on_edge_texts(text: str) -> None:
    assert count_text_tokens(text) == count_text_tokens_reference(text)
    assert split_text_tokens(text) == split_text_tokens_reference(text)
    assert encode_text(text) == _reference_ids(text)


@given(st.one_of(st.text(), _ascii_text, _weighted_ascii))
@settings(max_examples=500, deadline=None)
def test_fast_count_and_pieces_equal_the_reference(text: str) -> None:
    assert count_text_tokens(text) == count_text_tokens_reference(text)
    assert split_text_tokens(text) == split_text_tokens_reference(text)
    assert encode_text(text) == _reference_ids(text)


def test_token_ids_of_the_fixture_prompt_are_unchanged() -> None:
    # The ids feed prefix block hashes (the emulator's prefix cache, KV events): the
    # last block hash of the fixture prompt as the reference forms gave it.
    ids = encode_text(ENGLISH)
    assert len(ids) == count_text_tokens_reference(ENGLISH) == 131
    assert block_hashes(ids)[-1] == 0xF83F53B447DF7708


# -- long prompts: pre-tokenized a span at a time, ids in an array (module docstring)

_span_text = st.text(alphabet="ab AB'1.!_\t\n\x1c\u00e9\u00a0")


@given(_span_text, st.integers(min_value=1, max_value=12))
@settings(max_examples=500, deadline=None)
def test_spans_cut_where_the_whole_text_has_a_piece_boundary(text: str, span: int) -> None:
    spans = list(_spans(text, span))
    assert spans[0][0] == 0
    assert spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert all(end - start >= span for start, end in spans[:-1])
    pieces = [p for start, end in spans for p in _pieces(text, start, end)]
    assert pieces == list(split_text_tokens_reference(text))


def _long_prose(words: int) -> str:
    return " ".join(ENGLISH.split()[i % 90] for i in range(words))


def test_long_texts_equal_the_reference_across_spans() -> None:
    text = _long_prose(5_000) + " 12345 don't   stop\n\n" + "x" * 5_000 + " " + _long_prose(3_000)
    assert len(list(_spans(text))) > 3
    assert count_text_tokens(text) == count_text_tokens_reference(text)
    assert split_text_tokens(text) == split_text_tokens_reference(text)
    assert encode_text(text) == _reference_ids(text)
    assert tuple(encode_text_ids(text)) == _reference_ids(text)
    chat = [ChatMessage("system", "be brief", name="ops", images=1), ChatMessage("user", text)]
    assert tuple(encode_chat_ids(chat)) == encode_chat(chat)
    assert len(encode_chat(chat)) == count_chat_tokens(chat)


def test_token_bytes_are_little_endian_uint32_from_any_sequence() -> None:
    ids = (0, 1, 258, 2**32 - 1)
    assert token_bytes(ids) == struct.pack("<4I", *ids)
    assert token_bytes(array("I", ids)) == token_bytes(list(ids))
    with pytest.raises(struct.error):
        token_bytes((2**32,))
    assert block_hashes(array("I", range(32))) == block_hashes(list(range(32)))
    # A trailing partial block is not hashed, so its ids are never packed.
    assert block_hashes([*range(16), -1]) == block_hashes(list(range(16)))


def _peak_bytes(work: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = work()
        peak = tracemalloc.get_traced_memory()[1] - before
        del result
        return peak
    finally:
        tracemalloc.stop()


def test_a_long_prompt_is_counted_and_encoded_without_an_object_per_token() -> None:
    # A 14,000-token prompt (the soak trace's longest): counting it and encoding it for
    # the emulator must not hold a str per piece or an int per id all at once, which
    # took ~1.4 MB of small-object arenas and stepped every tier's memory up for good.
    text = _long_prose(11_000)
    tokens = count_text_tokens(text)
    assert tokens > 12_000
    per_token_bound = 8  # the array's 4 bytes a token, and room for its growth
    span_bound = 64 * SPAN_CHARS  # one span's pieces, with their list
    bound = per_token_bound * tokens + span_bound
    assert _peak_bytes(lambda: count_text_tokens(text)) < span_bound
    assert _peak_bytes(lambda: encode_text_ids(text)) < bound
    assert _peak_bytes(lambda: encode_chat_ids([ChatMessage("user", text)])) < bound
    ids = encode_chat_ids([ChatMessage("user", text)])
    assert _peak_bytes(lambda: block_hashes(ids)) < bound
