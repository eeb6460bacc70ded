"""The request bodies the server accepts, as JSON Schema for its OpenAPI description (`/openapi.json`).

The checks in `request.py` are the authority (they refuse what this allows but cannot express, such
as a prompt longer than the context); this describes them for clients and for schema-driven tests.
"""

from __future__ import annotations

from ..checks import MAX_TOP_LOGPROBS
from .request import EXTENSION, ROLES, Limits

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
_STOP = {"anyOf": [{"type": "string", "minLength": 1},
                   {"type": "array", "maxItems": 4, "items": {"type": "string", "minLength": 1}}, {"type": "null"}]}


def _common(limits: Limits, names: list[str]) -> dict:
    """The fields chat and completions requests share (`names`: the model ids the server answers to)."""
    return {
        "model": {"enum": list(names)},
        "max_tokens": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": limits.max_tokens}, {"type": "null"}]},
        "temperature": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 2}, {"type": "null"}]},
        "top_p": {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1}, {"type": "null"}]},
        "stop": _STOP,
        "seed": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "stream": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
        "stream_options": {"anyOf": [{"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
                                     {"type": "null"}]},
        "n": {"anyOf": [{"const": 1}, {"type": "null"}]},
        EXTENSION: {"anyOf": [{"type": "object", "properties": {
            "draft": {"type": "string"},
            "gamma": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": limits.max_gamma}, {"const": "auto"}]},
            "top_k": {"type": "integer", "minimum": 0},
            "lenience": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}}, {"type": "null"}]},
    }


def chat_body(limits: Limits, names: list[str]) -> dict:
    message = {"type": "object", "required": ["role", "content"], "additionalProperties": False, "properties": {
        "role": {"enum": list(ROLES)},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
        "name": {"type": "string"}}}
    return {"type": "object", "required": ["model", "messages"], "additionalProperties": False, "properties": {
        **_common(limits, names),
        "messages": {"type": "array", "minItems": 1, "items": message},
        "max_completion_tokens": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": limits.max_tokens},
                                            {"type": "null"}]},
        "logprobs": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
        "top_logprobs": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}, {"type": "null"}]},
    }}


def completion_body(limits: Limits, names: list[str]) -> dict:
    one = {"anyOf": [{"type": "string", "minLength": 1}, _IDS]}
    return {"type": "object", "required": ["model", "prompt"], "additionalProperties": False, "properties": {
        **_common(limits, names),
        "prompt": {"anyOf": [one, {"type": "array", "minItems": 1, "maxItems": limits.max_prompts, "items": one}]},
        "logprobs": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}, {"type": "null"}]},
        "echo": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
    }}


TOKENIZE_BODY = {"type": "object", "additionalProperties": False, "properties": {
    "content": {"type": "string"}, "prompt": {"type": "string"},
    "add_special": {"type": "boolean"}, "add_special_tokens": {"type": "boolean"}}}
DETOKENIZE_BODY = {"type": "object", "required": ["tokens"], "additionalProperties": False, "properties": {
    "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}}}


def request_body(schema: dict) -> dict:
    """A route's `openapi_extra`: its JSON request body."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
