from __future__ import annotations

import math
import statistics
from array import array

import pytest

from gpusim.textgen import NATURAL_LENGTH_MEAN, WORDS, Completion, embedding
from gtm.tokens import count_text_tokens, encode_text


def test_every_word_is_one_token_with_its_leading_space() -> None:
    assert len(set(WORDS)) == len(WORDS)
    for word in WORDS:
        assert count_text_tokens(" " + word.capitalize()) == 1, word


def test_text_re_counts_to_the_number_of_tokens_produced() -> None:
    completion = Completion(seed=3, prompt_tokens=encode_text("Tell me a story."))
    text = completion.take(200)
    assert count_text_tokens(text) == 200
    assert text[0].isupper()
    assert "." in text


def test_completions_are_deterministic_per_seed_prompt_and_choice() -> None:
    prompt = encode_text("Hello there")
    a = Completion(1, prompt)
    b = Completion(1, prompt)
    assert (a.natural_length, a.take(50)) == (b.natural_length, b.take(50))
    assert Completion(2, prompt).take(50) != Completion(1, prompt).take(50)
    assert Completion(1, prompt, choice=1).take(50) != Completion(1, prompt).take(50)
    assert Completion(1, encode_text("Other")).take(50) != Completion(1, prompt).take(50)


def test_natural_lengths_follow_the_sharegpt_mean() -> None:
    lengths = [Completion(0, (i,)).natural_length for i in range(4000)]
    assert min(lengths) >= 1
    assert statistics.fmean(lengths) == pytest.approx(NATURAL_LENGTH_MEAN, rel=0.1)


def test_embeddings_are_unit_vectors_and_deterministic() -> None:
    vector = embedding(5, (1, 2, 3), 1024)
    assert len(vector) == 1024
    assert math.isclose(math.fsum(v * v for v in vector), 1.0, rel_tol=1e-9)
    assert embedding(5, (1, 2, 3), 1024) == vector
    assert embedding(6, (1, 2, 3), 1024) != vector
    assert embedding(5, (1, 2, 4), 8) != embedding(5, (1, 2, 3), 8)


def test_an_array_of_ids_answers_as_the_same_ids_in_a_tuple() -> None:
    # The server plans text prompts from gtm.tokens.encode_chat_ids (an array): the
    # answer, its length and the embedding must be those of the ids as a tuple.
    ids = encode_text("The quick brown fox jumps over the lazy dog. " * 40)
    as_array = array("I", ids)
    for choice in (0, 1):
        a, b = Completion(7, ids, choice), Completion(7, as_array, choice)
        assert a.natural_length == b.natural_length
        assert a.take(50) == b.take(50)
    assert embedding(7, ids, 16) == embedding(7, as_array, 16)
    # And the answer is the one the ids always got (computed before the array form).
    golden = Completion(7, as_array, 1)
    assert golden.natural_length == 378
    assert golden.take(12) == "Large many blue phase while each such what along just no and"
