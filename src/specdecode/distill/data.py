"""The distillation corpus: the target's own answers to built prompts, with its top-K next-token
log-probabilities at every answer position (the soft labels the draft is trained to match).

Answers come from batched `generate()` on the transformers backend (one forward per step for a
whole batch, several times the single-sequence throughput on a CPU), half greedy and half sampled
at temperature 1, so the draft sees the contexts of both decoding modes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..prompts import encode_prompt
from .prompts import passage_prompts, seed_prompts


@dataclass
class Corpus:
    """Concatenated sequences. Sequence i is tokens[offsets[i]:offsets[i+1]]; its answer starts at
    answer_starts[i] (absolute). Soft labels cover answer positions only, in order:
    top_ids/top_logprobs [N, K] where row j belongs to the j-th answer token overall and holds the
    target's distribution for that token given everything before it."""

    tokens: np.ndarray  # [total] int32
    offsets: np.ndarray  # [S + 1] int64
    answer_starts: np.ndarray  # [S] int64
    top_ids: np.ndarray  # [N, K] int32
    top_logprobs: np.ndarray  # [N, K] float16

    @property
    def num_sequences(self) -> int:
        return len(self.answer_starts)

    @property
    def num_answer_tokens(self) -> int:
        return len(self.top_ids)

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def answer(self, i: int) -> np.ndarray:
        return self.tokens[self.answer_starts[i] : self.offsets[i + 1]]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, tokens=self.tokens, offsets=self.offsets, answer_starts=self.answer_starts,
                            top_ids=self.top_ids, top_logprobs=self.top_logprobs)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Corpus":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"distillation corpus {str(path)!r} does not exist")
        with np.load(path) as f:
            missing = {"tokens", "offsets", "answer_starts", "top_ids", "top_logprobs"} - set(f.files)
            if missing:
                raise ValueError(f"{str(path)!r} is not a distillation corpus (missing {', '.join(sorted(missing))})")
            return cls(**{k: f[k] for k in f.files})

    @classmethod
    def concat(cls, parts: list["Corpus"]) -> "Corpus":
        tokens, offsets, starts, base = [], [0], [], 0
        for part in parts:
            tokens.append(part.tokens)
            offsets.extend((part.offsets[1:] + base).tolist())
            starts.extend((part.answer_starts + base).tolist())
            base += len(part.tokens)
        return cls(np.concatenate(tokens).astype(np.int32), np.array(offsets, dtype=np.int64),
                   np.array(starts, dtype=np.int64), np.concatenate([p.top_ids for p in parts]),
                   np.concatenate([p.top_logprobs for p in parts]))


class _TopK:
    """A logits processor that records the top-K log-probabilities of each step's raw logits."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.ids: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        values, ids = torch.log_softmax(scores.float(), -1).topk(self.k, -1)  # [B, K]
        self.ids.append(ids.to(torch.int32))
        self.logprobs.append(values.half())
        return scores


@torch.inference_mode()
def generate_batch(target, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_k: int = 32,
                   seed: int = 0) -> Corpus:
    """The target's answers to already-encoded prompts (one left-padded batch) with soft labels."""
    from transformers import LogitsProcessorList

    pad = target.tokenizer.pad_token_id
    pad = pad if pad is not None else min(target.eos_token_ids)
    width = max(map(len, prompts))
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for r, ids in enumerate(prompts):
        input_ids[r, width - len(ids):] = torch.tensor(ids)
        mask[r, width - len(ids):] = 1
    recorder = _TopK(top_k)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    torch.manual_seed(seed)
    out = target.model.generate(input_ids=input_ids.to(target.device), attention_mask=mask.to(target.device),
                                max_new_tokens=max_new_tokens, logits_processor=LogitsProcessorList([recorder]),
                                pad_token_id=pad, eos_token_id=sorted(target.eos_token_ids), **sampling).cpu()
    new = out[:, width:]  # [B, S]
    top_ids = torch.stack(recorder.ids, 1)  # [B, S, K]
    top_logprobs = torch.stack(recorder.logprobs, 1)
    tokens, offsets, starts, ids_rows, lp_rows = [], [0], [], [], []
    for r, ids in enumerate(prompts):
        answer = new[r].tolist()
        ends = [j for j, t in enumerate(answer) if t in target.eos_token_ids]
        n = ends[0] + 1 if ends else len(answer)  # the end-of-turn token is a target too
        starts.append(offsets[-1] + len(ids))
        tokens.extend(ids + answer[:n])
        offsets.append(len(tokens))
        ids_rows.append(top_ids[r, :n].numpy())
        lp_rows.append(top_logprobs[r, :n].numpy())
    return Corpus(np.array(tokens, dtype=np.int32), np.array(offsets, dtype=np.int64), np.array(starts, dtype=np.int64),
                  np.concatenate(ids_rows), np.concatenate(lp_rows))


def build_corpus(target, seconds: float, batch_size: int = 32, max_new_tokens: int = 256, top_k: int = 32,
                 seed: int = 0, passage_share: float = 0.5, log=print, max_batches: int | None = None) -> Corpus:
    """Generate for about `seconds` (or `max_batches` batches, whichever ends first; at least one):
    seed prompts first, then prompts quoting the seed answers.

    Batches alternate greedy and temperature-1 sampling. Each batch is one `generate()` call, so the
    budget is checked between batches and the last one may run over by one batch's time.
    """
    if seconds <= 0 or batch_size < 1 or max_new_tokens < 1 or (max_batches is not None and max_batches < 1):
        raise ValueError("the corpus needs a positive time budget, batch count, batch size and answer length")
    start = time.perf_counter()
    tok = target.tokenizer
    parts: list[Corpus] = []
    passages: list[tuple[str, str]] = []
    stage_one = seconds * (1 - passage_share)
    seeds = iter(seed_prompts(100_000, seed))
    batch_no = 0
    while batch_no == 0 or (time.perf_counter() - start < seconds and (max_batches is None or batch_no < max_batches)):
        in_stage_one = time.perf_counter() - start < stage_one or not passages
        if in_stage_one:
            pairs = [next(seeds) for _ in range(batch_size)]
        else:
            pairs = [(None, p) for p in passage_prompts(passages, batch_size, seed + batch_no)]
        encoded = [encode_prompt(tok, p) for _, p in pairs]
        temperature = 0.0 if batch_no % 2 == 0 else 1.0
        part = generate_batch(target, encoded, max_new_tokens, temperature, top_k, seed + batch_no)
        parts.append(part)
        if in_stage_one:
            for i, (topic, _) in enumerate(pairs):
                text = tok.decode(part.answer(i), skip_special_tokens=True).strip()
                if topic not in ("code", "arithmetic") and len(text.split()) >= 40:
                    passages.append((topic, text))
        batch_no += 1
        total = sum(p.num_answer_tokens for p in parts)
        log(f"corpus: batch {batch_no} ({'seed' if in_stage_one else 'passage'} prompts, temperature "
            f"{temperature:g}): {total} answer tokens in {time.perf_counter() - start:.0f} s")
    if not sum(p.num_answer_tokens for p in parts):
        raise ValueError(f"no answer token was generated in {seconds / 60:g} minutes ({batch_no} batches): every "
                         "answer ended at once; raise --answer-tokens or --data-minutes")
    return Corpus.concat(parts)
