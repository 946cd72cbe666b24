"""OpenAI's request parameters checked at the edge: their types and ranges, refused as
OpenAI refuses them.

OpenAI answers a bad parameter with a 400 naming it — ``param`` is the parameter's path
(``temperature``, ``messages[2].role``, ``stop[0]``), ``code`` says what is wrong
(``invalid_type``, ``decimal_above_max_value``, ``missing_required_parameter``, …) and
the message is OpenAI's wording — and the SDKs raise ``BadRequestError`` with that
``param``. :func:`check_params` answers the same for ``/v1/chat/completions``,
``/v1/completions`` and ``/v1/embeddings``, so a request no worker would serve is
refused by the first tier it reaches, before that tier spends a routing decision, a
quota charge or a worker's time on it. Every tier calls it once, through
:func:`gtm.openai_request.read_prompt`, because a client may connect to any tier.

What is checked: each parameter OpenAI documents for the endpoint, when present — its
JSON type (a boolean is not a number; an integer given as ``1.0`` is refused, as OpenAI
refuses it), its range, its allowed values, and the shape of the structured ones
(``messages``, ``stop``, ``logit_bias``, ``stream_options``, ``response_format``,
``tools``, ``tool_choice``) down to the members a worker needs. What is not:

* Unknown parameters pass through untouched. OpenAI refuses them on some endpoints,
  but the workers behind gtm are vLLM or SGLang, whose clients send their extra
  sampling parameters (``top_k``, ``min_p``, ``repetition_penalty``, ``guided_json``, …)
  through the same OpenAI API; the worker checks those.
* ``null`` is taken as absent, for every optional parameter (OpenAI's are nullable, and
  vLLM reads ``null`` as its default).
* What depends on the model (its context length, which parameters a reasoning model
  refuses) is the worker's to answer.

The check is one pass over the body's keys with a table of rules per endpoint; nested
arrays are walked only for the parameters that hold them. The prompt fields (``prompt``,
``input``, the text of ``messages``) are read — and refused when malformed — by
:func:`gtm.openai_request.read_prompt`, which must walk them anyway to count tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gtm.openai_errors import BadRequest

#: Longest model name accepted (matches :data:`gtm.models.ModelName`).
MAX_MODEL_NAME = 256
#: Most choices (``n``) per prompt (as the emulator and vLLM's defaults).
MAX_CHOICES = 16
#: OpenAI's limits: stop sequences, biased tokens, top log-probabilities (chat) and
#: log-probabilities (completions), ``best_of``.
MAX_STOP = 4
MAX_LOGIT_BIAS = 1024
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
MAX_BEST_OF = 20
#: ``seed`` is a signed 64-bit integer.
SEED_RANGE = (-(2**63), 2**63 - 1)

#: Message roles OpenAI accepts, in the order its error message lists them.
ROLES = ("system", "assistant", "user", "function", "tool", "developer")
#: ``response_format.type``: OpenAI's, and vLLM/SGLang's ``structural_tag``.
RESPONSE_FORMATS = ("json_object", "json_schema", "structural_tag", "text")
TOOL_TYPES = ("function", "custom")
TOOL_CHOICES = ("none", "auto", "required")
ENCODING_FORMATS = ("float", "base64")

#: Longer values are echoed as their first and last three characters, as OpenAI does:
#: an error message never carries a client's long text.
_ECHO_CHARS = 20

#: The endpoints every tier serves.
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"

Rule = Callable[[str, object], None]


def check_params(body: Mapping[str, object], path: str) -> None:
    """Refuse the first parameter of ``body`` (sent to ``path``) that OpenAI would refuse.

    Raises:
        BadRequest: in OpenAI's words, ``param`` naming the parameter's path.
    """
    rules = _RULES.get(path)
    if rules is None:
        return
    get = body.get
    for name in _REQUIRED[path]:
        if get(name) is None:
            raise missing(name)
    for name, value in body.items():
        rule = rules.get(name)
        if rule is not None and value is not None:
            rule(name, value)
    # The pairs, after every parameter's own check (inline: a call each would cost more).
    if path == EMBEDDINGS:
        return
    if get("stream_options") is not None and get("stream") is not True:
        raise _only_with("stream_options", "stream")
    if path == CHAT and get("top_logprobs") is not None and get("logprobs") is not True:
        raise _only_with("top_logprobs", "logprobs")


# ---------------------------------------------------------------------------- errors


def kind(value: object) -> str:
    """A JSON value's type as OpenAI's messages name it ("a string", "an integer", …)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def echo(value: object) -> str:
    """``value`` for an error message: a long one cut to its ends."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > _ECHO_CHARS:
        return f"{text[:3]}...{text[-3:]}"
    return text


def invalid_type(param: str, expected: str, value: object) -> BadRequest:
    return BadRequest(
        f"Invalid type for '{param}': expected {expected}, but got {kind(value)} instead.",
        param=param,
        code="invalid_type",
    )


def out_of_range(param: str, what: str, value: float, low: float, high: float) -> BadRequest:
    """``value`` is outside ``[low, high]`` (NaN included); ``what`` is "integer" or
    "decimal"."""
    if value < low:
        side, bound, code = "below minimum", f">= {low}", f"{what}_below_min_value"
    else:
        side, bound, code = "above maximum", f"<= {high}", f"{what}_above_max_value"
    return BadRequest(
        f"Invalid '{param}': {what} {side} value. Expected a value {bound}, "
        f"but got {echo(value)} instead.",
        param=param,
        code=code,
    )


def invalid_value(param: str, value: object, allowed: tuple[str, ...]) -> BadRequest:
    names = [f"'{a}'" for a in allowed]
    listed = f"{', '.join(names[:-1])}, and {names[-1]}" if len(names) > 2 else " and ".join(names)
    return BadRequest(
        f"Invalid value: '{echo(value)}'. Supported values are: {listed}.",
        param=param,
        code="invalid_value",
    )


def missing(param: str) -> BadRequest:
    return BadRequest(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _array_too_long(param: str, limit: int, length: int) -> BadRequest:
    return BadRequest(
        f"Invalid '{param}': array too long. Expected an array with maximum length {limit}, "
        f"but got an array with length {length} instead.",
        param=param,
        code="array_above_max_length",
    )


def empty_array(param: str) -> BadRequest:
    return BadRequest(
        f"Invalid '{param}': empty array. Expected an array with minimum length 1, "
        "but got an empty array instead.",
        param=param,
        code="empty_array",
    )


# ---------------------------------------------------------------------------- rules


def _number(low: float, high: float) -> Rule:
    def rule(name: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise invalid_type(name, "a decimal", value)
        if not low <= value <= high:
            raise out_of_range(name, "decimal", value, low, high)

    return rule


def _integer(low: int, high: int | None = None) -> Rule:
    def rule(name: str, value: object) -> None:
        # An exact int (the usual value) without the two isinstance calls.
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
            raise invalid_type(name, "an integer", value)
        if value < low or (high is not None and value > high):
            raise out_of_range(name, "integer", value, low, high if high is not None else value)

    return rule


def _boolean(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise invalid_type(name, "a boolean", value)


def _string(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise invalid_type(name, "a string", value)


def _object(name: str, value: object) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise invalid_type(name, "an object", value)
    return value


def _enum(allowed: tuple[str, ...]) -> Rule:
    def rule(name: str, value: object) -> None:
        if not isinstance(value, str):
            raise invalid_type(name, "a string", value)
        if value not in allowed:
            raise invalid_value(name, value, allowed)

    return rule


def _model(name: str, value: object) -> None:
    if type(value) is not str and not isinstance(value, str):
        raise invalid_type(name, "a string", value)
    if not value:
        raise BadRequest(
            f"Invalid '{name}': empty string. Expected a string with minimum length 1, "
            "but got an empty string instead.",
            param=name,
            code="empty_string",
        )
    if len(value) > MAX_MODEL_NAME:
        raise BadRequest(
            f"Invalid '{name}': string too long. Expected a string with maximum length "
            f"{MAX_MODEL_NAME}, but got a string with length {len(value)} instead.",
            param=name,
            code="string_above_max_length",
        )


def _messages(name: str, value: object) -> None:
    """The array and each message's shape (an object, a known role, a string or
    content-part array); the text itself is read by :mod:`gtm.tokens`."""
    if type(value) is not list and not isinstance(value, list):
        raise invalid_type(name, "an array of objects", value)
    if not value:
        raise empty_array(name)
    for index, message in enumerate(value):
        if type(message) is not dict and not isinstance(message, dict):
            raise invalid_type(f"{name}[{index}]", "an object", message)
        role = message.get("role")
        if role not in ROLES:  # a tuple: an unhashable role compares unequal, not a TypeError
            where = f"{name}[{index}].role"
            if role is None:
                raise missing(where)
            if not isinstance(role, str):
                raise invalid_type(where, "a string", role)
            raise invalid_value(where, role, ROLES)
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        where = f"{name}[{index}].content"
        if not isinstance(content, list):
            raise invalid_type(where, "one of a string or array of objects", content)
        for part_index, part in enumerate(content):
            if not isinstance(part, dict):
                raise invalid_type(f"{where}[{part_index}]", "an object", part)
            if part.get("type") is None:
                raise missing(f"{where}[{part_index}].type")


def _stop(name: str, value: object) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise invalid_type(name, "one of a string or array of strings", value)
    if len(value) > MAX_STOP:
        raise _array_too_long(name, MAX_STOP, len(value))
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise invalid_type(f"{name}[{index}]", "a string", item)


def _logit_bias(name: str, value: object) -> None:
    bias = _object(name, value)
    if len(bias) > MAX_LOGIT_BIAS:
        raise BadRequest(
            f"Invalid '{name}': too many properties. Expected an object with at most "
            f"{MAX_LOGIT_BIAS} properties, but got an object with {len(bias)} properties "
            "instead.",
            param=name,
            code="object_above_max_properties",
        )
    for token, weight in bias.items():
        if not (token.isascii() and token.isdigit()):
            raise BadRequest(
                f"Invalid key in '{name}': '{echo(token)}'. You should only be submitting "
                "non-negative integers.",
                param=name,
                code="invalid_value",
            )
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not -100 <= weight <= 100
        ):
            _BIAS(f"{name}.{token}", weight)  # raises, naming the token (its path built only then)


def _stream_options(name: str, value: object) -> None:
    options = _object(name, value)
    usage = options.get("include_usage")
    if usage is not None:
        _boolean(f"{name}.include_usage", usage)


def _member(owner: Mapping[str, object], path: str, member: str, rule: Rule) -> object:
    """``owner``'s required ``member``, checked by ``rule`` (as ``path.member``)."""
    value = owner.get(member)
    where = f"{path}.{member}"
    if value is None:
        raise missing(where)
    rule(where, value)
    return value


