"""The request bodies the server accepts, as JSON Schema for its OpenAPI description (`/openapi.json`).

The checks in `request.py` are the authority (they refuse what this allows but cannot express, such
as a prompt longer than the context); this describes them for clients and for schema-driven tests.
"""

from __future__ import annotations

from typing import Sequence

from ..checks import MAX_TOP_LOGPROBS
from ..sampling import MAX_REPEAT_LAST_N
from .request import EXTENSION, ROLES, Limits

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}


def _ids(vocab: int, least: int = 1) -> dict:
    """A list of token ids of a vocabulary of `vocab` tokens."""
    return {"type": "array", "minItems": least, "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1}}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


_STOP = {"anyOf": [{"type": "string", "minLength": 1},
                   {"type": "array", "maxItems": 4, "items": {"type": "string", "minLength": 1}}, {"type": "null"}]}


def _max_tokens(limits: Limits) -> dict:
    cap = {} if limits.max_tokens is None else {"maximum": limits.max_tokens}
    return {"type": "integer", "minimum": 1, **cap}


def _below(n: int) -> str:
    """A pattern of the decimal integers 0..n-1 (no leading zeros): token ids of a vocabulary of n."""
    top = str(n - 1)
    alternatives = ["0"] + ([f"[1-9][0-9]{{0,{len(top) - 2}}}"] if len(top) > 1 else [])
    for i, digit in enumerate(top):  # numbers of top's length below it: a smaller digit at place i
        least = 1 if i == 0 else 0
        if int(digit) > least:
            alternatives.append(top[:i] + f"[{least}-{int(digit) - 1}]" + "[0-9]" * (len(top) - i - 1))
    return "^(" + "|".join(alternatives + [top]) + ")$"


def _speculative() -> dict:
    """llama-server's per-request speculation, as an object and as its flat dotted keys."""
    fields = {"n_max": _nullable({"type": "integer", "minimum": 0, "description": "the longest draft (0: none; "
                                  "capped at the server's --max-gamma)"}),
              "n_min": _nullable({"type": "integer", "minimum": 0, "description": "deterministic drafts shorter "
                                  "than this are not verified (capped at n_max)"}),
              "p_min": _nullable({"type": "number", "minimum": 0, "exclusiveMaximum": 1, "description": "a draft "
                                  "model stops below this top probability"})}
    return {"speculative": _nullable({"type": "object", "additionalProperties": False, "properties": fields}),
            **{f"speculative.{name}": schema for name, schema in fields.items()}}


def _common(limits: Limits, names: list[str], drafts: list[str], vocab: int) -> dict:
    """The fields chat and completions requests share (`names`: the model ids the server answers to;
    `drafts`: the drafters a request may name)."""
    return {
        "model": {"enum": list(names)},
        "max_tokens": {"anyOf": [_max_tokens(limits), {"type": "null"}]},
        "temperature": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 2}, {"type": "null"}]},
        "top_p": {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1}, {"type": "null"}]},
        "stop": _STOP,
        "seed": _nullable({"type": "integer"}),
        "stream": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
        "stream_options": _nullable({"type": "object", "properties": {"include_usage": _nullable({"type": "boolean"})}}),
        "n": _nullable({"type": "integer", "minimum": 1, "maximum": limits.max_prompts}),
        "presence_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
        "frequency_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
        "repetition_penalty": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 10}),
        "repeat_penalty": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 10}),
        "repeat_last_n": _nullable({"type": "integer", "minimum": -1, "maximum": MAX_REPEAT_LAST_N,
                                    "description": "the tokens the repetition penalty reads: the last n of prompt and "
                                    "output (-1: all; default 64 under repeat_penalty, all under repetition_penalty)"}),
        "min_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "logit_bias": _nullable({"type": "object", "propertyNames": {"pattern": _below(vocab)},
                                 "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}),
        **_speculative(),
        EXTENSION: _nullable({"type": "object", "additionalProperties": False, "properties": {
            "draft": _nullable({"enum": list(drafts)}),
            "gamma": _nullable({"anyOf": [{"type": "integer", "minimum": 0, "maximum": limits.max_gamma},
                                          {"const": "auto"}]}),
            "top_k": _nullable({"type": "integer", "minimum": 0}),
            "lenience": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
            "trace": _nullable({"type": "boolean", "description": "each target call's tokens in the reply "
                                "(accepted draft, target's own, rejected): the `specdecode` field of each chunk"})}}),
    }


ONE = {"anyOf": [{"const": 1}, {"type": "null"}]}
SEVERAL = {"type": "array", "minItems": 2, "items": {"type": ["string", "array"]}}  # several prompts, not ids
# n choices are served without a stream only
STREAMED_ONE_CHOICE = {"if": {"required": ["stream"], "properties": {"stream": {"const": True}}},
                       "then": {"properties": {"n": ONE}}}
ONE_REPETITION_NAME = {"required": ["repetition_penalty", "repeat_penalty"]}  # one control, two names: one of them


