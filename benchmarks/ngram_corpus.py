"""The target's own greedy answers to Spec-Bench prompts that the recorded Spec-Bench runs do not
use, as a corpus for `specdecode ngram fit` (a draft fitted on what the target writes, never on the
prompts it is then measured on).

    python benchmarks/ngram_corpus.py --skip 3 --out /tmp/answers.jsonl
    specdecode ngram fit --corpus /tmp/answers.jsonl --order 3 --out /tmp/answers.3gram.npz
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

from specdecode.batch import generate_batch
from specdecode.bench.prompts import load_prompts
from specdecode.models.load import load_model
from specdecode.sampling import SamplingParams
from specdecode.prompts import encode_prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--skip", type=int, default=3, help="leave out the first N prompts of each category "
                        "(the ones `bench --per-category N` measures)")
    parser.add_argument("--per-category", type=int, default=20, help="answer at most this many of each category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", required=True, help="jsonl file, one {'text': answer} a line")
    args = parser.parse_args()

    target = load_model(backend="native")
    seen, kept = defaultdict(int), []
    for prompt in load_prompts(args.prompts):
        seen[prompt.category] += 1
        if args.skip < seen[prompt.category] <= args.skip + args.per_category:
            kept.append(prompt)
    start = time.perf_counter()
    requests = generate_batch(target, [encode_prompt(target.tokenizer, p.text) for p in kept], max_batch=16,
                              params=SamplingParams(temperature=0), max_new_tokens=args.max_new_tokens)
    with open(args.out, "w", encoding="utf-8") as f:
        for request in requests:
            f.write(json.dumps({"text": request.text}) + "\n")
    tokens = sum(r.stats.new_tokens for r in requests)
    print(f"{len(kept)} answers, {tokens} tokens in {time.perf_counter() - start:.0f} s; written to {args.out}")


if __name__ == "__main__":
    main()
