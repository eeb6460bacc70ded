"""Benchmark runs: every method on every prompt, interleaved, so machine noise hits them alike.

Speedups are always against the autoregressive baseline measured in the same run, on the same
prompts. Anchors a user would otherwise pick (transformers' own `generate()`: plain, with
`prompt_lookup_num_tokens`, with `assistant_model`) run on the same loaded model.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch

from ..stats import Stats
from ..prompts import encode_prompt
from ..text import generate
from ..sampling import SamplingParams
from .prompts import Prompt


@dataclass(frozen=True)
class Method:
    name: str  # "baseline", "lookup", "draft", "ngram", "hf", "hf-lookup", "hf-assisted", "llama.cpp", "llama.cpp-lookup"
    gamma: int | str | None = None  # a fixed draft length, "auto" (adaptive), or None

    @property
    def label(self) -> str:
        return self.name if self.gamma is None else f"{self.name} g={self.gamma}"


@dataclass
class Run:
    prompt_id: str
    category: str
    task: str
    method: str
    gamma: int | str | None
    temperature: float
    prompt_tokens: int
    new_tokens: int
    wall_seconds: float
    target_calls: int | None = None
    drafts: int | None = None  # calls that verified a proposal
    proposed: int | None = None
    accepted: int | None = None
    beta_sum: float | None = None
    beta_count: int | None = None
    draft_seconds: float | None = None
    target_seconds: float | None = None
    prefill_seconds: float | None = None  # until the first token (the prompt's forward)
    forecast_tokens: float | None = None  # the cost model's expectations (Stats.forecast_*)
    forecast_steps: float | None = None
    identical: bool | None = None  # greedy only: same tokens as the baseline
    tokens: list[int] = field(default_factory=list, repr=False)
    timeline: list[tuple[float, float, int, int]] | None = field(default=None, repr=False)  # (draft s, target s, proposed, emitted)


def hf_generate(target, ids: list[int], params: SamplingParams, max_new_tokens: int, seed: int,
                assistant=None, prompt_lookup: int | None = None) -> list[int]:
    """transformers' generate() on the same model, with the same sampling distribution."""
    model = target.model
    kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=sorted(target.eos_token_ids),
                  pad_token_id=sorted(target.eos_token_ids)[0])
    if params.is_greedy:
        kwargs.update(do_sample=False)
    else:  # transformers defaults to top_k=50: pass every setting explicitly
        kwargs.update(do_sample=True, temperature=params.temperature, top_k=params.top_k or None, top_p=params.top_p)
    if prompt_lookup:
        kwargs.update(prompt_lookup_num_tokens=prompt_lookup)
    if assistant is not None:
        kwargs.update(assistant_model=assistant.model)
    torch.manual_seed(seed)
    input_ids = torch.tensor([ids], device=target.device)
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    return out[0, len(ids):].tolist()


