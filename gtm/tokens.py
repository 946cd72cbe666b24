"""A deterministic tokenizer approximation, chat token counting and prefix block hashing.

Every tier estimates prompt sizes with these functions, and the GPU emulator
(``gtm gpu-sim``) charges requests with the very same ones, so a router's estimate of a
request and the worker's accounting of it agree exactly.

Tokenizer approximation
    Real tokenizers (tiktoken's cl100k, Llama 3's 128k BPE) are big data files and
    differ per model. gtm needs a *stable, cheap, model-independent* estimate instead:

    1. the text is cut into pieces the way GPT-2/cl100k pre-tokenizers do (a word with
       its leading space, runs of up to 3 digits, runs of punctuation, whitespace);
    2. each piece of at most :data:`CHARS_PER_PIECE_TOKEN` (6) characters is one token,
       a longer one costs ``ceil(len / 6)`` tokens.

    On English prose this gives ≈ 4 characters per token, OpenAI's rule of thumb ("one
    token generally corresponds to ~4 characters of text for common English text",
    help.openai.com "What are tokens and how to count them"); the unit tests pin that
    ratio. Each token gets an id in ``[0, 128000)`` (the size of Llama 3's ordinary
    vocabulary, 128,000 + 256 special tokens) from the CRC-32 of its characters, so equal
    text always gives equal ids — on every machine and in every process, unlike
    Python's salted ``hash()``.

Chat messages
    Counted as OpenAI's cookbook counts them ("How to count tokens with tiktoken":
    ``tokens_per_message = 3``, ``tokens_per_name = 1``, and every reply is primed with
    3 tokens ``<|start|>assistant<|message|>``). :func:`encode_chat` renders exactly that
    many tokens, so ``count_chat_tokens(m) == len(encode_chat(m))``. Standard roles are
    one special token each; an image part costs :data:`IMAGE_PART_TOKENS`.

Prefix block hashes
    Like vLLM's automatic prefix caching: only *full* blocks of ``block_size`` tokens
    are hashed, and block ``i``'s hash covers block ``i-1``'s hash plus its own tokens,
    so equal hashes mean equal whole prefixes. BLAKE2b with an 8-byte digest (the
    stdlib's fastest keyed-quality hash; collisions at 2⁻⁶⁴ are negligible for caches).

Memory of a long prompt
    A piece is a ``str`` object and a token id an ``int`` object, each a block of
    Python's small-object allocator, whose arenas go back to the system only when every
    block in them is free. A long prompt tokenized at once (a list of every piece, a
    tuple of every id) briefly takes many arenas, and the objects other code allocates
    meanwhile keep some of them: a serving process's memory stepped up at every new
    longest prompt and never came back. So text is cut into spans of about
    :data:`SPAN_CHARS` characters at places where no piece can straddle the cut
    (:func:`_spans`), each span's pieces are made and dropped in turn, and
    :func:`encode_text_ids` / :func:`encode_chat_ids` return the ids in an
    ``array("I")`` (4 bytes a token, one block of the C allocator); :func:`token_bytes`
    gives hashing their bytes without an ``int`` per token.

The compiled form
    Every request's prompt is counted, so ASCII text (nearly every prompt) is counted
    and encoded by ``gtm/_tokens.c`` when it is built: one pass over the characters
    with the very pieces of ``_ASCII_PIECE``, no Python object per piece, no spans
    needed. This module keeps the rule (the patterns, the reference forms) and the
    dispatch; text that is not ASCII, and every text of an install without a C
    compiler, takes the patterns (``gtm --version`` says which, :mod:`gtm.native`).
    tests/unit/gtm/test_tokens_kernel.py pins the kernel to both patterns.
"""

from __future__ import annotations

import hashlib
import re
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from gtm.errors import GtmError

#: vLLM's default KV-cache block size (``--block-size 16``), used by every profile.
DEFAULT_BLOCK_SIZE = 16

#: A pre-tokenizer piece of up to this many characters (leading space included) is one
#: token; calibrated so English prose comes out at ≈ 4 characters per token.
CHARS_PER_PIECE_TOKEN = 6

#: Ordinary token ids are in ``[0, ORDINARY_VOCAB)`` (Llama 3: 128,000 BPE tokens).
ORDINARY_VOCAB = 128_000