def _named(name: str, value: object) -> None:
    """An object with a string ``name`` (a function, a JSON schema)."""
    _member(_object(name, value), name, "name", _string)


def _response_format(name: str, value: object) -> None:
    form = _object(name, value)
    if _member(form, name, "type", _RESPONSE_FORMAT_TYPE) == "json_schema":
        _member(form, name, "json_schema", _named)


def _tools(name: str, value: object) -> None:
    if not isinstance(value, list):
        raise invalid_type(name, "an array of objects", value)
    for index, item in enumerate(value):
        where = f"{name}[{index}]"
        tool = _object(where, item)
        if _member(tool, where, "type", _TOOL_TYPE) == "function":
            _member(tool, where, "function", _named)


def _tool_choice(name: str, value: object) -> None:
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise invalid_value(name, value, TOOL_CHOICES)
        return
    if not isinstance(value, dict):
        raise invalid_type(name, "one of 'none', 'auto', 'required', or an object", value)
    if _member(value, name, "type", _string) == "function":
        _member(value, name, "function", _named)


def _only_with(param: str, switch: str) -> BadRequest:
    """``param`` was given without ``switch`` enabled (``stream_options`` without
    ``stream``, ``top_logprobs`` without ``logprobs``)."""
    return BadRequest(
        f"The '{param}' parameter is only allowed when '{switch}' is enabled.",
        param=param,
        code="invalid_value",
    )


