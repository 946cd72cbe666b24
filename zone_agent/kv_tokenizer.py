"""A model's own tokenizer for ``gtm zone --kv-events-tokenizer``: prompts tokenized as a
real vLLM tokenizes them, so its KV events' ``token_ids`` match (:mod:`zone_agent.kv_events`).

vLLM tokenizes with the model's Hugging Face tokenizer (``tokenizer.json``, the
``tokenizers`` library that transformers' fast tokenizers are) and renders chat
messages with the model's chat template (``tokenizer_config.json``'s ``chat_template``):

* a completion's text prompt: ``encode(prompt, add_special_tokens=True)`` (vLLM's
  ``CompletionRequest.add_special_tokens`` defaults to true: the BOS the tokenizer's
  post-processor adds); token-id prompts as they are;
* a chat: the template rendered with ``messages`` (each content part list joined as
  text), ``add_generation_prompt=True`` and the special tokens (``bos_token``, ...), then
  ``encode(text, add_special_tokens=False)`` (``ChatCompletionRequest.add_special_tokens``
  defaults to false: the template writes its own BOS).

The template runs in Jinja2's sandbox with the options transformers compiles chat
templates with (``trim_blocks``, ``lstrip_blocks``, loop controls, ``raise_exception``,
``strftime_now``, ``tojson``; transformers ``utils/chat_template_utils.py``). Needs the
``kv-events-tokenizer`` extra (``tokenizers``, ``jinja2``); no model weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from gtm.errors import ConfigError
from zone_agent.request import Endpoint, first_prompt

__all__ = ["HfPromptTokenizer"]


def _raise(message: str) -> None:
    raise ValueError(message)


def _token_text(value: object) -> str | None:
    """A special token of tokenizer_config.json: a string, or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _content(value: object) -> str:
    """A message's content as vLLM hands it to the template: text parts joined by a
    newline (vLLM's default "string" content format)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in value
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


class HfPromptTokenizer:
    """``(raw body, endpoint) -> token ids`` with a model's tokenizer and chat template."""

    def __init__(self, path: Path) -> None:
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        file = path / "tokenizer.json" if path.is_dir() else path
        try:
            self._tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises its own Exception subclass
            raise ConfigError(f"--kv-events-tokenizer {file}: {exc}") from None
        config: dict[str, Any] = {}
        config_file = file.parent / "tokenizer_config.json"
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"--kv-events-tokenizer {config_file}: {exc}") from None
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        self._specials = {
            name: text
            for name in ("bos_token", "eos_token", "unk_token", "pad_token")
            if (text := _token_text(config.get(name))) is not None
        }
        self._template: Callable[..., str] | None = None
        if isinstance(template, str):
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
            )
            env.filters["tojson"] = lambda value, indent=None: json.dumps(
                value, ensure_ascii=False, indent=indent
            )
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            try:
                self._template = env.from_string(template).render
            except TemplateError as exc:
                raise ConfigError(f"--kv-events-tokenizer {config_file}: {exc}") from None

    def chat_text(self, messages: list[dict[str, str]]) -> str | None:
        """The chat template's rendering of ``messages`` for a reply; None without a
        template."""
        if self._template is None:
            return None
        return self._template(
            messages=messages, add_generation_prompt=True, tools=None, **self._specials
        )

    def __call__(self, raw: bytes, endpoint: Endpoint) -> tuple[int, ...]:
        """The first prompt's token ids as vLLM would make them; () when it cannot tell
        (no chat template, a body it cannot read, a template that raises)."""
        try:
            body = json.loads(raw)
            if endpoint is Endpoint.CHAT:
                messages = [
                    {"role": str(m.get("role")), "content": _content(m.get("content"))}
                    for m in body["messages"]
                ]
                text = self.chat_text(messages)
                if text is None:
                    return ()
                return tuple(self._tokenizer.encode(text, add_special_tokens=False).ids)
            prompt = body.get("prompt")
        except Exception:  # a body or template the agent cannot render: no mapping
            return ()
        first = first_prompt(prompt)
        if isinstance(first, str):
            return tuple(self._tokenizer.encode(first, add_special_tokens=True).ids)
        return first or ()