#: Tokens charged for one image content part: OpenAI's flat cost of a low-detail image
#: (85 tokens, platform.openai.com docs "Images and vision", calculating costs).
IMAGE_PART_TOKENS = 85

#: Overheads from OpenAI's cookbook "How to count tokens with tiktoken".
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3

# Special token ids, in Llama 3's reserved range 128000..128255.
_START = 128_000
_SEPARATOR = 128_001
_END = 128_002
_NAME = 128_003
_IMAGE = 128_004
_ROLE_TOKENS: Mapping[str, int] = {
    "system": 128_010,
    "user": 128_011,
    "assistant": 128_012,
    "tool": 128_013,
    "function": 128_014,
    "developer": 128_015,
}

# GPT-2's pre-tokenizer pattern (openai/gpt-2 encoder.py) in stdlib ``re`` terms:
# contractions, a letter run with its leading space, up to 3 digits (as cl100k groups
# them), a punctuation run, whitespace not followed by a non-space, other whitespace.
_PIECE = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\s+(?!\S)|\s+""")

# The same pattern spelled with ASCII ranges, for text that is all ASCII: it finds the
# very same pieces there (``\s`` on ASCII is ``\t\n\v\f\r``, ``\x1c``-``\x1f`` and space;
# ``\w`` is ``[A-Za-z0-9_]``), and ranges are far cheaper for ``re`` to test per
# character than Unicode categories. tests/unit/gtm/test_tokens.py pins it to _PIECE.
_ASCII_SPACE = r"\t\n\x0b\x0c\r\x1c-\x1f "
_ASCII_PIECE = re.compile(
    rf"""'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]+| ?[0-9]{{1,3}}| ?[^{_ASCII_SPACE}A-Za-z0-9_]+"""
    rf"""|[{_ASCII_SPACE}]+(?![^{_ASCII_SPACE}])|[{_ASCII_SPACE}]+"""
)

