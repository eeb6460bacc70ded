"""`specdecode`'s argument parser: every command and option, their defaults and help (after
parsing, `checks.check_positive_settings` checks that integer options are positive)."""

from __future__ import annotations

import argparse

from .. import defaults
from ..drafters.spec import help_text


def gamma_arg(value: str):
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {value!r}") from None


def _model_options(with_draft: bool = True) -> argparse.ArgumentParser:
    from ..models.native.plan import PATHS  # imports torch: only when a parser is built

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", help="target model: a .gguf file or a transformers directory "
                        "(default: the embedded SmolLM2-135M-Instruct)")
    if with_draft:
        common.add_argument("--draft", default=defaults.DRAFT, metavar="SPEC",
                            help=f"the drafter (default: {defaults.DRAFT}). {help_text()}")
    common.add_argument("--backend", default="auto", choices=["auto", "hf", "llama.cpp", "native"],
                        help="native: specdecode's own PyTorch Llama (static KV cache, 4-bit or bf16 products, "
                             "C kernels); hf: transformers; llama.cpp: llama-cpp-python on a .gguf file; auto "
                             "(default): native for a Llama-family model on the CPU, else hf")
    if with_draft:
        common.add_argument("--draft-backend", default=None, choices=["auto", "hf", "llama.cpp", "native"],
                            help="backend of the draft model (default: the target's)")
        common.add_argument("--min-draft-confidence", type=float, default=0.0,
                            help="a draft model stops proposing when its top probability falls below this "
                                 "(default 0: always propose gamma tokens)")
    common.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's setting)")
    common.add_argument("-c", "--ctx-size", type=int, default=defaults.CONTEXT,
                        help=f"positions the target's cache holds: prompt and output together (default "
                             f"{defaults.CONTEXT}, or the model's own window where smaller; llama-server's -c)")
    common.add_argument("--kernels", default=None, choices=["auto", *PATHS],
                        help="the native backend's kernel path (default: $SPECDECODE_KERNELS, else the best this "
                             "CPU runs; `specdecode info` shows the plan)")
    common.add_argument("--dtype", default="auto",
                        help="auto (default: on the native backend 4-bit products where the weights are 4-bit "
                             "groups, as a Q4_1 GGUF's are, with 8-bit activations (w4a8) where the CPU has vector "
                             "integer dot products, else bfloat16), int4 or w4a8 (native only), bfloat16 or float32")
    common.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    return common


def _sampling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = all)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = all)")
    parser.add_argument("--min-p", type=float, default=0.0,
                        help="drop tokens below this share of the best token's probability (0 = none)")
    parser.add_argument("--presence-penalty", type=float, default=0.0,
                        help="OpenAI's: lower a token that is already in the output by this, in [-2, 2]")
    parser.add_argument("--frequency-penalty", type=float, default=0.0,
                        help="OpenAI's: lower a token by this times how often it is already in the output, in [-2, 2]")
    repetition = parser.add_mutually_exclusive_group()
    repetition.add_argument("--repetition-penalty", type=float, default=1.0,
                            help="vLLM's: a token already in the prompt or the output has its logit divided by this "
                                 "(multiplied where negative); 1 = none")
    repetition.add_argument("--repeat-penalty", type=float, default=None,
                            help="llama.cpp's: the same, over the last --repeat-last-n tokens of prompt and output")
    parser.add_argument("--repeat-last-n", type=int, default=None,
                        help=f"the tokens the repetition penalty reads: the last N (-1 = all; default {defaults.REPEAT_LAST_N} "
                             "under --repeat-penalty, all under --repetition-penalty)")
    parser.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS", type=_bias,
                        help="add BIAS in [-100, 100] to token ID's logit (repeatable)")


def _bias(value: str) -> tuple[int, float]:
    token, _, bias = value.partition("=")
    try:
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID=BIAS, e.g. 42=-100, got {value!r}") from None


