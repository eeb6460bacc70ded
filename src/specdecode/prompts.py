"""A prompt as token ids: plain text, or a conversation through the tokenizer's chat template."""

from __future__ import annotations

from typing import Sequence

from .checks import check_prompt_text


def encode_prompt(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    """Token ids for a plain prompt; with `chat` the tokenizer's chat template wraps it as a user turn."""
    check_prompt_text(prompt)
    if chat and getattr(tokenizer, "chat_template", None):
        return encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    return tokenizer.encode(prompt, add_special_tokens=True)


def encode_chat(tokenizer, messages: Sequence[dict], tools: list | None = None) -> list[int]:
    """Token ids of a conversation ({"role", "content"} turns) through the tokenizer's chat
    template, ending with the assistant's turn opened; `tools` (OpenAI's function specs) for a
    template that reads them."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
    extra = {"tools": tools} if tools else {}
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                        return_dict=False, **extra)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