#: Tokens a piece of ``n`` characters costs, for ``n < 256`` (``bytes.translate`` table).
_TOKENS_BY_LENGTH = bytes(-(-n // CHARS_PER_PIECE_TOKEN) for n in range(256))

#: Text is pre-tokenized in spans of about this many characters (more where no safe cut
#: is near), so a long prompt's pieces never all exist at once (module docstring).
SPAN_CHARS = 4096

# A safe cut: between an ASCII letter and a space followed by an ASCII letter. A piece
# always ends there (no alternative of either pattern takes a letter and then a space)
# and one starts there (" word"); no alternative looks behind, and the lookahead of the
# whitespace ones never reaches past the next character, so the pieces on each side of
# the cut are those of the whole text.
_SAFE_CUT = re.compile(r"[A-Za-z](?= [A-Za-z])")

#: Messages (or inputs) per request we agree to tokenize; more is an abuse.
MAX_MESSAGES = 10_000

_count_ascii: Callable[[str], int] | None
_ascii_token_ids: Callable[[str], bytes] | None
try:  # the compiled form (setup.py builds it when it can; module docstring)
    from gtm._tokens import ascii_token_ids as _ascii_token_ids
    from gtm._tokens import count_ascii as _count_ascii
except ImportError:  # pragma: no cover - an install without a C compiler
    _count_ascii = _ascii_token_ids = None

#: Whether ASCII text is counted and encoded by the compiled kernel (``gtm --version``
#: says so too, and ``gtm up`` warns at start when it is not: :mod:`gtm.native`).
COMPILED = _count_ascii is not None


class PromptError(GtmError, ValueError):
    """A prompt or chat message list is malformed; the message says what is wrong."""


# ---------------------------------------------------------------------------- text


def _spans(text: str, span_chars: int = SPAN_CHARS) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of consecutive spans covering ``text``, each at least
    ``span_chars`` long but the last, cut only at safe places (``_SAFE_CUT``): the
    pieces of the spans, in order, are the pieces of ``text``. Text with no safe place
    to cut (code without spaces, scripts without ASCII letters) is one span."""
    start, end = 0, len(text)
    while end - start > span_chars:
        cut = _SAFE_CUT.search(text, start + span_chars - 1)
        if cut is None:
            break
        yield start, cut.end()
        start = cut.end()
    yield start, end


def _find_pieces(text: str, start: int = 0, end: int | None = None) -> list[str]:
    """The pre-tokenizer's pieces of ``text[start:end]`` (before long ones are cut);
    the span must end at a safe cut or at the end of ``text``."""
    pattern = _ASCII_PIECE if text.isascii() else _PIECE
    return pattern.findall(text, start, len(text) if end is None else end)


def _pieces(text: str, start: int = 0, end: int | None = None) -> list[str]:
    """The text of each token of ``text[start:end]``: the pieces, a long one cut every
    :data:`CHARS_PER_PIECE_TOKEN` characters (a list built without a Python loop when
    no piece is long, the usual case)."""
    pieces = _find_pieces(text, start, end)
    if max(map(len, pieces), default=0) <= CHARS_PER_PIECE_TOKEN:
        return pieces
    out: list[str] = []
    for piece in pieces:
        if len(piece) <= CHARS_PER_PIECE_TOKEN:
            out.append(piece)
        else:
            for start in range(0, len(piece), CHARS_PER_PIECE_TOKEN):
                out.append(piece[start : start + CHARS_PER_PIECE_TOKEN])
    return out


def _token_id(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8", "surrogatepass")) % ORDINARY_VOCAB


def encode_text(text: str) -> tuple[int, ...]:
    """Token ids of ``text`` under the approximation (see the module docstring)."""
    return tuple(encode_text_ids(text))


def encode_text_ids(text: str) -> array[int]:
    """:func:`encode_text`'s ids in an ``array("I")``, a span at a time: no ``str``
    per piece or ``int`` per id outlives its span (module docstring)."""
    out = array("I")
    _extend_text(out, text)
    return out


def _extend_text(out: array[int], text: str) -> None:
    if _ascii_token_ids is not None and out.itemsize == 4 and text.isascii():
        out.frombytes(_ascii_token_ids(text))
        return
    _extend_text_regex(out, text)


def _extend_text_regex(out: array[int], text: str) -> None:
    """:func:`_extend_text` by the patterns, a span at a time (the form of non-ASCII
    text and of an install without the kernel)."""
    for start, end in _spans(text):
        out.extend(map(_token_id, _pieces(text, start, end)))


def count_text_tokens(text: str) -> int:
    """How many tokens ``text`` is: ``len(encode_text(text))``, without hashing.

    Every prompt of every request is counted here: ASCII text by the compiled kernel
    (module docstring), any other by :func:`_count_text_regex`.
    """
    if _count_ascii is not None and text.isascii():
        return _count_ascii(text)
    return _count_text_regex(text)


def _count_text_regex(text: str) -> int:
    """:func:`count_text_tokens` by the patterns, the per-piece work still in C: the
    pieces' lengths become a ``bytes`` (one byte each), translated to their token costs
    and summed, a span of the text at a time (module docstring). A piece of 256
    characters or more (no byte holds its length) takes
    :func:`count_text_tokens_reference`'s loop."""
    if len(text) <= SPAN_CHARS:  # one span (most texts): no span generator
        return _count_span(text, 0, len(text))
    return sum(_count_span(text, start, end) for start, end in _spans(text))


def _count_span(text: str, start: int, end: int) -> int:
    pieces = _find_pieces(text, start, end)
    try:
        return sum(bytes(map(len, pieces)).translate(_TOKENS_BY_LENGTH))
    except ValueError:  # a piece of 256+ characters
        return _count_pieces(pieces)


def count_text_tokens_reference(text: str) -> int:
    """The reference form of :func:`count_text_tokens` (Unicode pattern, Python loop),
    kept for the test that pins the fast form to it."""
    return _count_pieces(_PIECE.findall(text))


def _count_pieces(pieces: Iterable[str]) -> int:
    return sum(
        1 if len(p) <= CHARS_PER_PIECE_TOKEN else -(-len(p) // CHARS_PER_PIECE_TOKEN)
        for p in pieces
    )


def split_text_tokens_reference(text: str) -> tuple[str, ...]:
    """The reference form of :func:`split_text_tokens` (the Unicode pattern on any text),
    kept for the test that pins the ASCII pattern to it."""
    out: list[str] = []
    for piece in _PIECE.findall(text):
        out.extend(
            piece[start : start + CHARS_PER_PIECE_TOKEN]
            for start in range(0, len(piece), CHARS_PER_PIECE_TOKEN)
        )
    return tuple(out)


def split_text_tokens(text: str) -> tuple[str, ...]:
    """The text of each token (``"".join`` of the result is ``text``)."""
    return tuple(piece for start, end in _spans(text) for piece in _pieces(text, start, end))


# ---------------------------------------------------------------------------- chat


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat message as far as token counting goes."""

    role: str
    text: str = ""
    name: str | None = None
    images: int = 0


def _role_tokens(role: str) -> tuple[int, ...]:
    special = _ROLE_TOKENS.get(role)
    return (special,) if special is not None else encode_text(role)


def encode_chat(messages: Sequence[ChatMessage]) -> tuple[int, ...]:
    """Render a conversation to token ids, primed for the assistant's reply.

    Per message: ``<start> role [<name> name] <sep> content <end>`` — 3 tokens of
    overhead plus 1 for a name, as in OpenAI's cookbook.
    """
    return tuple(encode_chat_ids(messages))


def encode_chat_ids(messages: Sequence[ChatMessage]) -> array[int]:
    """:func:`encode_chat`'s ids in an ``array("I")``, its text a span at a time (module
    docstring)."""
    out = array("I")
    for message in messages:
        out.append(_START)
        out.extend(_role_tokens(message.role))
        if message.name:
            out.append(_NAME)
            _extend_text(out, message.name)
        out.append(_SEPARATOR)
        _extend_text(out, message.text)
        out.extend((_IMAGE,) * (message.images * IMAGE_PART_TOKENS))
        out.append(_END)
    out.extend((_START, _ROLE_TOKENS["assistant"], _SEPARATOR))
    return out


def count_chat_tokens(messages: Sequence[ChatMessage]) -> int:
    """Prompt tokens of a conversation: ``len(encode_chat(messages))``, cheaper."""
    total = REPLY_PRIMING_TOKENS
    for message in messages:
        total += _message_tokens(message.role, message.text, message.name, message.images)
    return total


def _message_tokens(role: str, text: str, name: str | None, images: int) -> int:
    """One message's share of :func:`count_chat_tokens` (``encode_chat``'s tokens for
    it: a role's are one special token, or its text's)."""
    total = TOKENS_PER_MESSAGE + count_text_tokens(text) + images * IMAGE_PART_TOKENS
    total += 1 if role in _ROLE_TOKENS else len(encode_text(role))
    if name:
        total += TOKENS_PER_NAME + count_text_tokens(name)
    return total


def chat_prompt(raw: object) -> tuple[int, str]:
    """An OpenAI ``messages`` array's prompt tokens and text in one pass, without a
    :class:`ChatMessage` per message: ``count_chat_tokens(parse_chat_messages(raw))``,
    and each message's role, name and text on lines of their own (``role\nname\ntext\n``:
    the text a prompt's prefix fingerprints hash). Raises :class:`PromptError` as
    :func:`parse_chat_messages` does."""
    total = REPLY_PRIMING_TOKENS
    parts: list[str] = []
    for role, text, name, images in _chat_fields(raw):
        total += _message_tokens(role, text, name, images)
        parts.append(f"{role}\n{name or ''}\n{text}\n")
    return total, "".join(parts)


def _content_text(content: object, where: str) -> tuple[str, int]:
    """(text, image parts) of an OpenAI ``content`` field: a string or a list of parts."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        raise PromptError(f"{where}.content must be a string or a list of content parts")
    texts: list[str] = []
    images = 0
    for index, part in enumerate(content):
        if not _is_mapping(part):
            raise PromptError(f"{where}.content[{index}] must be an object")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise PromptError(f"{where}.content[{index}].text must be a string")
            texts.append(text)
        elif kind in ("image_url", "input_image", "image"):
            images += 1
        else:
            raise PromptError(f"{where}.content[{index}].type {kind!r} is not supported")
    return "\n".join(texts), images


def _is_mapping(value: object) -> TypeGuard[Mapping[str, object]]:
    """``isinstance(value, Mapping)``; a JSON object is a ``dict``, tested first (an ABC's
    check costs several times a type test)."""
    return type(value) is dict or isinstance(value, Mapping)


def parse_chat_messages(raw: object) -> tuple[ChatMessage, ...]:
    """Validate an OpenAI ``messages`` array into :class:`ChatMessage` records.

    Tool calls and other structured fields of a message are charged as their JSON-ish
    text (``str`` of the value), which is close to how chat templates render them.
    Raises :class:`PromptError` naming the offending element.
    """
    return tuple(
        ChatMessage(role, text, name, images) for role, text, name, images in _chat_fields(raw)
    )


def _chat_fields(raw: object) -> list[tuple[str, str, str | None, int]]:
    """Each message of an OpenAI ``messages`` array, validated, as (role, text, name or
    None, image parts): the one reading of a conversation, for
    :func:`parse_chat_messages` and :func:`chat_prompt`. A list, not a generator: one
    call, where a generator is resumed once per message and once more to end."""
    if (type(raw) is not list and not isinstance(raw, list)) or not raw:
        raise PromptError("messages must be a non-empty array")
    if len(raw) > MAX_MESSAGES:
        raise PromptError(f"at most {MAX_MESSAGES} messages are accepted")
    messages: list[tuple[str, str, str | None, int]] = []
    for index, item in enumerate(raw):
        if type(item) is not dict and not isinstance(item, Mapping):  # _is_mapping, inline
            raise PromptError(f"messages[{index}] must be an object")
        role = item.get("role")
        if (type(role) is not str and not isinstance(role, str)) or not role:
            raise PromptError(f"messages[{index}].role must be a non-empty string")
        content = item.get("content")
        if type(content) is str:  # the usual message, without a call
            text, images = content, 0
        else:
            text, images = _content_text(content, f"messages[{index}]")
        extra = item.get("tool_calls")
        if extra is not None:
            text = f"{text}{extra}"
        name = item.get("name")
        if name is not None and not isinstance(name, str):
            raise PromptError(f"messages[{index}].name must be a string")
        messages.append((role, text, name or None, images))
    return messages


# ---------------------------------------------------------------------------- hashing


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """The ids as consecutive little-endian 32-bit unsigned integers, what the prefix
    hashes and the emulator's completions hash. An ``array("I")`` is copied as it is
    (no ``int`` object per id); ids outside ``[0, 2**32)`` raise ``struct.error``."""
    if isinstance(token_ids, array) and token_ids.typecode == "I" and token_ids.itemsize == 4:
        if sys.byteorder == "little":
            return token_ids.tobytes()
        swapped = array("I", token_ids)
        swapped.byteswap()
        return swapped.tobytes()
    return struct.pack(f"<{len(token_ids)}I", *token_ids)


def prefix_root(salt: str = "") -> int:
    """The parent hash of block 0. A salt (e.g. a tenant's ``cache_salt``) isolates caches."""
    if not salt:
        return 0
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "little")


