"""One request to the server, parsed and validated once: OpenAI's fields plus specdecode's own
under the `specdecode` extension object.

    {"model": ..., "messages": [...] | "prompt": "...", "max_tokens": 64, "temperature": 0,
     "top_p": 1, "stop": ["\\n\\n"], "seed": 1, "stream": true, "n": 1,
     "response_format": {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}},
     "specdecode": {"draft": "auto", "gamma": 4 | "auto", "top_k": 0, "lenience": 1.0,
                    "grammar": "<a Lark grammar>" | "regex": "<a pattern>", "trace": true},
     "speculative": {"n_max": 16, "n_min": 0, "p_min": 0.75}}

`speculative` is llama-server's per-request speculation (also taken as its flat keys
`speculative.n_max`, ...): n_max caps the draft length (0: no speculation for the request), n_min
drops deterministic drafts shorter than it (a sampled one is verified whatever its length: dropping
it by its drawn length would bias q), p_min is the confidence below which a draft model stops.
Completions take OpenAI's `best_of`: that many choices sampled (at least n), the n with the highest
mean token log-probability returned.

`trace` (opt-in; the reply is OpenAI's without it): each target call's tokens, as Figure 1 of
Leviathan et al. shows them, under a `specdecode` field of each streamed chunk (of the body without
a stream); `trace.py` describes it.

OpenAI fields the server cannot honour (audio, store, ...) are
accepted at their neutral value, which is what many clients send, and refused by name otherwise.

Every problem becomes a `RequestError` carrying the HTTP status and OpenAI's error fields
(message, type, param, code), never an exception the server does not expect.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import defaults
from ..batch import Settings
from ..checks import MAX_TOP_LOGPROBS, check_lenience
from ..grammar import Grammar, GrammarError
from ..sampling import MAX_REPEAT_LAST_N, SamplingParams

EXTENSION = "specdecode"
ROLES = ("system", "developer", "user", "assistant", "tool")  # developer: OpenAI's newer name for system


def _zero(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


# OpenAI fields this server honours only at their neutral value (null always passes): clients send
# them set to that value, which changes nothing; any other value is refused by name.
NEUTRAL = {
    "functions": (lambda v: v == [], "[] (send 'tools')"),
    "function_call": (lambda v: v in ("none", "auto"), '"none" or "auto" (no functions)'),
    "store": (lambda v: v is False, "false"),
    "modalities": (lambda v: v == ["text"], '["text"]'),
    "suffix": (lambda v: v == "", '""'),
    "audio": (lambda v: False, "null"),
    "prediction": (lambda v: False, "null"),
    "reasoning_effort": (lambda v: False, "null"),
}
# ... for one kind of request only: chat has no best_of (completions honour it)
NEUTRAL_BY_KIND = {"chat": {"best_of": (lambda v: v == 1 and not isinstance(v, bool), "1")}, "completion": {}}
# llama-server's per-request speculation (`_speculative`), as an object or its flat dotted keys
SPECULATIVE = ("n_max", "n_min", "p_min")
# Fields that change nothing here, checked for their type only.
HARMLESS = {"user": (str, "a string"), "metadata": (dict, "an object"), "parallel_tool_calls": (bool, "a boolean"),
            "service_tier": (str, "a string"), "prompt_cache_key": (str, "a string"),
            "safety_identifier": (str, "a string")}
# the sampling controls that reshape the target's distribution at each position (`SamplingParams`)
CONTROLS = {"presence_penalty", "frequency_penalty", "repetition_penalty", "repeat_penalty", "repeat_last_n", "min_p",
            "logit_bias"}
COMMON = ({"model", "max_tokens", "temperature", "top_p", "stop", "seed", "stream", "stream_options", "n",
           "logprobs", "response_format", EXTENSION, "speculative"} | {f"speculative.{n}" for n in SPECULATIVE}
          | set(NEUTRAL) | set(HARMLESS) | CONTROLS)
FIELDS = {"chat": COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "best_of"},
          "completion": COMMON | {"prompt", "echo", "best_of"}}
EXTENSION_FIELDS = {"draft", "gamma", "top_k", "lenience", "grammar", "regex", "trace"}


class RequestError(Exception):
    """An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    max_tokens: int | None = None  # largest max_tokens a request may ask for (None: the context window's room)
    default_max_tokens: int = 256  # when a request omits it (the server caps it at the room the prompt leaves)
    max_gamma: int = 16
    max_prompts: int = 16  # prompts one completions request may hold (the server's batch)


