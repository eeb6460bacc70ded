"""`specdecode distill --eagle`: train a feature draft (`models.eagle`) for a native target.

1. **Data** (`generate_features`): the target answers built prompts (`distill.prompts`), every
   sequence greedy or at temperature 1 in turn, many at once through `forward_batch` (one ragged
   forward a step). Its cache keeps the final-norm features of every position it computes (and, for a
   draft that reads them, its residual stream after `layers`), so the features come with the
   answers: no second pass. A corpus kept without the layers a draft reads gets them teacher-forced
   (`refeature`: one forward a sequence, ~3x faster than generating it).
2. **Training** (`train_eagle`): for each pair (f_t, x_{t+1}) the draft predicts f_{t+1}; the loss is
   EAGLE's, a smooth-L1 regression onto f_{t+1} plus 0.1 x the cross-entropy of its head read-out
   against the target's own distribution there (over the kept tokens), and the same again for a
   second step drafted from the draft's own predicted features (training-time test, EAGLE-3), so
   the draft learns to continue from its own predictions, as it must when drafting.
3. **Learning curve**: at each evaluation, on held-out sequences, the training tokens seen, the
   first-step greedy agreement (the draft's argmax is the target's) and the expected acceptance at
   temperature 1, alpha = E[sum_x min(p, q)] (Leviathan et al. 2023, Definition 3.1), both over
   the target's whole vocabulary. The best weights by alpha are kept.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..drafters.eagle import head_rows
from ..models.base import ForwardCall
from ..models.eagle import EagleConfig, EagleNet, check_fits, load_eagle, save_eagle
from ..prompts import encode_prompt
from .prompts import TRANSLATED, passage_prompts, seed_prompts


@dataclass
class FeatureCorpus:
    """Concatenated sequences (prompt, then answer): sequence i is tokens[offsets[i]:offsets[i+1]],
    its answer from answer_starts[i]; features[j] the target's at token j (zero at each sequence's
    last token, which the target never read): its residual stream after each of `layers` layers, then
    its final-norm output (`NativeCache.keep_features`)."""

    tokens: np.ndarray  # [total] int32
    offsets: np.ndarray  # [S + 1] int64
    answer_starts: np.ndarray  # [S] int64
    features: np.ndarray  # [total, (len(layers) + 1) D] float16
    layers: tuple[int, ...] = ()

    @property
    def num_sequences(self) -> int:
        return len(self.answer_starts)

    @property
    def num_answer_tokens(self) -> int:
        return int((self.offsets[1:] - self.answer_starts).sum())

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, tokens=self.tokens, offsets=self.offsets, answer_starts=self.answer_starts,
                 features=self.features, layers=np.array(self.layers, dtype=np.int64))
        return path

    @classmethod
    def concat(cls, corpora: list[FeatureCorpus]) -> FeatureCorpus:
        """The sequences of every corpus, in order, as one."""
        if len(corpora) == 1:
            return corpora[0]
        if len({c.layers for c in corpora}) > 1:
            raise ValueError(f"the corpora keep the features of different layers: {[list(c.layers) for c in corpora]}")
        shifts = np.cumsum([0] + [len(c.tokens) for c in corpora[:-1]])
        offsets = [corpora[0].offsets[:1]] + [c.offsets[1:] + s for c, s in zip(corpora, shifts)]
        return cls(np.concatenate([c.tokens for c in corpora]), np.concatenate(offsets),
                   np.concatenate([c.answer_starts + s for c, s in zip(corpora, shifts)]),
                   np.concatenate([c.features for c in corpora]), corpora[0].layers)

    @classmethod
    def load(cls, path: str | Path) -> FeatureCorpus:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"feature corpus {str(path)!r} does not exist")
        with np.load(path) as f:
            missing = {"tokens", "offsets", "answer_starts", "features"} - set(f.files)
            if missing:
                raise ValueError(f"{str(path)!r} is not a feature corpus (it lacks {', '.join(sorted(missing))})")
            layers = tuple(int(n) for n in f["layers"]) if "layers" in f.files else ()
            return cls(f["tokens"], f["offsets"], f["answer_starts"], f["features"], layers)


@torch.no_grad()
def refeature(target, corpus: FeatureCorpus, layers: Sequence[int], log=print) -> FeatureCorpus:
    """The same sequences with the features of `layers` too, teacher-forced: one forward a sequence
    (about as fast as a prompt's prefill, against one step a token when answers are generated)."""
    layers, D = tuple(int(n) for n in layers), target.dim
    features = np.zeros((len(corpus.tokens), (len(layers) + 1) * D), dtype=np.float16)
    start = time.perf_counter()
    for i in range(corpus.num_sequences):
        a, b = int(corpus.offsets[i]), int(corpus.offsets[i + 1])
        cache = target.new_cache(b - a)
        cache.keep_features(D, layers)
        target.forward(torch.from_numpy(corpus.tokens[a : b - 1].astype(np.int64))[None], cache, num_logits=1,
                       prefill=False)  # decode numerics, as drafting reads them
        features[a : b - 1] = cache.features[: b - 1 - a].half().numpy()
        if (i + 1) % 200 == 0:
            log(f"refeature: {i + 1}/{corpus.num_sequences} sequences, {time.perf_counter() - start:.0f} s")
    return FeatureCorpus(corpus.tokens, corpus.offsets, corpus.answer_starts, features, layers)


class _Sequence:
    """One answer being generated, in its own cache."""

    def __init__(self, target, text: str, max_new_tokens: int, temperature: float, seed: int,
                 layers: tuple[int, ...] = ()) -> None:
        prompt = encode_prompt(target.tokenizer, text)
        self.text, self.prompt, self.tokens, self.temperature = text, prompt, list(prompt), temperature
        self.cache = target.new_cache(min(target.max_positions, len(prompt) + max_new_tokens + 1))
        self.cache.keep_features(target.dim, layers)
        self.generator = torch.Generator().manual_seed(seed)
        self.left = max_new_tokens

    def finish(self) -> _Sequence:
        """Keep the features (float16; zero at the last token, which the target never read), free the cache."""
        n = len(self.tokens)
        self.features = torch.zeros(n, self.cache.features.shape[1], dtype=torch.float16)
        self.features[: n - 1] = self.cache.features[: n - 1].half()
        self.cache = None
        return self

    def next_token(self, logits: torch.Tensor, eos: frozenset[int]) -> bool:
        """Append the token `logits` [V] give; whether the answer goes on."""
        if self.temperature == 0:
            token = int(logits.argmax())
        else:
            token = int(torch.multinomial(torch.softmax(logits / self.temperature, -1), 1, generator=self.generator))
        self.tokens.append(token)
        self.left -= 1
        return token not in eos and self.left > 0 and len(self.tokens) < self.cache.positions


def generate_features(target, seconds: float, concurrent: int = 16, max_new_tokens: int = 256, seed: int = 0,
                      log=print, max_sequences: int | None = None, layers: Sequence[int] = ()) -> FeatureCorpus:
    """The target's answers to built prompts, with its features (module docstring, step 1; those of
    `layers` too): about `seconds` of generation (or `max_sequences` answers begun), `concurrent`
    answers at a time."""
    layers = tuple(int(n) for n in layers)
    if seconds <= 0 or concurrent < 1 or max_new_tokens < 1:
        raise ValueError("the feature corpus needs a positive time budget, concurrency and answer length")
    start, eos = time.perf_counter(), frozenset(target.eos_token_ids)
    seeds = iter(seed_prompts(100_000, seed))
    passages: list[tuple[str, str]] = []
    done: list[_Sequence] = []
    active: list[_Sequence] = []
    begun = 0

    def begin() -> None:
        nonlocal begun
        if passages and begun % 2:  # half the prompts quote earlier answers, once there are some
            prompt = passage_prompts(passages, 1, seed + begun)[0]
        else:
            prompt = next(seeds)[1]
        seq = _Sequence(target, prompt, max_new_tokens, float(begun % 2), seed + begun, layers)
        begun += 1
        logits = target.forward(torch.tensor([seq.prompt]), seq.cache, num_logits=1)[0, -1]
        if seq.next_token(logits, eos):
            active.append(seq)
        else:
            done.append(seq.finish())

    def time_left() -> bool:
        return time.perf_counter() - start < seconds

    while True:
        while len(active) < concurrent and time_left() and (max_sequences is None or begun < max_sequences):
            begin()
        if not active:
            break
        if not time_left():  # the budget is spent: the answers begun are kept as far as they got
            done += [s.finish() for s in active]
            break
        calls = [ForwardCall(torch.tensor([[s.tokens[-1]]]), s.cache, num_logits=1) for s in active]
        still = []
        for s, logits in zip(active, target.forward_batch(calls)):
            if s.next_token(logits[0, -1], eos):
                still.append(s)
                continue
            done.append(s.finish())
            text = target.tokenizer.decode(s.tokens[len(s.prompt):], skip_special_tokens=True).strip()
            translated = TRANSLATED.match(s.text)
            if translated and len(text.split()) >= 5:  # to be translated back
                passages.append((f"foreign:{translated.group(1)}", text))
            elif not translated and len(text.split()) >= 40:
                passages.append(("answer", text))
        active = still
    total = sum(len(s.tokens) - len(s.prompt) for s in done)
    log(f"feature corpus: {len(done)} answers, {total} answer tokens in {time.perf_counter() - start:.0f} s")
    if not done:
        raise ValueError("no answer was generated: raise the time budget")
    tokens, offsets, starts, features = [], [0], [], []
    for s in done:
        n = len(s.tokens)
        starts.append(offsets[-1] + len(s.prompt))
        tokens.extend(s.tokens)
        offsets.append(offsets[-1] + n)
        features.append(s.features.numpy())
    return FeatureCorpus(np.array(tokens, dtype=np.int32), np.array(offsets, dtype=np.int64),
                         np.array(starts, dtype=np.int64), np.concatenate(features), layers)


def choose_kept(corpus: FeatureCorpus, size: int, always=()) -> torch.Tensor:
    """The `size` most frequent tokens of the answers, `always` (end-of-turn tokens) first, then by
    falling frequency: any prefix is the draft's head cut to fewer tokens (`FeatureDraft`'s
    `head_tokens`)."""
    answers = np.concatenate([corpus.tokens[a:b] for a, b in zip(corpus.answer_starts, corpus.offsets[1:])])
    counts = np.bincount(answers, minlength=int(corpus.tokens.max()) + 1).astype(np.float64)
    counts[[t for t in always if t < len(counts)]] = np.inf
    return torch.from_numpy(np.argsort(-counts, kind="stable")[:size]).long()


def _windows(corpus: FeatureCorpus, sequences: list[int], window: int) -> list[tuple[int, int]]:
    """(start, length) of every training window: pairs t = start .. start + length - 1 of a sequence, each
    with a target f_{t+1} (so t + 2 < the sequence's end)."""
    out = []
    for i in sequences:
        a, b = int(corpus.offsets[i]), int(corpus.offsets[i + 1])
        for s in range(a, b - 2, window):
            out.append((s, min(window, b - 2 - s)))
    return out


def _batches(windows: list[tuple[int, int]], budget: int, rng: np.random.Generator,
             pool: int = 64) -> list[list[tuple[int, int]]]:
    """An epoch's batches: the windows shuffled, then, a pool of `pool` batches' worth at a time,
    sorted by length and packed while the padded size (windows x the longest) stays within `budget`
    positions, so short windows are not padded to long ones; the batches in random order."""
    order = [windows[i] for i in rng.permutation(len(windows))]
    per_pool = max(1, pool * budget // max(1, max(n for _, n in windows)))
    out: list[list[tuple[int, int]]] = []
    for i in range(0, len(order), per_pool):
        batch: list[tuple[int, int]] = []
        for w in sorted(order[i : i + per_pool], key=lambda w: w[1]):
            if batch and (len(batch) + 1) * w[1] > budget:
                out.append(batch)
                batch = []
            batch.append(w)
        out.append(batch)
    return [out[i] for i in rng.permutation(len(out))]


class _Batches:
    """Windows as padded tensors: embeddings of x_{t+1}, the target's features at t (all it kept), its
    final-norm features f_{t+1}, positions, mask."""

    def __init__(self, target, corpus: FeatureCorpus) -> None:
        self.target, self.corpus = target, corpus
        self.seq_start = np.repeat(corpus.offsets[:-1], np.diff(corpus.offsets))  # token -> its sequence's start

    @torch.no_grad()
    def make(self, windows: list[tuple[int, int]]):
        B, W, D = len(windows), max(n for _, n in windows), self.target.dim
        ids = torch.zeros(B, W, dtype=torch.long)
        feats, nxt = torch.zeros(B, W, self.corpus.features.shape[1]), torch.zeros(B, W, D)
        pos, mask = torch.zeros(B, W, dtype=torch.long), torch.zeros(B, W, dtype=torch.bool)
        for r, (s, n) in enumerate(windows):
            ids[r, :n] = torch.from_numpy(self.corpus.tokens[s + 1 : s + 1 + n].astype(np.int64))
            f = torch.from_numpy(self.corpus.features[s : s + n + 1].astype(np.float32))
            feats[r, :n], nxt[r, :n] = f[:n], f[1:, -D:]
            pos[r, :n] = torch.arange(s - int(self.seq_start[s]), s - int(self.seq_start[s]) + n)
            mask[r, :n] = True
        embeds = self.target.embedding(ids.view(-1)).view(B, W, D).float()
        cos, sin = self.target.cos[pos].float(), self.target.sin[pos].float()  # [B, W, hd]
        return embeds, feats, nxt, cos, sin, mask


def _losses(net: EagleNet, head: torch.Tensor, batch, scale: float, steps: int = 2) -> torch.Tensor:
    """EAGLE's loss (module docstring) over `steps` drafting steps."""
    embeds, feats, nxt, cos, sin, mask = batch
    with torch.no_grad():
        p = torch.softmax(nxt[mask] @ head.T, -1)  # [M, N]: the target's distribution over the kept tokens
    first = net.fuse_features(feats)  # [B, W, D]
    total, inputs = 0.0, first
    for _ in range(steps):
        pred = net(embeds, inputs, cos, sin, scale)  # [B, W, D]
        reg = F.smooth_l1_loss(pred[mask], nxt[mask])
        cls = -(p * torch.log_softmax(pred[mask] @ head.T, -1)).sum(-1).mean()
        total = total + reg + 0.1 * cls
        inputs = torch.cat([first[:, :1], pred[:, :-1]], dim=1)  # position t drafted from the prediction of f_t
    return total / steps


@torch.no_grad()
def first_step_scores(pred: torch.Tensor, following: torch.Tensor, full_head: torch.Tensor, head: torch.Tensor,
                      kept: torch.Tensor) -> tuple[float, float]:
    """A draft's first step against the target, summed over M positions: how often its argmax over
    the kept tokens is the target's, and alpha = sum_x min(p, q) (Leviathan et al. 2023, Definition
    3.1) over the whole vocabulary. pred [M, D]: the draft's predicted features; following [M, D]:
    the target's own there; full_head [V, D]; head [N, D]: its rows `kept`."""
    p = torch.softmax(following @ full_head.T, -1)  # [M, V]
    q = torch.softmax(pred @ head.T, -1)  # [M, N]
    return float((kept[q.argmax(-1)] == p.argmax(-1)).sum()), float(torch.minimum(p[:, kept], q).sum())


@torch.no_grad()
def evaluate(net: EagleNet, batches: _Batches, windows, full_head: torch.Tensor, head: torch.Tensor,
             kept: torch.Tensor, window_batch: int = 16) -> dict:
    """First-step greedy agreement and alpha at temperature 1 (`first_step_scores`), on `windows`."""
    agree, alpha, n = 0.0, 0.0, 0
    net.eval()
    for i in range(0, len(windows), window_batch):
        embeds, feats, nxt, cos, sin, mask = batches.make(windows[i : i + window_batch])
        pred = net(embeds, net.fuse_features(feats), cos, sin, batches.target.attention_scale)[mask]
        a, b = first_step_scores(pred, nxt[mask], full_head, head, kept)
        agree, alpha, n = agree + a, alpha + b, n + int(mask.sum())
    net.train()
    return dict(greedy=agree / max(n, 1), alpha=alpha / max(n, 1), positions=n)


def train_eagle(target, corpus: FeatureCorpus, kept: torch.Tensor, seconds: float, hidden: int | None = None,
                lr: float = 1e-3, window: int = 256, window_batch: int = 16, seed: int = 0, log=print,
                max_steps: int | None = None, evaluations: int = 8, held_out: float = 0.03,
                init: EagleNet | None = None) -> tuple[EagleNet, dict]:
    """The feature draft trained on `corpus` for `seconds` (or `max_steps`), module docstring steps 2-3.
    A batch holds up to `window_batch` x `window` positions, padding included. `init`: a draft to go on
    training (its shapes and kept tokens are taken; `hidden` and `kept` are not)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    order = rng.permutation(corpus.num_sequences).tolist()
    n_held = max(1, int(held_out * len(order))) if len(order) > 1 else 0
    held, train = _windows(corpus, order[:n_held], window), _windows(corpus, order[n_held:], window)
    if not train:
        raise ValueError("the feature corpus has no sequence long enough to train on")
    if init is not None:
        if init.config.layers != corpus.layers:
            raise ValueError(f"the draft reads layers {list(init.config.layers)}, the corpus keeps "
                             f"{list(corpus.layers)}")
        net, kept = init.train(), init.kept_ids
    else:
        hidden = hidden or target.blocks[0]["gate_up"].out_features // 2
        net = EagleNet(EagleConfig(target.dim, target.heads, target.kv_heads, target.head_dim, hidden, target.eps,
                                   len(kept), target.name, corpus.layers))
        net.kept_ids.copy_(kept)
    full_head = head_rows(target, torch.arange(target.vocab_size))  # [V, D]
    head = full_head[kept]  # [N, D]
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    batches = _Batches(target, corpus)
    pairs = sum(n for _, n in train)
    log(f"eagle: {sum(p.numel() for p in net.parameters()) / 1e6:.1f}M parameters; {pairs} training pairs in "
        f"{len(train)} windows, {sum(n for _, n in held)} held out; {len(kept)} kept tokens")
    start, step, seen, curve = time.perf_counter(), 0, 0, []
    best, best_state = -1.0, None
    budget, epoch = window_batch * window, []
    total_steps = max_steps or 10**9
    next_eval = 0.0
    while True:
        elapsed = time.perf_counter() - start
        finished = elapsed >= seconds or step >= total_steps
        if held and (finished or elapsed >= next_eval):
            record = dict(step=step, tokens=seen, seconds=round(elapsed),
                          **evaluate(net, batches, held, full_head, head, kept))
            curve.append(record)
            log(f"eagle: step {step}, {seen} training tokens, {elapsed:.0f} s: held-out greedy agreement "
                f"{record['greedy']:.3f}, alpha {record['alpha']:.3f}")
            if record["alpha"] > best:
                best, best_state = record["alpha"], {k: v.clone() for k, v in net.state_dict().items()}
            next_eval = elapsed + seconds / evaluations
        if finished:
            break
        if not epoch:
            epoch = _batches(train, budget, rng)
        chunk = epoch.pop()
        # cosine decay over the time budget, after a short warm-up
        frac = min(1.0, elapsed / seconds if max_steps is None else step / max_steps)
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * frac))
        loss = _losses(net, head, batches.make(chunk), target.attention_scale)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        step += 1
        seen += sum(n for _, n in chunk)
        if step % 20 == 0:
            log(f"eagle: step {step}, loss {loss.item():.4f}, {time.perf_counter() - start:.0f} s")
    if best_state is not None:
        net.load_state_dict(best_state)
    return net.eval(), dict(steps=step, training_tokens=seen, curve=curve, best_alpha=best)


def distill_eagle(target, out: str | Path, corpus_path: str | Path, data_seconds: float, train_seconds: float,
                  kept: int = 2048, hidden: int | None = None, lr: float = 1e-3, seed: int = 0, log=print,
                  concurrent: int = 16, max_new_tokens: int = 256, max_sequences: int | None = None,
                  max_steps: int | None = None, init: str | Path | None = None,
                  also: Sequence[str | Path] = (), layers: Sequence[int] = ()) -> Path:
    """Generate (or reuse, where `corpus_path` exists) the feature corpus, train on it and the corpora
    `also`, starting from the draft at `init` if given (its first `kept` tokens kept), save to `out`.
    `layers`: the target layers whose outputs the draft fuses with the final-norm features (EAGLE-3);
    a corpus that lacks them gets them teacher-forced (`refeature`), kept beside it for next time."""
    start = time.perf_counter()
    corpus_path, layers = Path(corpus_path), tuple(int(n) for n in layers)
    if any(not 0 < n < len(target.blocks) for n in layers) or list(layers) != sorted(set(layers)):
        raise ValueError(f"--feature-layers takes rising layer counts between 1 and {len(target.blocks) - 1} "
                         f"({target.name} has {len(target.blocks)} layers), not {list(layers)}")
    if init is not None:
        net = _resumable(load_eagle(init)[0], target, kept, layers)
        log(f"eagle: going on from the draft at {init} ({net.config.kept} kept tokens)")
    more = [_load_corpus(path, target, layers, log) for path in also]
    if corpus_path.is_file():
        corpus = _load_corpus(corpus_path, target, layers, log)
        log(f"reusing the feature corpus {corpus_path} ({corpus.num_sequences} sequences); delete it to generate "
            "a new one")
    else:
        corpus = generate_features(target, data_seconds, concurrent, max_new_tokens, seed, log, max_sequences,
                                   layers)
        corpus.save(corpus_path)
        log(f"feature corpus written to {corpus_path}")
    corpus = FeatureCorpus.concat([corpus, *more])
    kept_ids = None if init is not None else choose_kept(corpus, min(kept, target.vocab_size),
                                                         always=target.eos_token_ids)
    net, record = train_eagle(target, corpus, kept_ids, train_seconds, hidden, lr, seed=seed, log=log,
                              max_steps=max_steps, init=net if init is not None else None)
    meta = dict(target=target.name, sequences=corpus.num_sequences, answer_tokens=corpus.num_answer_tokens,
                corpus_tokens=len(corpus.tokens), seconds=round(time.perf_counter() - start), lr=lr, seed=seed,
                init=None if init is None else str(init), **record)
    path = save_eagle(out, net, meta)
    log(f"eagle: written to {path} in {time.perf_counter() - start:.0f} s (best held-out alpha "
        f"{record['best_alpha']:.3f})")
    return path


def _load_corpus(path: str | Path, target, layers: tuple[int, ...] = (), log=print) -> FeatureCorpus:
    """The corpus at `path` with the features of `layers`: read, or, where it keeps others, its copy
    with them beside it (made teacher-forced the first time)."""
    path = Path(path)
    corpus = FeatureCorpus.load(path)
    if corpus.features.shape[1] != (len(corpus.layers) + 1) * target.dim or max(corpus.layers, default=0) >= len(
            target.blocks) or int(corpus.tokens.max()) >= target.vocab_size:
        raise ValueError(f"the feature corpus {path} holds {corpus.features.shape[1]}-wide features of layers "
                         f"{list(corpus.layers)}, not {target.name}'s (dim {target.dim}, {len(target.blocks)} layers, "
                         f"{target.vocab_size} tokens): it was made for another model")
    if corpus.layers == layers:
        return corpus
    twin = path.with_name(path.name.removesuffix(".npz") + "".join(f".{n}" for n in ("layers", *layers)) + ".npz")
    if twin.is_file():
        log(f"reusing {twin}: {path}'s sequences with the features of layers {list(layers)}")
        return _load_corpus(twin, target, layers, log)
    log(f"refeature: {path}'s {corpus.num_sequences} sequences, teacher-forced, for the features of layers "
        f"{list(layers)}")
    corpus = refeature(target, corpus, layers, log)
    corpus.save(twin)
    log(f"refeature: written to {twin}")
    return corpus


def _resumable(net: EagleNet, target, kept: int, layers: tuple[int, ...] = ()) -> EagleNet:
    """A saved draft checked against `target`, its head cut to its first (most frequent) `kept` tokens,
    reading the features of `layers`: a draft that read none gets them, its fuse starting as the
    final-norm features alone (so the grown draft starts as the saved one)."""
    check_fits(net, target, "the draft to go on from")
    c = net.config
    if c.layers and c.layers != layers:
        raise ValueError(f"the draft to go on from reads the features of layers {list(c.layers)}, not {list(layers)}")
    if kept >= c.kept and c.layers == layers:
        return net
    grown = EagleNet(replace(c, kept=min(kept, c.kept), layers=layers))
    state = {**grown.state_dict(), **net.state_dict()}
    state["kept_ids"] = state["kept_ids"][:kept]
    grown.load_state_dict(state)
    return grown
