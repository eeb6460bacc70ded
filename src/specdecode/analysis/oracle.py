"""One engine's numerics against another's on the user's own file: `specdecode check --target FILE
--against llama.cpp`.

The native backend reads a GGUF file itself; llama.cpp's reading of the same file is the oracle
(what its loader reads for an architecture, the native path computes identically or refuses:
`models/native/reading.py`). Over a few built-in texts, teacher-forced, each position's next-token
distribution from both: the mean and largest KL(llama.cpp || native) and how often their argmax
agree; each text's token ids from both tokenizers, with the special tokens the file asks for and
without; and a conversation rendered by the file's chat template in each (`chat_rendering`). The
thresholds are the oracle tests' (tests/test_gguf.py): random-weight files of
every format and architecture pass at a mean KL under 0.01 nats and 85% agreement, Gemma 3 270M's
real weights at 0.02 and 80% (a few hundred positions past its sliding window); a file computed
differently (a RoPE factor, a norm, a window left out) lands at 0.02-3 nats.

Those thresholds hold for files a few layers deep. Through 16 layers of a K-quant file, each
engine's own 8-bit activations move it further from exact arithmetic: on Llama 3.2 1B's shape in
Q4_K_M, llama.cpp is 0.030 nats from exact float32 arithmetic on the same weights and the native
path 0.016, so the two are 0.05 apart while both are right. Where a quantised file misses the
thresholds, the check asks which engine is off (`Reference`): llama.cpp writes a copy of the file
with every weight dequantised to F16, both engines run it (where they must agree to the thresholds:
the architecture is computed alike), and that run is the exact reference each engine's quantised
run is measured from; the native path agrees when it is no further from it than llama.cpp is (a
quarter more, for noise)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

MAX_MEAN_KL, MIN_AGREEMENT = 0.02, 0.80
MARGIN = 1.25  # how much further than llama.cpp's the native quantised run may be from the exact reference

TEXTS = (
    "The committee reviewed the budget on Monday and approved the plan for the new library, which will "
    "open in the spring. Members asked how the costs would be shared between the city and the county.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a\n\nprint([fibonacci(i) for i in range(10)])\n",
    "Question: A train leaves at 9:40 and arrives at 11:15. How long is the journey?\nAnswer: From 9:40 to "
    "10:40 is one hour, and from 10:40 to 11:15 is 35 minutes, so the journey takes 1 hour 35 minutes.",
    "Translate into French: The weather is lovely today, and we are going to the market to buy bread, "
    "cheese and fresh fruit for the picnic by the river.",
)


@dataclass
class Agreement:
    positions: int
    mean_kl: float  # nats, KL(oracle || ours) averaged over every position
    max_kl: float
    agreement: float  # share of positions whose argmax both engines agree on
    token_mismatches: list[str] = field(default_factory=list)  # texts the two tokenizers split differently
    # the chat template's rendering of CHAT against llama.cpp's: "identical", "not compared: why", or
    # "differs: where" (which fails the check)
    chat: str = "not compared: no chat template read"

    @property
    def texts_agree(self) -> bool:
        """Both tokenize every text alike and render the chat alike."""
        return not self.token_mismatches and not self.chat.startswith("differs")

    @property
    def agrees(self) -> bool:
        return self.mean_kl < MAX_MEAN_KL and self.agreement >= MIN_AGREEMENT and self.texts_agree


CHAT = ({"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."})


def chat_rendering(ours, oracle) -> str:
    """The file's chat template rendered by our tokenizer (jinja, as transformers renders it) against
    llama.cpp's own rendering of it (`llama_chat_apply_template`, which recognises the templates it
    knows), for CHAT with the assistant's turn opened. A leading BOS in ours is left out: llama.cpp
    adds it when tokenizing, as the file's flag says (the token ids are compared separately)."""
    import ctypes

    import llama_cpp

    try:
        mine = ours.tokenizer.apply_chat_template(list(CHAT), tokenize=False, add_generation_prompt=True)
    except Exception as err:  # noqa: BLE001  (a template that cannot render this conversation)
        return f"not compared: our rendering failed ({type(err).__name__}: {err})"
    template = llama_cpp.llama_model_chat_template(oracle.llm.model, None)
    if not template:
        return "not compared: the file has no chat template"
    messages = (llama_cpp.llama_chat_message * len(CHAT))(
        *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in CHAT])
    buffer = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(template, messages, len(CHAT), True, buffer, len(buffer))
    if n < 0:
        return "not compared: llama.cpp has no built-in rendering of this template"
    theirs = buffer.raw[:n].decode("utf-8", errors="replace")
    bos = ours.tokenizer.bos_token or ""
    mine = mine[len(bos):] if bos and mine.startswith(bos) and not theirs.startswith(bos) else mine
    if mine == theirs:
        return "identical"
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
    return f"differs: from character {at}, ours {mine[at:at + 40]!r} against llama.cpp's {theirs[at:at + 40]!r}"


