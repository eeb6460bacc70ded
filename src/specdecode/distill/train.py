"""Training a DraftNet on the target's soft labels: minimise the cross-entropy from the target's
top-K distribution p to the draft's q, which is the forward KL(p || q) up to a constant.

Alongside the loss, held-out sequences report what speculative sampling will see (Leviathan et al.,
Section 3.1): greedy agreement (argmax q == argmax p, the acceptance rate at temperature 0) and
sum_x min(p(x), q(x)) over the target's top-K, a lower bound on beta at temperature 1 (alpha is its
mean, Definition 3.1).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..models.draftnet import DraftNet
from .data import Corpus


def choose_kept_ids(corpus: Corpus, size: int, always=()) -> torch.Tensor:
    """The `size` token ids carrying the most target probability mass in the corpus, plus `always`
    (end-of-turn tokens), sorted. [size] int64."""
    if size < 1:
        raise ValueError(f"the kept vocabulary needs at least one token, got {size}")
    vocab = int(max(corpus.top_ids.max(), corpus.tokens.max())) + 1
    mass = np.bincount(corpus.top_ids.ravel(), weights=np.exp(corpus.top_logprobs.astype(np.float32)).ravel(),
                       minlength=vocab)
    always = [t for t in always if t < vocab]
    mass[always] = np.inf
    order = np.argsort(-mass, kind="stable")[:size]
    return torch.from_numpy(np.sort(order)).long()


def kept_coverage(corpus: Corpus, kept_ids: torch.Tensor) -> float:
    """Fraction of the target's answer tokens that the kept vocabulary can propose."""
    answers = np.concatenate([corpus.answer(i) for i in range(corpus.num_sequences)])
    return float(np.isin(answers, kept_ids.numpy()).mean())


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, L] int64, right-padded
    rows: torch.Tensor  # [N] flat index into [B * L]: the positions whose next token has a soft label
    top_ids: torch.Tensor  # [N, K] int64, in kept-vocabulary indices, -1 where not kept
    top_probs: torch.Tensor  # [N, K] float32


class Batcher:
    """Length-bucketed batches of whole sequences, about `tokens_per_batch` tokens each."""

    def __init__(self, corpus: Corpus, kept_ids: torch.Tensor, vocab_size: int, tokens_per_batch: int = 8192,
                 max_len: int = 1024) -> None:
        self.corpus = corpus
        self.tokens_per_batch = tokens_per_batch
        self.max_len = max_len
        self.to_kept = torch.full((vocab_size,), -1, dtype=torch.long)
        self.to_kept[kept_ids] = torch.arange(len(kept_ids))
        answer_lengths = corpus.offsets[1:] - corpus.answer_starts
        self.label_start = np.concatenate([[0], np.cumsum(answer_lengths)])  # first label row per sequence

    def batches(self, sequences: np.ndarray, rng: np.random.Generator) -> list[list[int]]:
        lengths = np.minimum(self.corpus.offsets[sequences + 1] - self.corpus.offsets[sequences], self.max_len)
        order = sequences[np.argsort(lengths + rng.random(len(lengths)) * 64)]  # similar lengths, shuffled ties
        groups, group, width = [], [], 0
        for s in order:
            n = min(int(self.corpus.offsets[s + 1] - self.corpus.offsets[s]), self.max_len)
            if group and max(width, n) * (len(group) + 1) > self.tokens_per_batch:
                groups.append(group)
                group, width = [], 0
            group.append(int(s))
            width = max(width, n)
        if group:
            groups.append(group)
        rng.shuffle(groups)
        return groups

    def make(self, group: list[int]) -> Batch:
        c = self.corpus
        seqs, rows, label_rows = [], [], []
        for s in group:
            seq = c.sequence(s)
            start = max(0, len(seq) - self.max_len)  # crop the oldest prompt tokens if too long
            answer = int(c.answer_starts[s] - c.offsets[s])
            seqs.append(seq[start:])
            first = max(answer, start + 1)  # first labelled token still predictable from a kept position
            for t in range(first, len(seq)):
                rows.append((len(seqs) - 1, t - 1 - start))
                label_rows.append(self.label_start[s] + (t - answer))
        width = max(map(len, seqs))
        tokens = torch.zeros(len(seqs), width, dtype=torch.long)
        for b, seq in enumerate(seqs):
            tokens[b, : len(seq)] = torch.from_numpy(seq.astype(np.int64))
        rows_t = torch.tensor([b * width + t for b, t in rows])
        label_rows = np.array(label_rows)
        top_ids = self.to_kept[torch.from_numpy(c.top_ids[label_rows].astype(np.int64))]
        top_probs = torch.from_numpy(c.top_logprobs[label_rows].astype(np.float32)).exp()
        return Batch(tokens, rows_t, top_ids, top_probs)