@dataclass(frozen=True)
class Request:
    """A generation request as parsed: what it asks for, and `settings`, the one object its decoding
    fields travel in to the batch (`batch.Settings`: max_tokens is its max_new_tokens, speculative's
    n_max and n_min its max_draft and min_draft, gamma None the server's --gamma)."""

    kind: str  # "chat" or "completion"
    model: str
    messages: tuple[dict, ...] | None  # chat
    prompt: str | tuple[int, ...] | None  # completion: text, or token ids as OpenAI's API allows (the first)
    settings: Settings
    max_tokens_param: str | None = None  # the field that set max_tokens; None: the server's default
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    draft: str | None = None  # None: the server's default drafter
    echo: bool = False  # completions: the prompt before the completion (with its log-probabilities)
    prompts: tuple = ()  # completions: every prompt of the request (a choice each); `prompt` is the first
    n: int = 1  # choices to sample for the prompt, each with its own seed (the request's plus its index)
    tools: Any = None  # chat: the functions the model may call (`tools.Tools`), None without
    trace: bool = False  # the extension's `trace`: each target call's tokens in the reply (`trace.py`)
    p_min: float | None = None  # speculative.p_min: a draft model stops below this top probability
    best_of: int = 1  # completions: choices sampled, of which the n best (mean token log-probability) return


