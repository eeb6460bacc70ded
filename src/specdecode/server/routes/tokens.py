"""POST /tokenize and /detokenize (text <-> token ids, with llama.cpp's and vLLM's field names) and
GET /tokenizer_info."""

from __future__ import annotations

from fastapi import Request as HTTPRequest

from ..request import parse_detokenize, parse_tokenize


async def tokenize(request: HTTPRequest):
    """Text -> token ids, as llama.cpp's server (`content`, `add_special`) and vLLM's (`prompt`,
    `add_special_tokens`) take it."""
    state = request.app.state.server
    text, special = parse_tokenize(await state.read_json(request))
    tokens = state.tokenize_text(text, special, "content")
    return {"tokens": tokens, "count": len(tokens), "max_model_len": state.target.max_positions}


async def detokenize(request: HTTPRequest):
    state = request.app.state.server
    text = state.target.tokenizer.decode(parse_detokenize(await state.read_json(request), state.vocab))
    return {"content": text, "prompt": text}


async def tokenizer_info(request: HTTPRequest):
    """The tokenizer's special tokens and chat template, as vLLM's server gives them (what
    lm-evaluation-harness's remote tokenizer reads beside /tokenize and /detokenize)."""
    target = request.app.state.server.target
    tokenizer = target.tokenizer
    return {"tokenizer_class": type(tokenizer).__name__, "eos_token": tokenizer.eos_token,
            "bos_token": tokenizer.bos_token, "pad_token": tokenizer.pad_token,
            "chat_template": getattr(tokenizer, "chat_template", None),
            "model_max_length": target.max_positions}
