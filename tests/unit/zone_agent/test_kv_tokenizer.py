"""``gtm zone --kv-events-tokenizer``: prompts tokenized with a model's own tokenizer and
chat template, as vLLM does (a small tokenizer built here: no model is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from gtm.errors import ConfigError
from zone_agent.kv_tokenizer import HfPromptTokenizer
from zone_agent.request import Endpoint

VOCAB = {
    "[UNK]": 0,
    "<s>": 1,
    "</s>": 2,
    "<|user|>": 3,
    "<|assistant|>": 4,
    "<|end|>": 5,
    "hello": 6,
    "there": 7,
    "how": 8,
    "are": 9,
    "you": 10,
}
#: A Llama-3-like template: BOS, then each message between role and end markers.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.add_special_tokens(["<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"])
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # The BOS the post-processor adds when special tokens are asked for (Llama's way).
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = {"chat_template": TEMPLATE, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def _body(**fields: object) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


def test_a_completion_gets_the_bos_the_tokenizer_adds(model_dir: Path) -> None:
    tokenize = HfPromptTokenizer(model_dir / "tokenizer.json")
    assert tokenize(_body(prompt="hello there"), Endpoint.COMPLETION) == (1, 6, 7)
    assert tokenize(_body(prompt=["how are", "you"]), Endpoint.COMPLETION) == (1, 8, 9)
    assert tokenize(_body(prompt=[5, 6]), Endpoint.COMPLETION) == (5, 6)


def test_a_chat_is_rendered_by_its_template_without_a_second_bos(model_dir: Path) -> None:
    tokenize = HfPromptTokenizer(model_dir)
    messages = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": [{"type": "text", "text": "how are you"}]},
    ]
    # <s> <|user|> hello there <|end|> <|assistant|> how are you <|end|> <|assistant|>
    expected = (1, 3, 6, 7, 5, 4, 8, 9, 10, 5, 4)
    assert tokenize(_body(messages=messages), Endpoint.CHAT) == expected


def test_what_it_cannot_render_maps_nothing(model_dir: Path) -> None:
    (model_dir / "tokenizer_config.json").write_text("{}")
    tokenize = HfPromptTokenizer(model_dir)
    chat = _body(messages=[{"role": "user", "content": "hello"}])
    assert tokenize(chat, Endpoint.CHAT) == ()  # no chat template
    assert tokenize(b"{", Endpoint.COMPLETION) == ()
    assert tokenize(_body(prompt=3), Endpoint.COMPLETION) == ()


def test_a_bad_tokenizer_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="--kv-events-tokenizer"):
        HfPromptTokenizer(tmp_path)