def _prompt_options(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--prompts", required=required, default=None,
                        help="prompt file: Spec-Bench jsonl (first turn), jsonl with 'prompt', or text lines")
    parser.add_argument("--categories", nargs="+", default=None, help="categories or Spec-Bench tasks to keep")
    parser.add_argument("--per-category", type=int, default=None, help="at most this many prompts per category")


class _Help(argparse.HelpFormatter):
    """Every option's help says its default, unless the help text already does or there is none to say."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or not action.option_strings or action.default in (None, False, [], argparse.SUPPRESS)
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return text
        return f"{text} (default: %(default)s)".lstrip()


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("specdecode")
    except PackageNotFoundError:  # run from a source tree that was never installed
        release = "unknown"
    parser = argparse.ArgumentParser(prog="specdecode", description="Lossless speculative decoding.",
                                     formatter_class=_Help)
    parser.add_argument("--version", action="version", version=f"specdecode {release}")
    commands = parser.add_subparsers(dest="command", required=True)
    _add = commands.add_parser
    commands.add_parser = lambda *a, **k: _add(*a, formatter_class=_Help, **k)  # every command's help says defaults

    gen = commands.add_parser("generate", parents=[_model_options()], help="generate text, speculatively by default")
    gen.add_argument("prompt", help="the user message (the target's chat template is applied unless --raw)")
    gen.add_argument("--gamma", type=gamma_arg, default="auto",
                     help="draft tokens per target call, or 'auto' (default): chosen per call from the measured "
                          "verification cost and the running acceptance rate, 0 where speculation would not pay")
    gen.add_argument("--max-gamma", type=int, default=defaults.MAX_GAMMA, help="upper bound for --gamma auto")
    _sampling_options(gen)
    gen.add_argument("--lenience", type=float, default=1.0,
                     help="lenient acceptance in (0, 1]; 1 = exact (the target's distribution)")
    gen.add_argument("--seed", type=int, default=None, help="make sampling reproducible (default: a fresh seed)")
    gen.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--baseline", action="store_true", help="plain autoregressive decoding, no draft")
    shape = gen.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE", default=None,
                       help="the answer is JSON valid against the JSON Schema in FILE ('-' for any JSON object)")
    shape.add_argument("--grammar", metavar="FILE", default=None, help="the answer follows the Lark grammar in FILE")
    shape.add_argument("--regex", metavar="PATTERN", default=None, help="the answer matches the regular expression")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object (text, tokens, every summary figure) instead of streaming")
    gen.add_argument("--no-color", action="store_true",
                     help="plain text, no Figure-1 colours (also when $NO_COLOR is set or the output is not a terminal)")
    gen.add_argument("--show-rejected", action="store_true",
                     help="show the proposals the target rejected, struck through in red where colour is on and "
                          "in [-...-] where it is off (the answer's own text never includes them)")
    gen.add_argument("--quiet", action="store_true", help="no progress lines on stderr while loading")
    gen.add_argument("--compare", action="store_true",
                     help="then decode the same prompt plainly (no draft) and print the speedup measured in this run")

    info = commands.add_parser("info", parents=[_model_options(with_draft=False)],
                               help="this machine: CPU features, kernel plan, backends and their measured speed")
    info.add_argument("--refresh", action="store_true", help="measure the backends again")
    info.add_argument("--json", action="store_true")

    ana = commands.add_parser("analyze", help="the paper's formulas for given alpha and cost ratio c")
    ana.add_argument("--alpha", type=float, required=True, help="expected acceptance rate, in [0, 1]")
    ana.add_argument("--cost-ratio", type=float, default=0.0,
                     help="cost ratio c = draft step / target step (default 0)")
    ana.add_argument("--ops-ratio", type=float, default=None,
                     help="c_hat, the same ratio in arithmetic operations (default: --cost-ratio)")
    ana.add_argument("--gamma", type=int, nargs="+", default=[1, 2, 3, 4, 5, 7, 10], help="gammas to tabulate")
    ana.add_argument("--max-gamma", type=int, default=64, help="search bound for the optimal gamma")
    ana.add_argument("--verify-curve", default=None,
                     help="T(k)/T(1) for k=1.. as comma-separated numbers, or a profile JSON from `specdecode profile`")
    ana.add_argument("--plot", default=None, help="write the paper's figures to this PNG")
    ana.add_argument("--json", action="store_true")

    alpha = commands.add_parser("alpha", parents=[_model_options()],
                                help="measure alpha = E[sum min(p, q)] on tokens the target generates")
    _prompt_options(alpha, required=True)
    _sampling_options(alpha)
    alpha.add_argument("--max-new-tokens", type=int, default=64)
    alpha.add_argument("--seed", type=int, default=0)
    alpha.add_argument("--json", action="store_true")

    prof = commands.add_parser("profile", parents=[_model_options()],
                               help="cost ratio c and the verification curve T(k)/T(1)")
    prof.add_argument("--max-k", type=int, default=16)
    prof.add_argument("--context", type=int, default=256, help="cached positions before timing")
    prof.add_argument("--repeats", type=int, default=7)
    prof.add_argument("--refresh", action="store_true", help="measure again instead of using the cached profile")
    prof.add_argument("--json", action="store_true")

    bench = commands.add_parser("bench", parents=[_model_options(with_draft=False)],
                                help="benchmark drafters against the autoregressive baseline over a prompt set")
    _prompt_options(bench, required=True)
    bench.add_argument("--draft", action="append", default=[], metavar="SPEC",
                       help="a drafter to include beside prompt lookup, as generate's --draft spells it (repeatable): "
                            "suffix, eagle[:DIR], ngram:FILE, or one draft model (a path, 'trained', text:PATH)")
    bench.add_argument("--draft-backend", default=None, choices=["auto", "hf", "llama.cpp", "native"],
                       help="backend of the draft model (default: --backend)")
    bench.add_argument("--ngram", default=None, help="an n-gram drafter file (.npz from `ngram fit`) to include")
    bench.add_argument("--suffix", action="store_true",
                       help="the same as --draft suffix: suffix drafting (each run on its own: no memory of earlier "
                            "prompts' outputs)")
    bench.add_argument("--eagle", nargs="?", const="", default=None, metavar="DIR",
                       help="include the feature draft (native backend): the one shipped for the embedded target, or "
                            "DIR from distill --eagle")
    bench.add_argument("--gamma", type=gamma_arg, nargs="+", default=[2, 4, 8, "auto"],
                       help="fixed gammas and/or 'auto' (default: 2 4 8 auto)")
    bench.add_argument("--max-gamma", type=int, default=defaults.MAX_GAMMA, help="upper bound for 'auto'")
    bench.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--no-anchors", action="store_true",
                       help="leave out the backend's own generate() (plain and prompt lookup) as anchors")
    bench.add_argument("--anchor-lookup-tokens", type=int, default=10,
                       help="tokens the anchors' own prompt lookup proposes (default 10; 0 leaves those anchors out)")
    bench.add_argument("--out", default="benchmarks/results/latest", help="output directory")
    cache = commands.add_parser("cache", help="what specdecode keeps on this machine (converted models, tokenizers, "
                                              "kernels, profiles), its size; clear it")
    cache.add_argument("action", nargs="?", choices=["list", "clear"], default="list",
                       help="list the entries (default), or clear them")
    cache.add_argument("--model", default=None, metavar="NAME",
                       help="only the entries of models whose file name begins with NAME (default: all)")

    serve = commands.add_parser("serve", parents=[_model_options()],
                                help="an OpenAI-compatible HTTP server with speculative decoding")
    serve.add_argument("--also-draft", action="append", default=[], metavar="SPEC",
                       help="another drafter requests may pick with specdecode.draft (repeatable; --draft is the default)")
    serve.add_argument("--gamma", type=gamma_arg, default="auto",
                       help="default draft length, or 'auto' (default: chosen per call from the measured cost)")
    serve.add_argument("--max-gamma", type=int, default=defaults.MAX_GAMMA, help="upper bound for 'auto'")
    serve.add_argument("--host", default=defaults.HOST,
                       help="the address to listen on (0.0.0.0: every interface; set an API key then)")
    serve.add_argument("--port", type=int, default=defaults.PORT, help="the port to listen on")
    serve.add_argument("--model-name", action="append", default=None, metavar="NAME",
                       help="the model id clients send (default: the target's file name); repeat for aliases, "
                            "the first is the one responses carry")
    serve.add_argument("--max-batch", type=int, default=defaults.MAX_BATCH,
                       help="requests decoded together, each with its own KV cache sized to its prompt + max_tokens "
                            "(1 serves one at a time)")
    serve.add_argument("--prompt-rows", type=int, default=defaults.PROMPT_ROWS,
                       help="prompt tokens a decode step takes beside the other requests' rows, where the target "
                            "computes prompts row by row (the native backend's w4a8): more, a new request's first "
                            "token sooner; fewer, shorter pauses for the requests already decoding")
    serve.add_argument("--prefix-memory", type=int, default=defaults.PREFIX_MIB, metavar="MIB",
                       help="memory for recent prompts' keys and values: a prompt that begins like one of them (a "
                            "repeated system turn or document) computes only the rest; least recently used "
                            "dropped first (0: none)")
    serve.add_argument("--max-queue", type=int, default=defaults.MAX_QUEUE,
                       help="requests that may wait behind a full batch; past them, 429")
    serve.add_argument("--max-tokens", type=int, default=None,
                       help="largest max_tokens a request may ask for (default: no cap but the room its prompt "
                            "leaves in the context window); a request without max_tokens gets min(256, this), "
                            "capped at that room too")
    serve.add_argument("--api-key", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on every route but /health (default: the "
                            "SPECDECODE_API_KEY environment variable, which keeps the key out of process listings)")
    serve.add_argument("--metrics-open", action="store_true", help="serve /metrics without the API key")
    serve.add_argument("--max-body-bytes", type=int, default=defaults.MAX_BODY_BYTES, help="largest request body")
    on_ray = serve.add_argument_group("on a Ray Serve cluster (pip install 'specdecode[ray]')")
    on_ray.add_argument("--ray", action="store_true",
                        help="serve with Ray Serve: --replicas engines behind one endpoint at --host:--port; "
                             "--threads is per replica (default 1), and each replica reserves that many CPUs")
    on_ray.add_argument("--replicas", type=int, default=None,
                        help="replicas, each one engine (default 1; with autoscaling, how many start)")
    on_ray.add_argument("--min-replicas", type=int, default=None, help="autoscale down to this many (default 1)")
    on_ray.add_argument("--max-replicas", type=int, default=None,
                        help="autoscale up to this many (default: --replicas, at least --min-replicas)")
    on_ray.add_argument("--address", default=None,
                        help="the Ray cluster to join: auto or HEAD:6379 (default: start one on this machine)")

    check = commands.add_parser("check", parents=[_model_options()],
                                help="prove a drafter lossless: whole-sequence chi-square tests on a toy target, a "
                                     "broken verifier as the control, greedy identity on the target")
    check.add_argument("--samples", type=int, default=2000,
                       help="whole sequences drawn per sampling setting (default 2000)")
    check.add_argument("--gamma", type=int, default=3,
                       help="draft tokens per target call, fixed so that every draft position is tested (default 3)")
    check.add_argument("--num-prompts", type=int, default=8, help="prompts for greedy identity (default 8)")
    check.add_argument("--max-new-tokens", type=int, default=48, help="tokens per greedy prompt (default 48)")
    check.add_argument("--seed", type=int, default=0)
    _prompt_options(check, required=False)
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.add_argument("--against", choices=["llama.cpp"], default=None,
                       help="instead: compare the native backend's next-token distributions and token ids with "
                            "llama.cpp's on --target (a .gguf file); exit 1 past the oracle tests' thresholds, "
                            "unless, for a quantised file, the native path is no further than llama.cpp from both "
                            "engines run on the file dequantised to F16")
    check.add_argument("--reference", action="store_true",
                       help="with --against: measure from the dequantised copy even within the thresholds")

    ngram = commands.add_parser("ngram", help="n-gram drafters")
    ngram_commands = ngram.add_subparsers(dest="ngram_command", required=True)
    fit = ngram_commands.add_parser("fit", parents=[_model_options(with_draft=False)],
                                    help="count k-grams of a corpus tokenized with the target's tokenizer")
    fit.add_argument("--corpus", required=True, help="text file (one document a line), jsonl ('text', 'prompt', 'turns'), or a "
                          "distillation corpus .npz from `distill` (its answers are used)")
    fit.add_argument("--order", type=int, default=2, help="1 = unigram, 2 = bigram (default), k = k-gram")
    fit.add_argument("--out", required=True, help="output .npz file")

    dist = commands.add_parser("distill", parents=[_model_options(with_draft=False)],
                               help="train a small draft model for the target on its own generations")
    dist.add_argument("--out", required=True, help="output directory of the trained draft")
    dist.add_argument("--corpus", default=None,
                      help="corpus file: reused when it exists, else generated and written there "
                           "(default: OUT.corpus.npz)")
    dist.add_argument("--data-minutes", type=float, default=50.0, help="time for generating the corpus (default 50)")
    dist.add_argument("--train-minutes", type=float, default=55.0, help="training time (default 55)")
    dist.add_argument("--data-batches", type=int, default=None,
                      help="stop generating after this many batches (with --eagle: answers begun), even within "
                           "--data-minutes")
    dist.add_argument("--train-steps", type=int, default=None,
                      help="stop training after this many steps, even within --train-minutes")
    dist.add_argument("--layers", type=int, default=3)
    dist.add_argument("--dim", type=int, default=256)
    dist.add_argument("--heads", type=int, default=4)
    dist.add_argument("--mlp-dim", type=int, default=None, help="MLP width (default 768; with --eagle the target's)")
    dist.add_argument("--embed-dim", type=int, default=128, help="factorised input embedding size (default 128)")
    dist.add_argument("--kept", type=int, default=None,
                      help="output vocabulary: the most used tokens (default 12288; with --eagle 2048)")
    dist.add_argument("--window", type=int, default=1024, help="attention window in tokens (default 1024)")
    dist.add_argument("--lr", type=float, default=None, help="learning rate (default 2e-3; with --eagle 1e-3)")
    dist.add_argument("--eagle", action="store_true",
                      help="train a feature draft (EAGLE) on the native backend: one decoder layer reading the "
                           "target's own features, drafted with --draft eagle:OUT; --layers, --dim, --heads, "
                           "--embed-dim, --window and --gen-batch do not apply (its shapes are the target's; "
                           "--mlp-dim sets its MLP's width, default the target's)")
    dist.add_argument("--init", default=None, metavar="DIR",
                      help="with --eagle: go on training the feature draft in DIR (its shapes and most used "
                           "tokens are kept; --kept may cut them)")
    dist.add_argument("--also", nargs="+", default=[], metavar="CORPUS",
                      help="with --eagle: more feature corpora (.features.npz) to train on beside --corpus")
    dist.add_argument("--feature-layers", nargs="+", type=int, default=[], metavar="N",
                      help="with --eagle: the draft also reads the target's residual stream after these many "
                           "layers (EAGLE-3's low and middle features, e.g. 3 15 of 30), fused with its "
                           "final-norm features; corpora without them get them teacher-forced, kept beside them")
    dist.add_argument("--batch-tokens", type=int, default=8192, help="tokens per training batch (default 8192)")
    dist.add_argument("--gen-batch", type=int, default=32, help="prompts per generation batch (default 32)")
    dist.add_argument("--answer-tokens", type=int, default=256, help="longest answer generated (default 256)")
    dist.add_argument("--seed", type=int, default=0)
    return parser