def chat_body(limits: Limits, names: list[str], drafts: list[str], vocab: int) -> dict:
    message = {"type": "object", "required": ["role", "content"], "additionalProperties": False, "properties": {
        "role": {"enum": [r for r in ROLES if r != "tool"]},  # a tool result also needs its call's id
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
        "name": {"type": "string"}}}
    return {"type": "object", "required": ["model", "messages"], "additionalProperties": False, "properties": {
        **_common(limits, names, drafts, vocab),
        "messages": {"type": "array", "minItems": 1, "items": message},
        "max_completion_tokens": {"anyOf": [_max_tokens(limits), {"type": "null"}]},
        "logprobs": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
        "top_logprobs": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}, {"type": "null"}]},
    }, "not": ONE_REPETITION_NAME, "allOf": [
        {"if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
         "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}},  # alternatives need logprobs
        STREAMED_ONE_CHOICE]}


def completion_body(limits: Limits, names: list[str], drafts: list[str], vocab: int) -> dict:
    one = {"anyOf": [{"type": "string", "minLength": 1}, _ids(vocab)]}
    return {"type": "object", "required": ["model", "prompt"], "additionalProperties": False, "properties": {
        **_common(limits, names, drafts, vocab),
        "prompt": {"anyOf": [one, {"type": "array", "minItems": 1, "maxItems": limits.max_prompts, "items": one}]},
        "logprobs": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}, {"type": "null"}]},
        "echo": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
        "best_of": _nullable({"type": "integer", "minimum": 1, "maximum": limits.max_prompts,
                              "description": "choices sampled, of which the n with the highest mean token "
                                             "log-probability return (n where below it; one prompt, no stream)"}),
    }, "not": ONE_REPETITION_NAME, "allOf": [
        STREAMED_ONE_CHOICE,
        {"if": {"required": ["stream"], "properties": {"stream": {"const": True}}},  # best_of: no stream
         "then": {"properties": {"best_of": ONE}}},
        {"if": {"required": ["prompt"], "properties": {"prompt": SEVERAL}},  # nor several prompts
         "then": {"properties": {"best_of": ONE}}},
        {"if": {"required": ["stream"], "properties": {"stream": {"const": True}}},  # a stream: no echo, one prompt
         "then": {"properties": {"echo": {"not": {"const": True}}, "prompt": {"not": SEVERAL}}}},
        {"if": {"required": ["prompt"], "properties": {"prompt": SEVERAL}},  # several prompts: one choice each
         "then": {"properties": {"n": ONE}}}]}


TOKENIZE_BODY = {"type": "object", "additionalProperties": False, "anyOf": [{"required": ["content"]},
                                                                             {"required": ["prompt"]}],
                 "properties": {"content": {"type": "string"}, "prompt": {"type": "string"},
                                "add_special": {"type": "boolean"}, "add_special_tokens": {"type": "boolean"}}}


def detokenize_body(vocab: int) -> dict:
    return {"type": "object", "required": ["tokens"], "additionalProperties": False,
            "properties": {"tokens": _ids(vocab, least=0)}}


def request_body(schema: dict) -> dict:
    """A route's `openapi_extra`: its JSON request body."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


# OpenAI's error body, which every refusal and failure carries (`request.RequestError`)
ERROR_BODY = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
_WHY = {400: "the request is not valid (the message names the field)", 401: "no valid API key",
        404: "no such model", 413: "the body is too large", 429: "the queue is full (see Retry-After)",
        500: "a server bug (its id is in the log)"}


def responses(*statuses: int, ok: dict | None = None, guarded: bool = True) -> dict:
    """A route's documented answers (FastAPI's `responses`): `ok` the 200's content where it is not
    plain JSON, each error status with OpenAI's error body, a 401 where an API key guards the route,
    and a 500 everywhere."""
    documented = {status: {"description": _WHY[status], "content": {"application/json": {"schema": ERROR_BODY}}}
                  for status in sorted({*statuses, 500} | ({401} if guarded else set()))}
    if ok is not None:
        documented[200] = {"description": "OK", "content": ok}
    return documented


def without_unsent_statuses(app, model_ids: Sequence[str] = ()) -> None:
    """FastAPI documents a 422 for every route with parameters; this server never sends one (its own
    checks answer 400), so its description leaves them out. Given `model_ids` (the ids the server
    answers to), a `model_id` path parameter (GET /v1/models/{model_id}) lists them as its enum: its
    route is defined at module level, before the ids are known."""
    from fastapi.openapi.utils import get_openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in schema["paths"].values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
                    for parameter in operation.get("parameters", []):
                        if model_ids and parameter["in"] == "path" and parameter["name"] == "model_id":
                            given = parameter["schema"]  # {"type": "string", "title": ...}: the enum after the type
                            parameter["schema"] = {**{k: v for k, v in given.items() if k == "type"},
                                                   "enum": list(model_ids), **given}
            components = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
