"""The commands that make a drafter for a target: `ngram fit` (counts from a corpus) and `distill`
(a small network trained on the target's own generations)."""

from __future__ import annotations

import argparse
import os

from ..checks import check_positive_settings
from .loading import use_kernels


def cmd_ngram(args: argparse.Namespace) -> int:
    """`specdecode ngram fit`: count k-grams of a corpus in the target's tokens; an .npz an NgramDrafter loads."""
    from ..bench.prompts import load_prompts
    from ..drafters.ngram import NgramDrafter
    from ..models.load import load_model

    check_positive_settings(args, "order")
    target = load_model(args.target, args.backend, args.dtype, args.device, args.threads)
    if args.corpus.endswith(".npz"):  # a distillation corpus: the target's own answers, already tokens
        from ..distill.data import Corpus

        corpus = Corpus.load(args.corpus)
        sequences = [corpus.answer(i).tolist() for i in range(corpus.num_sequences)]
    else:
        documents = load_prompts(args.corpus)
        sequences = [target.tokenizer.encode(d.text, add_special_tokens=False) for d in documents]
    drafter = NgramDrafter(target.vocab, order=args.order).fit(sequences)
    path = drafter.save(args.out)
    contexts = sum(len(table) for table in drafter.counts)
    print(f"fitted a {args.order}-gram on {sum(map(len, sequences))} tokens from {len(sequences)} documents "
          f"({contexts} contexts); written to {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    """`specdecode distill`: generate a corpus with the target (or reuse one), then train a draft network on it."""
    from ..distill.run import distill
    from ..models.hf import HFModel
    from ..models.load import load_model

    check_positive_settings(args, "layers", "dim", "heads", "embed_dim", "window", "batch_tokens", "gen_batch",
                           "answer_tokens")
    if args.data_minutes <= 0 or args.train_minutes <= 0:
        raise ValueError("--data-minutes and --train-minutes must be positive")
    check_positive_settings(args, "data_batches", "train_steps", "kept", "mlp_dim")  # each where given
    if args.lr is not None and args.lr <= 0:
        raise ValueError(f"--lr must be positive, got {args.lr}")
    out = os.path.abspath(args.out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ValueError(f"--out {args.out!r} exists and is not an empty directory; nothing was overwritten")
    if args.eagle:
        return _distill_eagle(args, out)
    if args.init or args.also or args.feature_layers:
        raise ValueError("--init, --also and --feature-layers train a feature draft: they need --eagle")
    backend = "hf" if args.backend == "auto" else args.backend
    if backend != "hf":
        raise ValueError("distill generates its corpus on the transformers backend; use --backend hf")
    use_kernels(args.kernels)
    target = load_model(args.target, backend, args.dtype, args.device, args.threads)
    if not isinstance(target, HFModel):
        raise ValueError("distill needs a transformers target")
    config = dict(layers=args.layers, dim=args.dim, heads=args.heads, mlp_dim=args.mlp_dim or 768,
                  embed_dim=args.embed_dim, kept=args.kept or 12288, window=args.window)
    distill(target, out, args.corpus or out.rstrip("/") + ".corpus.npz", args.data_minutes * 60,
            args.train_minutes * 60, config, lr=args.lr or 2e-3, tokens_per_batch=args.batch_tokens, seed=args.seed,
            batch_size=args.gen_batch, max_new_tokens=args.answer_tokens, log=lambda m: print(m, flush=True),
            max_batches=args.data_batches, max_steps=args.train_steps)
    return 0


def _distill_eagle(args: argparse.Namespace, out: str) -> int:
    """`specdecode distill --eagle`: the feature corpus from the native target (or reused), then the feature draft."""
    from ..distill.eagle import distill_eagle
    from ..models.load import load_model
    from ..models.native.model import NativeLlama

    if args.backend not in ("auto", "native"):
        raise ValueError("distill --eagle runs the target on the native backend; use --backend native (or auto)")
    use_kernels(args.kernels)
    target = load_model(args.target, "native", args.dtype, args.device, args.threads, choose_by_speed=False)
    if not isinstance(target, NativeLlama) or target.c_layers is None:
        raise ValueError(f"distill --eagle needs the native C kernels with float32 activations for {target.name} "
                         "(--dtype auto or w4a8)")
    distill_eagle(target, out, args.corpus or out.rstrip("/") + ".features.npz", args.data_minutes * 60,
                  args.train_minutes * 60, kept=args.kept or 2048, hidden=args.mlp_dim, lr=args.lr or 1e-3,
                  seed=args.seed, log=lambda m: print(m, flush=True), max_new_tokens=args.answer_tokens,
                  max_sequences=args.data_batches, max_steps=args.train_steps, init=args.init, also=args.also,
                  layers=args.feature_layers)
    return 0
