"""`specdecode distill`: corpus -> kept vocabulary -> DraftNet -> trained draft directory."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..models.draftnet import DraftNet, DraftNetConfig, init_embedding_from, param_count, save_draftnet
from .data import Corpus, build_corpus
from .train import choose_kept_ids, kept_coverage, train


def distill(target, out: str | Path, corpus_path: str | Path, data_seconds: float, train_seconds: float,
            config: dict, lr: float = 2e-3, tokens_per_batch: int = 8192, seed: int = 0, batch_size: int = 32,
            max_new_tokens: int = 256, log=print, max_batches: int | None = None,
            max_steps: int | None = None) -> Path:
    """Train a draft for `target` (a transformers-backend model) and save it to `out`.

    The corpus is generated (about `data_seconds`, or `max_batches` generation batches) and saved to
    `corpus_path`, or reused from there when the file exists; training runs for `train_seconds` or
    `max_steps` steps, whichever ends first.
    """
    start = time.perf_counter()
    corpus_path = Path(corpus_path)
    if corpus_path.is_file():
        corpus = Corpus.load(corpus_path)
        log(f"reusing the corpus {corpus_path} ({corpus.num_sequences} sequences, {corpus.num_answer_tokens} "
            "answer tokens); delete it to generate a new one")
        data_seconds_used = 0.0
    else:
        corpus = build_corpus(target, data_seconds, batch_size, max_new_tokens, seed=seed, log=log,
                              max_batches=max_batches)
        corpus.save(corpus_path)
        data_seconds_used = time.perf_counter() - start
        log(f"corpus written to {corpus_path}")
    torch.manual_seed(seed)
    config = dict(config)  # the caller's dict stays as it was
    kept = choose_kept_ids(corpus, min(config.pop("kept"), target.vocab.size), always=target.eos_token_ids)
    coverage = kept_coverage(corpus, kept)
    log(f"kept vocabulary: {len(kept)} tokens cover {coverage:.2%} of the target's answer tokens")
    cfg = DraftNetConfig(vocab_size=target.vocab.size, kept=len(kept), **config)
    net = DraftNet(cfg)
    net.kept_ids.copy_(kept)
    init_embedding_from(net, target.model.get_input_embeddings().weight.detach())
    log(f"draft network: {param_count(net) / 1e6:.1f}M parameters, {cfg}")
    result = train(net, corpus, train_seconds, lr=lr, tokens_per_batch=tokens_per_batch, seed=seed, log=log,
                   max_steps=max_steps)
    meta = dict(target=target.name, corpus_sequences=corpus.num_sequences, corpus_answer_tokens=corpus.num_answer_tokens,
                kept_coverage=coverage, data_seconds=round(data_seconds_used), lr=lr, tokens_per_batch=tokens_per_batch,
                seed=seed, **result)
    path = save_draftnet(out, net, target.tokenizer, target.vocab, target.eos_token_ids, meta)
    held = result["held_out"]
    log(f"held-out: greedy agreement {held.get('greedy', float('nan')):.3f}, top-K overlap (alpha at temperature "
        f"1, lower bound) {held.get('overlap', float('nan')):.3f}; written to {path} "
        f"({sum(f.stat().st_size for f in path.iterdir()) / 1e6:.1f} MB) in {time.perf_counter() - start:.0f} s")
    return path