def llamacpp_generate(target, ids: list[int], params: SamplingParams, max_new_tokens: int, seed: int,
                     prompt_lookup: int | None = None, contexts: dict | None = None) -> list[int]:
    """llama-cpp-python's own generate() on the same GGUF, plain or with its prompt-lookup
    decoding (LlamaPromptLookupDecoding), sampling from the same distribution. It opens a context of
    its own (the model under test keeps its cache), kept in `contexts` for the next call."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from ..models.llamacpp import open_llama

    anchors = contexts if contexts is not None else {}
    if prompt_lookup not in anchors:  # its own context, so the model under test keeps its cache
        draft = LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup) if prompt_lookup else None
        anchors[prompt_lookup] = open_llama(target.path, n_ctx=target.max_positions, n_batch=target.n_batch,
                                       n_threads=target.n_threads, n_threads_batch=target.n_threads,
                                       draft_model=draft, logits_all=draft is not None, verbose=False,
                                       **target.context_options)  # the same numerics as the model under test
        # (llama-cpp-python sizes its logits buffer from logits_all, not from draft_model: pass both)
    llm = anchors[prompt_lookup]
    llm.reset()  # generate() would otherwise reuse the KV cache of a previous run on the same prompt
    llm.set_seed(seed)
    sampling = dict(temp=0.0) if params.is_greedy else dict(temp=params.temperature, top_k=params.top_k,
                                                              top_p=params.top_p)
    out = []
    for token in llm.generate(ids, min_p=0.0, typical_p=1.0, repeat_penalty=1.0, reset=True,
                              **{"top_k": 0, "top_p": 1.0, **sampling}):
        out.append(token)
        if token in target.eos_token_ids or len(out) >= max_new_tokens:
            break
    return out


def run_one(target, prompt: Prompt, ids: list[int], method: Method, params: SamplingParams, max_new_tokens: int,
            seed: int, suite, keep_timeline: bool = False, gamma_policy=None) -> Run:
    """One generation of `method` (see `suite.Suite`: its drafter factory or anchor model).
    `gamma_policy` turns a method's gamma into what the decode loop takes ("auto": a fresh
    adaptive policy); by default the loop's own `as_policy`."""
    base = dict(prompt_id=prompt.id, category=prompt.category, task=prompt.task, method=method.name,
                gamma=method.gamma, temperature=params.temperature, prompt_tokens=len(ids))
    if method.name.startswith(("hf", "llama.cpp")):
        start = time.perf_counter()
        if method.name.startswith("hf"):
            tokens = hf_generate(suite.anchors.get("hf", target), ids, params, max_new_tokens, seed,
                                 assistant=suite.anchors.get("assistant") if method.name == "hf-assisted" else None,
                                 prompt_lookup=method.gamma if method.name == "hf-lookup" else None)
        else:
            tokens = llamacpp_generate(suite.anchors.get("llama.cpp", target), ids, params, max_new_tokens, seed,
                                       prompt_lookup=method.gamma if method.name == "llama.cpp-lookup" else None,
                                       contexts=suite.contexts)
        wall = time.perf_counter() - start
        return Run(**base, new_tokens=len(tokens), wall_seconds=wall, tokens=tokens)
    drafter = suite.drafters[method.name]()
    stats = Stats()
    timeline = []
    gamma = method.gamma if method.gamma is not None else 0
    gamma = gamma_policy(gamma) if gamma_policy and method.gamma is not None else gamma
    for piece in generate(target, ids, drafter, gamma=gamma, params=params,
                          max_new_tokens=max_new_tokens, seed=seed, stats=stats):
        if keep_timeline:
            s = piece.step
            timeline.append((s.draft_seconds, s.target_seconds, len(s.proposed), len(s.tokens)))
    return Run(**base, new_tokens=stats.new_tokens, wall_seconds=stats.wall_seconds, target_calls=stats.target_calls,
               drafts=stats.drafts, proposed=stats.proposed, accepted=stats.accepted, beta_sum=stats.beta_sum,
               beta_count=stats.beta_count, draft_seconds=stats.draft_seconds, target_seconds=stats.target_seconds,
               prefill_seconds=stats.prefill_seconds, forecast_tokens=stats.forecast_tokens,
               forecast_steps=stats.forecast_steps, tokens=stats.tokens, timeline=timeline if keep_timeline else None)


def run_benchmark(target, prompts: Sequence[Prompt], suite, temperatures: Sequence[float], max_new_tokens: int,
                  seed: int = 0, chat: bool = True, on_run: Callable[[Run], None] | None = None,
                  gamma_policy=None) -> list[Run]:
    """Every method of the suite on every prompt and temperature, interleaved per prompt; the
    baseline first for each (prompt, temperature), and greedy runs marked identical to it or not."""
    runs = []
    for prompt in prompts:
        ids = encode_prompt(target.tokenizer, prompt.text, chat=chat)
        for temperature in temperatures:
            params = SamplingParams(temperature=temperature)
            baseline_tokens = None
            for method in suite.methods:
                run = run_one(target, prompt, ids, method, params, max_new_tokens, seed, suite,
                              keep_timeline=(prompt is prompts[0] and temperature == temperatures[0]),
                              gamma_policy=gamma_policy)
                if method.name == "baseline":
                    baseline_tokens = run.tokens
                if params.is_greedy:
                    run.identical = run.tokens == baseline_tokens
                runs.append(run)
                if on_run:
                    on_run(run)
    return runs


def run_record(run: Run) -> dict:
    record = asdict(run)
    record.pop("tokens")
    record.pop("timeline")
    return record
