"""Deterministic generated text, output lengths and embeddings.

A completion is a pure function of (worker seed, prompt tokens, choice index): the same
prompt sent twice to the same ``--seed`` gets the same answer, as with temperature 0.
Each emitted token is one word from a list of short words (with its leading space) or a
full stop, so that :func:`gtm.tokens.count_text_tokens` of the whole text equals the
number of tokens the engine produced — clients and routers re-counting the output agree
with ``usage.completion_tokens``.

The "natural" length of an answer (where a model would emit end-of-sequence) is drawn
from a log-normal with mean 338 tokens — the mean ShareGPT output length reported in
the vLLM paper (Kwon et al., SOSP 2023, Table 1) — and σ = 1.
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
from collections.abc import Sequence

from gtm.tokens import token_bytes

#: Short words (≤ 5 letters, so " word" is one token under gtm.tokens' approximation).
WORDS: tuple[str, ...] = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "his",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "or",
    "has",
    "had",
    "not",
    "but",
    "first",
    "one",
    "their",
    "its",
    "new",
    "after",
    "who",
    "they",
    "have",
    "her",
    "she",
    "two",
    "been",
    "other",
    "when",
    "there",
    "all",
    "also",
    "into",
    "over",
    "only",
    "most",
    "some",
    "time",
    "would",
    "about",
    "may",
    "more",
    "up",
    "than",
    "can",
    "out",
    "made",
    "years",
    "many",
    "such",
    "where",
    "later",
    "then",
    "these",
    "while",
    "both",
    "well",
    "used",
    "under",
    "those",
    "being",
    "same",
    "each",
    "part",
    "place",
    "since",
    "known",
    "work",
    "world",
    "life",
    "city",
    "state",
    "small",
    "large",
    "early",
    "long",
    "great",
    "high",
    "local",
    "group",
    "music",
    "water",
    "light",
    "power",
    "model",
    "data",
    "token",
    "cache",
    "block",
    "route",
    "queue",
    "graph",
    "chain",
    "layer",
    "batch",
    "score",
    "shard",
    "level",
    "point",
    "order",
    "value",
    "field",
    "range",
    "stage",
    "frame",
    "track",
    "round",
    "cycle",
    "phase",
    "pulse",
    "logic",
    "focus",
    "scale",
    "index",
    "yes",
    "no",
    "just",
    "very",
    "much",
    "even",
    "still",
    "back",
    "down",
    "here",
    "away",
    "again",
    "never",
    "often",
    "soon",
    "below",
    "above",
    "near",
    "along",
    "among",
    "every",
    "few",
    "any",
    "own",
    "our",
    "your",
    "my",
    "we",
    "you",
    "he",
    "them",
    "what",
    "how",
    "why",
    "true",
    "false",
    "north",
    "south",
    "east",
    "west",
    "river",
    "stone",
    "cloud",
    "green",
    "black",
    "white",
    "blue",
    "red",
)

#: One word in this many is followed by a full stop (≈ 12-word sentences).
SENTENCE_WORDS = 12

#: Log-normal natural output length: mean 338 tokens (ShareGPT, vLLM paper), σ = 1.
NATURAL_LENGTH_MEAN = 338.0
NATURAL_LENGTH_SIGMA = 1.0
NATURAL_LENGTH_MAX = 4096


def _digest(seed: int, tokens: Sequence[int], choice: int) -> int:
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(struct.pack("<qq", seed, choice))
    hasher.update(token_bytes(tokens))
    return int.from_bytes(hasher.digest(), "little")


class Completion:
    """The deterministic answer to one prompt: a natural length and lazily made text."""

    __slots__ = ("_rng", "_since_stop", "natural_length", "produced")

    def __init__(self, seed: int, prompt_tokens: Sequence[int], choice: int = 0) -> None:
        self._rng = random.Random(_digest(seed, prompt_tokens, choice))
        mu = math.log(NATURAL_LENGTH_MEAN) - NATURAL_LENGTH_SIGMA**2 / 2
        length = round(self._rng.lognormvariate(mu, NATURAL_LENGTH_SIGMA))
        self.natural_length = max(1, min(NATURAL_LENGTH_MAX, length))
        self.produced = 0
        self._since_stop = 0

    def next_token(self) -> str:
        """Text of the next output token (one word with its space, or a full stop)."""
        index = self.produced
        self.produced += 1
        if self._since_stop >= SENTENCE_WORDS:
            self._since_stop = 0
            return "."
        word = WORDS[self._rng.randrange(len(WORDS))]
        self._since_stop += 1
        if index == 0:
            return word.capitalize()
        return " " + (word.capitalize() if self._since_stop == 1 else word)

    def take(self, count: int) -> str:
        return "".join(self.next_token() for _ in range(count))


def embedding(seed: int, tokens: Sequence[int], dimensions: int) -> list[float]:
    """A unit-length pseudo-embedding of ``dimensions`` floats for ``tokens``."""
    rng = random.Random(_digest(seed, tokens, -1))
    vector = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]