_BIAS = _number(-100, 100)
_RESPONSE_FORMAT_TYPE = _enum(RESPONSE_FORMATS)
_TOOL_TYPE = _enum(TOOL_TYPES)
_PENALTY = _number(-2, 2)
_POSITIVE = _integer(1)

#: Parameters both text endpoints take, as OpenAI documents them.
_SAMPLING: dict[str, Rule] = {
    "model": _model,
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "n": _integer(1, MAX_CHOICES),
    "max_tokens": _POSITIVE,
    "stream": _boolean,
    "stream_options": _stream_options,
    "stop": _stop,
    "presence_penalty": _PENALTY,
    "frequency_penalty": _PENALTY,
    "logit_bias": _logit_bias,
    "seed": _integer(*SEED_RANGE),
    "user": _string,
}

_RULES: dict[str, dict[str, Rule]] = {
    CHAT: {
        **_SAMPLING,
        "messages": _messages,
        "max_completion_tokens": _POSITIVE,
        "logprobs": _boolean,
        "top_logprobs": _integer(0, MAX_TOP_LOGPROBS),
        "response_format": _response_format,
        "tools": _tools,
        "tool_choice": _tool_choice,
        "parallel_tool_calls": _boolean,
        "store": _boolean,
    },
    COMPLETIONS: {
        **_SAMPLING,
        "logprobs": _integer(0, MAX_COMPLETION_LOGPROBS),
        "echo": _boolean,
        "best_of": _integer(0, MAX_BEST_OF),
        "suffix": _string,
    },
    EMBEDDINGS: {
        "model": _model,
        "encoding_format": _enum(ENCODING_FORMATS),
        "dimensions": _POSITIVE,
        "user": _string,
    },
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    CHAT: ("model", "messages"),
    COMPLETIONS: ("model", "prompt"),
    EMBEDDINGS: ("model", "input"),
}
