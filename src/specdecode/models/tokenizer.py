"""A model's tokenizer from the files transformers saves (`tokenizer.json`, `tokenizer_config.json`,
the chat template), computed by the `tokenizers` library and jinja2 alone.

transformers' fast tokenizers are the same `tokenizers` object behind a large import (about 2.5 s of
a warm start on 2 cores); this class gives what specdecode uses of them (encode, decode, the
vocabulary, the special tokens, the chat template rendered as `apply_chat_template` renders it) and
loads in milliseconds. tests/test_tokenizer.py checks it against transformers on each model it runs.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Sequence

# transformers' named special tokens (its SPECIAL_TOKENS_ATTRIBUTES), the variables a template sees
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def has_fast_files(directory: Path) -> bool:
    """Whether `directory` holds what this class reads (else transformers must build the tokenizer)."""
    return (directory / "tokenizer.json").exists() and (directory / "tokenizer_config.json").exists()


class Tokenizer:
    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer as Backend

        self.directory = directory = Path(directory)  # the files it was read from
        self.backend = Backend.from_file(str(directory / "tokenizer.json"))
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        self.special = {name: _content(config.get(name)) for name in SPECIAL_NAMES if config.get(name) is not None}
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        self.extra_special = [_content(t) for t in (extra.values() if isinstance(extra, dict) else extra)]
        self.clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self.chat_template = _chat_template(directory, config)

    def __getattr__(self, name: str):  # bos_token, eos_token_id, pad_token, ... as transformers names them
        base = name.removesuffix("_id")
        if base in SPECIAL_NAMES:
            token = self.__dict__.get("special", {}).get(base)
            return token if base == name or token is None else self.backend.token_to_id(token)
        raise AttributeError(name)

    # -- text and ids ------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str, add_special_tokens: bool = True, return_offsets_mapping: bool = False) -> dict:
        """{"input_ids"} and, where asked, {"offset_mapping"}: each token's (start, end) in `text`."""
        encoding = self.backend.encode(text, add_special_tokens=add_special_tokens)
        out = {"input_ids": encoding.ids}
        if return_offsets_mapping:
            out["offset_mapping"] = encoding.offsets
        return out

    def decode(self, ids: Sequence[int] | int, skip_special_tokens: bool = False) -> str:
        text = self.backend.decode([ids] if isinstance(ids, int) else list(ids), skip_special_tokens=skip_special_tokens)
        # transformers cleans up only WordPiece-style output (it skips BPE models: it would remove real spaces)
        if self.clean_up_spaces and type(self.backend.model).__name__ != "BPE":
            text = _clean_up(text)
        return text

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.backend.id_to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]):  # one id, or a list, as transformers'
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(t) for t in tokens]

    @property
    def backend_tokenizer(self):  # transformers' name for the `tokenizers` object
        return self.backend

    @property
    def added_tokens_decoder(self) -> dict:
        return self.backend.get_added_tokens_decoder()

    @property
    def all_special_ids(self) -> list[int]:
        tokens = [*self.special.values(), *self.extra_special]
        return sorted({i for i in map(self.backend.token_to_id, tokens) if i is not None})

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    # -- chat --------------------------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = False,
                            tokenize: bool = True, tools: list | None = None, **kwargs):
        """The conversation through the chat template, as transformers renders it (its jinja2
        settings, filters and variables: the named special tokens, `tools`, `add_generation_prompt`);
        token ids without added special tokens (the template writes them) when `tokenize`."""
        if not self.chat_template:
            raise ValueError("this model's tokenizer has no chat template")
        kwargs.pop("return_dict", None)
        text = _compiled(self.chat_template).render(
            **self.special, **kwargs, messages=copy.deepcopy(list(messages)), tools=tools,
            add_generation_prompt=add_generation_prompt)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def __repr__(self) -> str:
        return f"Tokenizer({len(self)} tokens, chat template: {'yes' if self.chat_template else 'no'})"


def _content(token) -> str:
    return token["content"] if isinstance(token, dict) else str(token)


def _chat_template(directory: Path, config: dict) -> str | None:
    """The default chat template: `chat_template.jinja` (transformers 5 writes it) or the config's
    entry (a string, or named templates of which "default" is the one used)."""
    path = directory / "chat_template.jinja"
    template = path.read_text(encoding="utf-8") if path.exists() else config.get("chat_template")
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template}.get("default")
    return template or None


@lru_cache(maxsize=8)
def _compiled(template: str):
    """A template compiled in jinja2's immutable sandbox with transformers' settings (trim and
    lstrip blocks, loop controls, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII
    text, and the `{% generation %}` block rendering its body)."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # transformers tracks assistant tokens with it; here it only renders
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _clean_up(text: str) -> str:
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text
