"""One engine's numerics against another's on the user's own file: `specdecode check --target FILE
--against llama.cpp`.

The native backend reads a GGUF file itself; llama.cpp's reading of the same file is the oracle
(what its loader reads for an architecture, the native path computes identically or refuses:
`models/native/reading.py`). Over a few built-in texts, teacher-forced, each position's next-token
distribution from both: the mean and largest KL(llama.cpp || native) and how often their argmax
agree; and each text's token ids from both tokenizers, with the special tokens the file asks for
and without. The thresholds are the oracle tests' (tests/test_gguf.py): random-weight files of
every format and architecture pass at a mean KL under 0.01 nats and 85% agreement, Gemma 3 270M's
real weights at 0.02 and 80% (a few hundred positions past its sliding window); a file computed
differently (a RoPE factor, a norm, a window left out) lands at 0.02-3 nats."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MAX_MEAN_KL, MIN_AGREEMENT = 0.02, 0.80

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

    @property
    def agrees(self) -> bool:
        return self.mean_kl < MAX_MEAN_KL and self.agreement >= MIN_AGREEMENT and not self.token_mismatches


def _logprobs(model, ids: list[int]) -> torch.Tensor:  # [T, V] float64
    return torch.log_softmax(model.forward(torch.tensor([ids]), model.new_cache())[0].double(), dim=-1)


def compare(ours, oracle, texts=TEXTS) -> Agreement:
    """`ours` (a native model) against `oracle` (llama.cpp on the same file)."""
    kls, agree, mismatches = [], [], []
    llm = oracle.llm
    for text in texts:
        for special in (True, False):
            mine = ours.tokenizer.encode(text, add_special_tokens=special)
            theirs = llm.tokenize(text.encode(), add_bos=special, special=False)
            if mine != theirs:
                mismatches.append(f"{text[:30]!r} ({'with' if special else 'without'} special tokens: "
                                  f"{len(mine)} ids against llama.cpp's {len(theirs)})")
        ids = ours.tokenizer.encode(text, add_special_tokens=True)
        p, q = _logprobs(oracle, ids), _logprobs(ours, ids)
        kls.append((p.exp() * (p - q)).sum(-1))
        agree.append(p.argmax(-1) == q.argmax(-1))
    kl, same = torch.cat(kls), torch.cat(agree)
    return Agreement(kl.numel(), kl.mean().item(), kl.max().item(), same.double().mean().item(), mismatches)


def report(result: Agreement, name: str) -> list[str]:
    verdict = "agrees" if result.agrees else "DISAGREES"
    lines = [f"{name}: native against llama.cpp over {result.positions} positions of {len(TEXTS)} texts",
             f"mean KL {result.mean_kl:.5f} nats (max {result.max_kl:.4f}; threshold {MAX_MEAN_KL}), argmax "
             f"agreement {result.agreement:.3f} (threshold {MIN_AGREEMENT})"]
    lines += [f"tokenised differently: {m}" for m in result.token_mismatches] or ["tokenisation: identical ids"]
    return lines + [f"verdict: {verdict}"]
