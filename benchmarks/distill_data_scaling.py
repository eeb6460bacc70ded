"""How the trained draft's quality grows with its distillation data: the shipped draft's recipe
(same shape, same output vocabulary, same optimiser) trained on a random fraction of the corpus it
was trained on, then scored on the shipped run's held-out sequences beside the shipped draft.

    python benchmarks/distill_data_scaling.py --corpus CORPUS.npz --fraction 0.25 --minutes 12 --out q25
    python benchmarks/drafter_alpha.py --ngram bigram.npz --draft q25 --per-task 2

(the second command gives the Spec-Bench alpha of the result; run it on the shipped draft too).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from specdecode.distill.data import Corpus
from specdecode.distill.train import Batcher, evaluate, train
from specdecode.models.default import load_default_target, trained_draft_path
from specdecode.models.draftnet import DraftNet, DraftNetConfig, init_embedding_from, load_draftnet, save_draftnet


def subset(corpus: Corpus, keep: np.ndarray) -> Corpus:
    """The sequences `keep` of `corpus`, with their soft labels (stored in sequence order)."""
    answer_lengths = corpus.offsets[1:] - corpus.answer_starts  # [S]
    first = np.concatenate([[0], np.cumsum(answer_lengths)])  # soft-label row of each answer's start
    parts = []
    for i in keep:
        start, end = corpus.offsets[i], corpus.offsets[i + 1]
        parts.append(Corpus(corpus.sequence(i).astype(np.int32), np.array([0, end - start]),
                            np.array([corpus.answer_starts[i] - start]),
                            corpus.top_ids[first[i] : first[i + 1]], corpus.top_logprobs[first[i] : first[i + 1]]))
    return Corpus.concat(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True, help="the corpus the shipped draft was trained on")
    ap.add_argument("--fraction", type=float, required=True)
    ap.add_argument("--minutes", type=float, required=True, help="training time budget")
    ap.add_argument("--out", required=True, help="directory for the trained draft")
    args = ap.parse_args()

    full = Corpus.load(args.corpus)
    order = np.random.default_rng(0).permutation(full.num_sequences)  # as train(seed=0) split it for the shipped run
    n_held = int(round(0.03 * full.num_sequences))
    held, rest = order[:n_held], order[n_held:]
    keep = np.sort(np.random.default_rng(1).permutation(rest)[: int(len(rest) * args.fraction)])
    part = subset(full, keep)
    print(f"fraction {args.fraction}: {part.num_sequences} sequences, {part.num_answer_tokens} answer tokens", flush=True)

    shipped = load_draftnet(trained_draft_path()).net.float()
    target = load_default_target("bfloat16")
    torch.manual_seed(0)
    net = DraftNet(DraftNetConfig(**vars(shipped.cfg)))
    net.kept_ids.copy_(shipped.kept_ids)
    init_embedding_from(net, target.model.get_input_embeddings().weight.detach())
    result = train(net, part, args.minutes * 60, lr=2e-3, tokens_per_batch=8192, seed=0, log=lambda line: None)
    batcher = Batcher(full, net.kept_ids, net.cfg.vocab_size, 8192)
    print(json.dumps(dict(fraction=args.fraction, answer_tokens=int(part.num_answer_tokens), steps=result["steps"],
                          epochs=result["epochs"], kept_step=result["kept_step"], held_out=evaluate(net, batcher, held),
                          shipped_held_out=evaluate(shipped, batcher, held))), flush=True)
    save_draftnet(args.out, net, target.tokenizer, target.vocab, target.eos_token_ids, dict(fraction=args.fraction))


if __name__ == "__main__":
    main()