def batch_loss(net: DraftNet, batch: Batch) -> tuple[torch.Tensor, dict]:
    """Soft cross-entropy -sum_x p(x) log q(x) over the target's kept top-K, averaged over positions."""
    h = net.hidden(batch.tokens).flatten(0, 1)[batch.rows]  # [N, D]
    logq = F.log_softmax(net.head(h).float(), -1)  # [N, V']
    valid = batch.top_ids >= 0
    picked = logq.gather(1, batch.top_ids.clamp_min(0))  # [N, K]
    loss = -(batch.top_probs * picked * valid).sum(-1).mean()
    with torch.no_grad():
        q = picked.exp() * valid
        greedy = (logq.argmax(-1) == batch.top_ids[:, 0]).float().mean()
        overlap = torch.minimum(batch.top_probs, q).sum(-1).mean()
    return loss, dict(loss=float(loss.detach()), greedy=float(greedy), overlap=float(overlap), positions=len(batch.rows))


@torch.no_grad()
def evaluate(net: DraftNet, batcher: Batcher, sequences: np.ndarray) -> dict:
    net.eval()
    totals, n = dict(loss=0.0, greedy=0.0, overlap=0.0), 0
    for group in batcher.batches(sequences, np.random.default_rng(0)):
        _, m = batch_loss(net, batcher.make(group))
        for k in totals:
            totals[k] += m[k] * m["positions"]
        n += m["positions"]
    net.train()
    return {k: v / max(n, 1) for k, v in totals.items()}


def train(net: DraftNet, corpus: Corpus, seconds: float, lr: float = 2e-3, tokens_per_batch: int = 8192,
          held_out: float = 0.03, seed: int = 0, log=print, eval_every: int = 100,
          max_steps: int | None = None) -> dict:
    """Train for about `seconds` or `max_steps` steps, whichever ends first (the cosine learning-rate
    schedule follows whichever is further along); return held-out metrics."""
    if seconds <= 0 or (max_steps is not None and max_steps < 1):
        raise ValueError("training needs a positive time budget and step count")
    rng = np.random.default_rng(seed)
    order = rng.permutation(corpus.num_sequences)
    n_held = max(1, int(round(held_out * corpus.num_sequences))) if corpus.num_sequences > 1 else 0
    held, train_seqs = order[:n_held], order[n_held:]
    if len(train_seqs) == 0:
        raise ValueError("the corpus is too small to train on: it has no sequences left after the held-out split")
    batcher = Batcher(corpus, net.kept_ids, net.cfg.vocab_size, tokens_per_batch)
    decay = [p for n, p in net.named_parameters() if p.dim() >= 2 and "embed." not in n]
    rest = [p for n, p in net.named_parameters() if not (p.dim() >= 2 and "embed." not in n)]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=0.01), dict(params=rest, weight_decay=0.0)],
                            lr=lr, betas=(0.9, 0.98))
    net.train()
    start, step, epoch, warmup = time.perf_counter(), 0, 0, 50
    before = evaluate(net, batcher, held) if len(held) else {}
    best = (float("inf"), 0, None)  # (held-out loss, step, weights)
    done = False
    while not done:
        epoch += 1
        for group in batcher.batches(train_seqs, rng):
            progress = max((time.perf_counter() - start) / seconds, step / max_steps if max_steps else 0.0)
            if progress >= 1:
                done = True
                break
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
            loss, m = batch_loss(net, batcher.make(group))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 20 == 0:
                log(f"train: step {step} epoch {epoch} {time.perf_counter() - start:.0f}s loss {m['loss']:.3f} "
                    f"greedy {m['greedy']:.3f} overlap {m['overlap']:.3f}")
            if len(held) and step % eval_every == 0:
                e = evaluate(net, batcher, held)
                log(f"held-out: step {step} loss {e['loss']:.3f} greedy {e['greedy']:.3f} overlap {e['overlap']:.3f}")
                if e["loss"] < best[0]:
                    best = (e["loss"], step, {k: v.clone() for k, v in net.state_dict().items()})
    net.eval()
    after = evaluate(net, batcher, held) if len(held) else {}
    best_step = step
    if best[2] is not None and best[0] < after["loss"]:  # the corpus is small: keep the best held-out weights
        net.load_state_dict(best[2])
        after, best_step = evaluate(net, batcher, held), best[1]
        log(f"kept the weights of step {best_step}, the best held-out loss")
    return dict(steps=step, epochs=epoch, seconds=time.perf_counter() - start, held_out_sequences=int(len(held)),
                held_out_before=before, held_out=after, kept_step=best_step)