def block_hashes(
    token_ids: Sequence[int],
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    salt: str = "",
    parent: int | None = None,
) -> tuple[int, ...]:
    """Prefix-chained hashes of every *full* ``block_size``-token block of a prompt.

    ``result[i]`` identifies tokens ``0 .. (i+1)*block_size - 1`` as a whole, so two
    prompts share their first ``k`` hashes exactly when they share their first
    ``k * block_size`` tokens. A trailing partial block is not hashed (vLLM caches only
    full blocks). ``parent``: the hash of the block before ``token_ids`` (they continue
    a prompt, as a KV event's stored blocks do); the salt's root when ``None``.
    """
    if block_size < 1:
        raise PromptError("block_size must be at least 1")
    if parent is None:
        parent = prefix_root(salt)
    full = len(token_ids) // block_size * block_size
    data = token_bytes(token_ids if full == len(token_ids) else token_ids[:full])
    step = 4 * block_size
    out: list[int] = []
    blake2b = hashlib.blake2b
    for start in range(0, 4 * full, step):
        payload = parent.to_bytes(8, "little") + data[start : start + step]
        parent = int.from_bytes(blake2b(payload, digest_size=8).digest(), "little")
        out.append(parent)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """A tokenized prompt: its ids, and (lazily) its prefix block hashes."""

    ids: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.ids)

    def block_hashes(
        self, block_size: int = DEFAULT_BLOCK_SIZE, *, salt: str = ""
    ) -> tuple[int, ...]:
        return block_hashes(self.ids, block_size, salt=salt)

    @classmethod
    def from_text(cls, text: str) -> PromptTokens:
        return cls(encode_text(text))

    @classmethod
    def from_chat(cls, messages: Sequence[ChatMessage]) -> PromptTokens:
        return cls(encode_chat(messages))