def texts_ids(model, texts=TEXTS) -> list[list[int]]:
    return [model.tokenizer.encode(text, add_special_tokens=True) for text in texts]


def logprobs(model, ids: list[list[int]]) -> list[torch.Tensor]:
    """Each text's next-token log-probabilities, teacher-forced: [T, V] float32 a text."""
    return [torch.log_softmax(model.forward(torch.tensor([i]), model.new_cache())[0].double(), dim=-1).float()
            for i in ids]


def distance(p: list[torch.Tensor], q: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every position's KL(p || q) in nats, and whether their argmax agree."""
    p, q = torch.cat(p).double(), torch.cat(q).double()
    return (p.exp() * (p - q)).sum(-1), p.argmax(-1) == q.argmax(-1)


def compare(ours, oracle, texts=TEXTS) -> Agreement:
    """`ours` (a native model) against `oracle` (llama.cpp on the same file)."""
    mismatches = []
    for text in texts:
        for special in (True, False):
            mine = ours.tokenizer.encode(text, add_special_tokens=special)
            theirs = oracle.llm.tokenize(text.encode(), add_bos=special, special=False)
            if mine != theirs:
                mismatches.append(f"{text[:30]!r} ({'with' if special else 'without'} special tokens: "
                                  f"{len(mine)} ids against llama.cpp's {len(theirs)})")
    ids = texts_ids(ours, texts)
    kl, same = distance(logprobs(oracle, ids), logprobs(ours, ids))
    return Agreement(kl.numel(), kl.mean().item(), kl.max().item(), same.double().mean().item(), mismatches,
                     chat_rendering(ours, oracle))


@dataclass
class Reference:
    """Both engines on the file's weights dequantised to F16 (`dequantised_copy`): `exact` is the
    native path against llama.cpp there (the architecture computed alike), and each engine's run of
    the quantised file is measured from llama.cpp's run of the copy (mean KL, nats)."""

    exact: Agreement
    ours_from_exact: float
    theirs_from_exact: float

    @property
    def agrees(self) -> bool:
        return self.exact.agrees and self.ours_from_exact <= max(MAX_MEAN_KL, MARGIN * self.theirs_from_exact)


def is_quantised(path) -> bool:
    """Whether a GGUF file holds any tensor in a quantised type (not F32, F16 or BF16)."""
    from gguf import GGMLQuantizationType as T

    from ..models.gguf import GGUFHeader

    return any(t.tensor_type not in (T.F32, T.F16, T.BF16) for t in GGUFHeader(Path(path)).tensors.values())


def dequantised_copy(path, directory) -> Path:
    """`path` with every quantised weight dequantised to F16, written by llama.cpp's own quantiser
    (its dequantisation; F16 rounds each value by at most 2^-11 of it, far below a 4-bit step)."""
    import llama_cpp

    out = Path(directory) / (Path(path).stem + ".F16.gguf")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_F16, True, os.cpu_count()
    if llama_cpp.llama_model_quantize(str(path).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not write a dequantised copy of {path}")
    return out


def reference(ours, oracle, load, path, texts=TEXTS) -> Reference:
    """`ours` and `oracle` on `path` measured from llama.cpp on its dequantised copy; `load(path,
    backend)` loads a model (the native one in float32 arithmetic)."""
    ids = texts_ids(ours, texts)
    quantised = {"ours": logprobs(ours, ids), "theirs": logprobs(oracle, ids)}
    with tempfile.TemporaryDirectory() as tmp:
        copy = dequantised_copy(path, tmp)
        exact_theirs = logprobs(load(copy, "llama.cpp"), ids)
        exact_ours = logprobs(load(copy, "native"), ids)
    kl, same = distance(exact_theirs, exact_ours)
    exact = Agreement(kl.numel(), kl.mean().item(), kl.max().item(), same.double().mean().item())
    return Reference(exact, *(distance(exact_theirs, quantised[k])[0].mean().item() for k in ("ours", "theirs")))


def report(result: Agreement, name: str) -> list[str]:
    lines = [f"{name}: native against llama.cpp over {result.positions} positions of {len(TEXTS)} texts",
             f"mean KL {result.mean_kl:.5f} nats (max {result.max_kl:.4f}; threshold {MAX_MEAN_KL}), argmax "
             f"agreement {result.agreement:.3f} (threshold {MIN_AGREEMENT})"]
    lines += [f"tokenised differently: {m}" for m in result.token_mismatches] or ["tokenisation: identical ids"]
    return lines + [f"chat template: {result.chat}"]


def report_reference(ref: Reference) -> list[str]:
    return [f"past the thresholds: both engines on the file dequantised to F16, native against llama.cpp: mean KL "
            f"{ref.exact.mean_kl:.5f} nats, argmax agreement {ref.exact.agreement:.3f} "
            f"({'within' if ref.exact.agrees else 'BEYOND'} the thresholds)",
            f"from that exact reference: the native path {ref.ours_from_exact:.5f} nats, llama.cpp "
            f"{ref.theirs_from_exact:.5f} (the native path may be up to {MARGIN}x llama.cpp's)"]