MAX_DEPTH = 64  # how deep a body's arrays and objects may nest (Python's parser recurses, ~1,000 at most)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SURROGATE = re.compile(rb"\\[uU][dD][89a-fA-F]|\xed[\xa0-\xbf]")  # an escaped or CESU-8 surrogate half


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def decode_body(raw: bytes) -> Any:
    """A request body as JSON, or a 400 naming what is wrong: not JSON, nested deeper than MAX_DEPTH,
    or text holding a lone surrogate (an unpaired \\ud800-\\udfff escape, which no UTF-8 text holds and
    no tokenizer takes)."""
    skeleton = np.frombuffer(_STRING.sub(b"", raw), dtype=np.uint8)  # strings gone: brackets are structure
    steps = (np.isin(skeleton, (ord("["), ord("{"))).astype(np.int32)
             - np.isin(skeleton, (ord("]"), ord("}"))).astype(np.int32))
    depth = int(np.cumsum(steps).max()) if steps.size else 0
    if depth > MAX_DEPTH:
        raise _bad(f"the body nests arrays and objects {depth} levels deep; at most {MAX_DEPTH} are accepted",
                   None, "invalid_json")
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise _bad(f"the body is not valid JSON: {err}", None, "invalid_json") from None
    if _SURROGATE.search(raw):
        where = _lone_surrogate(body, "")
        if where is not None:
            raise _bad(f"'{where or 'the body'}' holds a lone surrogate (an unpaired \\ud800-\\udfff escape): "
                       "text must be valid Unicode", where or None, "invalid_value")
    return body


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string (or key) in `value` that is not valid Unicode; None where none is."""
    def bad(text: str) -> bool:
        try:
            text.encode("utf-8")
            return False
        except UnicodeEncodeError:
            return True

    if isinstance(value, str):
        return path if bad(value) else None
    items = (value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ())
    for key, item in items:
        where = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
        if isinstance(key, str) and bad(key):
            return path or "the body"
        found = _lone_surrogate(item, where)
        if found is not None:
            return found
    return None


def _bad(message: str, param: str | None, code: str | None = None) -> RequestError:
    return RequestError(400, message, param, code)


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"'{name}' must be a number, got {type(value).__name__}", name, "invalid_type")
    if not (low < value <= high if low_open else low <= value <= high) or value != value:
        interval = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise _bad(f"'{name}' must be in {interval}, got {value}", name, "invalid_value")
    return float(value)


def whole(value: Any) -> Any:
    """A JSON number with no fractional part as an int (JSON Schema's integers include 1.0, and some
    clients send them so); anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _integer(value: Any, name: str, low: int | None, high: int | None) -> int:
    value = whole(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer, got {type(value).__name__}", name, "invalid_type")
    if (low is not None and value < low) or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _bad(f"'{name}' must be {bound}, got {value}", name, "invalid_value")
    return value


def _text(content: Any, param: str) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise _bad(f"'{param}' must be a string or a list of text parts", param, "invalid_type")


def _messages(body: dict) -> tuple[dict, ...]:
    messages = body.get("messages")
    if messages is None:
        raise _bad("'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise _bad("'messages' must be a list of {role, content} objects", "messages", "invalid_type")
    if not messages:
        raise _bad("'messages' is empty: at least one message is needed", "messages", "invalid_value")
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(f"'{param}' must be an object with 'role' and 'content'", param, "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise _bad(f"'{param}.role' must be one of {', '.join(ROLES)}, got {role!r}", f"{param}.role",
                       "invalid_value")
        unknown = set(message) - {"role", "content", "name", "tool_calls", "tool_call_id"}
        if unknown:
            raise _bad(f"'{param}' has unsupported fields: {', '.join(sorted(unknown))}", param, "unsupported")
        if "name" in message and not isinstance(message["name"], str):
            raise _bad(f"'{param}.name' must be a string", f"{param}.name", "invalid_type")
        entry = {"role": "system" if role == "developer" else role}
        calls = message.get("tool_calls")
        if calls is not None and role != "assistant":
            raise _bad(f"'{param}.tool_calls' belong to assistant messages", f"{param}.tool_calls", "invalid_value")
        if calls:
            entry["tool_calls"] = _tool_calls(calls, f"{param}.tool_calls")
            entry["content"] = "" if message.get("content") is None else _text(message["content"], f"{param}.content")
        else:
            entry["content"] = _text(message.get("content"), f"{param}.content")
        if role == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise _bad(f"'{param}.tool_call_id' must name the call this result answers", f"{param}.tool_call_id",
                           "invalid_value")
            entry["tool_call_id"] = message["tool_call_id"]
        out.append(entry)
    return tuple(out)


def _tool_calls(calls, param: str) -> list[dict]:
    """An assistant message's calls: [{id, type: function, function: {name, arguments (a JSON string)}}]."""
    if not isinstance(calls, list):
        raise _bad(f"'{param}' must be a list of calls", param, "invalid_type")
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(function, dict) or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments"), str) or not isinstance(call.get("id"), str)):
            raise _bad(f"'{param}[{i}]' must be {{id, type: function, function: {{name, arguments: a JSON string}}}}",
                       f"{param}[{i}]", "invalid_value")
        try:
            json.loads(function["arguments"])
        except json.JSONDecodeError:
            raise _bad(f"'{param}[{i}].function.arguments' is not JSON", f"{param}[{i}].function.arguments",
                       "invalid_value") from None
        out.append({"id": call["id"], "type": "function",
                    "function": {"name": function["name"], "arguments": function["arguments"]}})
    return out


def _one_prompt(prompt: Any, param: str) -> str | tuple[int, ...]:
    """A string, or a list of token ids."""
    if isinstance(prompt, list):
        if not prompt:
            raise _bad(f"'{param}' is an empty list of token ids", param, "invalid_value")
        prompt = [whole(t) for t in prompt]
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise _bad(f"'{param}' must be a string or a list of token ids (integers >= 0)", param, "invalid_type")
        return tuple(prompt)
    if not isinstance(prompt, str):
        raise _bad(f"'{param}' must be a string or a list of token ids", param, "invalid_type")
    if not prompt:
        raise _bad(f"'{param}' is empty", param, "invalid_value")
    return prompt


def _prompts(body: dict, most: int) -> tuple[str | tuple[int, ...], ...]:
    """The prompts of a completions request, as OpenAI's API takes them: a string, a list of token
    ids, or a list of either (each a choice; at most `most`)."""
    prompt = body.get("prompt")
    if prompt is None:
        raise _bad("'prompt' is required", "prompt", "missing_required_parameter")
    several = isinstance(prompt, list) and bool(prompt) and all(isinstance(p, (str, list)) for p in prompt)
    if not several:
        return (_one_prompt(prompt, "prompt"),)
    if len(prompt) > most:
        raise _bad(f"'prompt' holds {len(prompt)} prompts; this server takes at most {most} in one request",
                   "prompt", "invalid_value")
    return tuple(_one_prompt(p, f"prompt[{i}]") for i, p in enumerate(prompt))


def _logprobs(body: dict, kind: str) -> int | None:
    """The alternatives each token's log-probability lists, or None for no log-probabilities: chat's
    `logprobs: true` with `top_logprobs` 0..20; completions' `logprobs: k`, k in 0..20."""
    value = body.get("logprobs")
    if kind == "completion":
        return None if value is None else _integer(value, "logprobs", 0, MAX_TOP_LOGPROBS)
    if value is not None and not isinstance(value, bool):
        raise _bad("'logprobs' must be a boolean", "logprobs", "invalid_type")
    top = body.get("top_logprobs")
    if top is not None:
        top = _integer(top, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if top and not value:
            raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value")
    return (top or 0) if value else None


def _controls(body: dict) -> dict:
    """The controls that reshape each position's distribution, as OpenAI (presence_penalty,
    frequency_penalty, logit_bias), vLLM and llama-server (repetition_penalty, llama.cpp's
    repeat_penalty and repeat_last_n, min_p) name them -> SamplingParams' fields. The repetition
    penalty reads what its name's server reads unless repeat_last_n says: llama.cpp's repeat_penalty
    the last 64 tokens of prompt and output, vLLM's repetition_penalty all of them."""
    if "repetition_penalty" in body and "repeat_penalty" in body:
        raise _bad("send 'repetition_penalty' (vLLM's) or 'repeat_penalty' (llama.cpp's), not both", "repeat_penalty",
                   "invalid_value")
    repetition = "repeat_penalty" if body.get("repeat_penalty") is not None else "repetition_penalty"
    window = body.get("repeat_last_n")
    if window is None:  # what the name's own server reads
        window = defaults.REPEAT_LAST_N if repetition == "repeat_penalty" else -1
    else:
        window = _integer(window, "repeat_last_n", -1, MAX_REPEAT_LAST_N)
    bias = body.get("logit_bias")
    if bias is None:
        bias = {}
    if not isinstance(bias, dict):
        raise _bad("'logit_bias' must be an object mapping token ids to biases", "logit_bias", "invalid_type")
    pairs = {}
    for token, value in bias.items():
        if not re.fullmatch(r"0|[1-9][0-9]*", token):
            raise _bad(f"'logit_bias' keys are token ids, got {token!r}", "logit_bias", "invalid_value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise _bad(f"'logit_bias' values are biases in [-100, 100], got {value!r} for token {token}", "logit_bias",
                       "invalid_value")
        pairs[int(token)] = float(value)
    return dict(presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
                frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
                repetition_penalty=_number(body, repetition, 1.0, 0.0, 10.0, low_open=True), repeat_last_n=window,
                min_p=_number(body, "min_p", 0.0, 0.0, 1.0), logit_bias=pairs)


def _echo(body: dict, stream: bool) -> bool:
    echo = body.get("echo")
    if echo is None:
        return False
    if not isinstance(echo, bool):
        raise _bad("'echo' must be a boolean", "echo", "invalid_type")
    if echo and stream:
        raise _bad("'echo' is served without 'stream' only", "echo", "unsupported_value")
    return echo


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise _bad("'stop' must be a non-empty string or a list of at most 4 non-empty strings", "stop",
                   "invalid_value")
    return tuple(stop)


def _extension(body: dict, limits: Limits) -> dict:
    ext = body.get(EXTENSION, {})
    if ext is None:
        return {}
    if not isinstance(ext, dict):
        raise _bad(f"'{EXTENSION}' must be an object", EXTENSION, "invalid_type")
    unknown = set(ext) - EXTENSION_FIELDS
    if unknown:
        raise _bad(f"unknown field(s) in '{EXTENSION}': {', '.join(sorted(unknown))}; known: "
                   f"{', '.join(sorted(EXTENSION_FIELDS))}", f"{EXTENSION}.{sorted(unknown)[0]}", "unknown_parameter")
    out = {}
    if ext.get("draft") is not None:
        if not isinstance(ext["draft"], str) or not ext["draft"]:
            raise _bad(f"'{EXTENSION}.draft' must be a drafter name", f"{EXTENSION}.draft", "invalid_type")
        out["draft"] = ext["draft"]
    if ext.get("gamma") is not None:
        gamma = whole(ext["gamma"])
        if gamma != "auto" and (isinstance(gamma, bool) or not isinstance(gamma, int)
                                or not 0 <= gamma <= limits.max_gamma):
            raise _bad(f"'{EXTENSION}.gamma' must be an integer in [0, {limits.max_gamma}] or \"auto\", got {gamma!r}",
                       f"{EXTENSION}.gamma", "invalid_value")
        out["gamma"] = gamma
    if ext.get("top_k") is not None:
        out["top_k"] = _integer(ext["top_k"], f"{EXTENSION}.top_k", 0, None)
    if ext.get("lenience") is not None:
        try:
            out["lenience"] = check_lenience(ext["lenience"], f"'{EXTENSION}.lenience'")
        except ValueError as err:
            raise _bad(str(err), f"{EXTENSION}.lenience", "invalid_value") from None
    if ext.get("trace") is not None:
        if not isinstance(ext["trace"], bool):
            raise _bad(f"'{EXTENSION}.trace' must be a boolean", f"{EXTENSION}.trace", "invalid_type")
        out["trace"] = ext["trace"]
    for name, build in (("grammar", Grammar.lark), ("regex", Grammar.regex)):
        if ext.get(name) is not None:
            if not isinstance(ext[name], str) or not ext[name]:
                raise _bad(f"'{EXTENSION}.{name}' must be a non-empty string", f"{EXTENSION}.{name}", "invalid_type")
            if "grammar" in out:
                raise _bad(f"'{EXTENSION}' takes 'grammar' or 'regex', not both", f"{EXTENSION}.{name}",
                           "invalid_value")
            out["grammar"] = _grammar(build, ext[name], f"{EXTENSION}.{name}")
    return out


def _speculative(body: dict, limits: Limits) -> dict:
    """llama-server's per-request speculation: `speculative` {n_max, n_min, p_min} or the flat keys
    `speculative.n_max`, ... (a flat key wins). n_max above the server's --max-gamma is capped there,
    and n_min at n_max, as llama-server caps them."""
    nested = body.get("speculative")
    if nested is not None and not isinstance(nested, dict):
        raise _bad("'speculative' must be an object with n_max, n_min and p_min", "speculative", "invalid_type")
    fields = {k: v for k, v in (nested or {}).items() if v is not None}
    unknown = set(fields) - set(SPECULATIVE)
    if unknown:
        raise _bad(f"unknown field(s) in 'speculative': {', '.join(sorted(unknown))}; known: "
                   f"{', '.join(SPECULATIVE)}", f"speculative.{sorted(unknown)[0]}", "unknown_parameter")
    fields |= {n: body[f"speculative.{n}"] for n in SPECULATIVE if body.get(f"speculative.{n}") is not None}
    out = {}
    if "n_max" in fields:
        out["n_max"] = min(_integer(fields["n_max"], "speculative.n_max", 0, None), limits.max_gamma)
    if "n_min" in fields:  # at most n_max, as llama-server clamps it
        out["n_min"] = min(_integer(fields["n_min"], "speculative.n_min", 0, None), out.get("n_max", limits.max_gamma))
    if "p_min" in fields:
        p_min = fields["p_min"]
        if isinstance(p_min, bool) or not isinstance(p_min, (int, float)) or not 0 <= p_min < 1:
            raise _bad(f"'speculative.p_min' must be a number in [0, 1), got {p_min!r}", "speculative.p_min",
                       "invalid_value")
        out["p_min"] = float(p_min)
    return out


def _grammar(build, source, param: str) -> Grammar:
    try:
        return build(source)
    except (GrammarError, ValueError, TypeError) as err:
        raise _bad(f"'{param}' is not usable: {err}", param, "invalid_value") from None


def _response_format(body: dict) -> Grammar | None:
    """OpenAI's response_format: text (nothing to follow), json_object (any JSON object), or
    json_schema {"name", "schema", "strict", "description"} (its schema)."""
    value = body.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise _bad("'response_format' must be an object whose 'type' is \"text\", \"json_object\" or \"json_schema\"",
                   "response_format", "invalid_value")
    kind = value["type"]
    allowed = {"type", "json_schema"} if kind == "json_schema" else {"type"}
    if set(value) - allowed:
        raise _bad(f"unknown field(s) in 'response_format': {', '.join(sorted(set(value) - allowed))}",
                   "response_format", "unknown_parameter")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    spec = value.get("json_schema")
    param = "response_format.json_schema"
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise _bad(f"'{param}' must be an object with a 'name' (and a 'schema')", param, "invalid_value")
    if set(spec) - {"name", "schema", "strict", "description"}:
        raise _bad(f"unknown field(s) in '{param}': {', '.join(sorted(set(spec) - {'name', 'schema', 'strict', 'description'}))}",
                   param, "unknown_parameter")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise _bad(f"'{param}.strict' must be a boolean", f"{param}.strict", "invalid_type")
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, dict):
        raise _bad(f"'{param}.schema' must be a JSON Schema object", f"{param}.schema", "invalid_type")
    return _grammar(Grammar.json_schema, schema, f"{param}.schema")


def _only(body: Any, fields: set[str], list_them: bool = True) -> dict:
    """The body, where it is a JSON object holding only `fields` (named in the refusal where
    `list_them`: a few, as /tokenize's; a completion's are too many to list)."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_type")
    unknown = sorted(set(body) - fields)
    if unknown:
        known = f"; known: {', '.join(sorted(fields))}" if list_them else ""
        raise _bad(f"unknown field(s): {', '.join(unknown)}{known}", unknown[0], "unknown_parameter")
    return body


def parse_request(body: Any, kind: str, limits: Limits = Limits()) -> Request:
    """A decoded JSON body -> a validated `Request` (or a `RequestError`)."""
    body = _only(body, FIELDS[kind], list_them=False)
    for name, (neutral, accepted) in (NEUTRAL | NEUTRAL_BY_KIND[kind]).items():
        if body.get(name) is not None and not neutral(body[name]):
            raise _bad(f"'{name}' = {json.dumps(body[name])[:80]} is not supported by this server; it accepts only "
                       f"{accepted} (or leaving it out)", name, "unsupported_value")
    for name, (type_, what) in HARMLESS.items():
        if body.get(name) is not None and not isinstance(body[name], type_):
            raise _bad(f"'{name}' must be {what}", name, "invalid_type")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a string", "model", "missing_required_parameter")
    n = 1 if body.get("n") is None else _integer(body["n"], "n", 1, limits.max_prompts)
    asked = {name: _integer(body[name], name, 1, limits.max_tokens)  # each one sent is checked
             for name in ("max_tokens", "max_completion_tokens") if body.get(name) is not None}
    name = next(iter(sorted(asked, key=len, reverse=True)), None)  # max_completion_tokens wins, as OpenAI's
    max_tokens = asked[name] if name else limits.default_max_tokens
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream", "invalid_type")
    options = body.get("stream_options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise _bad("'stream_options' must be an object", "stream_options", "invalid_type")
    include_usage = options.get("include_usage", False)
    if include_usage is None:
        include_usage = False
    if not isinstance(include_usage, bool):
        raise _bad("'stream_options.include_usage' must be a boolean", "stream_options.include_usage", "invalid_type")
    seed = body.get("seed")
    if seed is not None:
        seed = _integer(seed, "seed", None, None) % 2**63  # any integer, as a torch seed (unsigned)
    ext = _extension(body, limits)
    prompts = _prompts(body, limits.max_prompts) if kind == "completion" else ()
    if len(prompts) > 1 and stream:
        raise _bad("several prompts are served without 'stream' only", "prompt", "unsupported_value")
    if n > 1 and (stream or len(prompts) > 1):
        raise _bad(f"n = {n} choices are served for one prompt and without 'stream' only", "n", "unsupported_value")
    best_of = n
    if kind == "completion" and body.get("best_of") is not None:
        best_of = max(_integer(body["best_of"], "best_of", 1, limits.max_prompts), n)  # below n: the n asked for
        if best_of > 1 and (stream or len(prompts) > 1):
            raise _bad(f"best_of = {best_of} is served for one prompt and without 'stream' only", "best_of",
                       "unsupported_value")
    from .tools import ToolsError, parse_tools

    try:
        tools = parse_tools(body) if kind == "chat" else None
    except ToolsError as err:
        raise _bad(str(err), err.param, err.code) from None
    constraints = [g for g in (_response_format(body), ext.get("grammar"), tools and tools.grammar()) if g]
    if len(constraints) > 1:
        raise _bad(f"only one of 'response_format', '{EXTENSION}.grammar' or '.regex', and 'tools' (with a "
                   "tool_choice other than none) may constrain the output", "response_format", "invalid_value")
    grammar = constraints[0] if constraints else None
    logprobs = _logprobs(body, kind)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    speculative = _speculative(body, limits)
    settings = Settings(
        gamma=ext.get("gamma"),
        params=SamplingParams(temperature=temperature, top_p=top_p, top_k=ext.get("top_k", 0), **_controls(body)),
        max_new_tokens=max_tokens, lenience=ext.get("lenience", 1.0), seed=seed, stop=_stop(body),
        logprobs=logprobs, grammar=grammar, max_draft=speculative.get("n_max"), min_draft=speculative.get("n_min", 0))
    return Request(
        kind=kind, model=model,
        messages=_messages(body) if kind == "chat" else None,
        prompt=prompts[0] if prompts else None, prompts=prompts, settings=settings, max_tokens_param=name,
        stream=stream, include_usage=stream and include_usage, draft=ext.get("draft"), echo=_echo(body, stream),
        n=n, tools=tools, trace=ext.get("trace", False), best_of=best_of, p_min=speculative.get("p_min"),
    )


TOKENIZE_FIELDS = {"content", "prompt", "add_special", "add_special_tokens"}


def parse_tokenize(body: Any) -> tuple[str, bool]:
    """/tokenize's body as llama.cpp's server (`content`, `add_special`) and vLLM's (`prompt`,
    `add_special_tokens`) take it -> (text, whether to add the special tokens)."""
    body = _only(body, TOKENIZE_FIELDS)
    for name in ("content", "prompt"):
        if name in body and not isinstance(body[name], str):
            raise _bad(f"'{name}' must be a string", name, "invalid_type")
    text = body.get("content", body.get("prompt"))
    if text is None:
        raise _bad("'content' (or 'prompt') is required", "content", "missing_required_parameter")
    for name in ("add_special", "add_special_tokens"):
        if name in body and not isinstance(body[name], bool):
            raise _bad(f"'{name}' must be true or false", name, "invalid_type")
    return text, body.get("add_special", body.get("add_special_tokens", True))


def parse_detokenize(body: Any, vocab: int) -> list[int]:
    """/detokenize's body -> its token ids, each in 0..vocab - 1."""
    tokens = _only(body, {"tokens"}).get("tokens")
    tokens = [whole(t) for t in tokens] if isinstance(tokens, list) else tokens
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                               for t in tokens):
        raise _bad(f"'tokens' must be a list of token ids in 0..{vocab - 1}", "tokens", "invalid_value")
    return tokens
