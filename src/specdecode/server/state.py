"""What a request needs of the server: the engine, the metrics, the target's tokenizer, the model
ids, the limits (`ServerState`, one per app, at `app.state.server`), and the helpers over them that
the routes (`routes/`) share: reading a body, encoding a prompt, the usage and logprobs objects,
the replies' envelope, the error a failed generation answers."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from fastapi import Request as HTTPRequest

from ..stats import Stats
from ..prompts import encode_chat
from .engine import Engine, Job
from .metrics import Metrics
from .request import Limits, RequestError, decode_body
from .tools import conversation

log = logging.getLogger("specdecode.server")


def _padded(values: list, length: int) -> list:
    return list(values) + [0] * (length - len(values))


def _usage(prompt_tokens: int, stats: Stats, draft: str, gamma, positions: int) -> dict:
    """OpenAI's usage plus the speculation statistics; `positions`: the most draft positions the
    request's gamma allows (accepted_per_position has an entry, zero or not, for each)."""
    per_position = _padded(stats.accepted_per_position, positions)
    drafted = stats.proposed > 0  # else both rates are null (alpha may hold a shadow proposal's score)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "total_tokens": prompt_tokens + stats.new_tokens,
        "speculative": {
            "draft": draft, "gamma": gamma,
            "target_calls": stats.target_calls,
            "num_drafts": stats.drafts,
            "num_tree_drafts": stats.tree_drafts,
            "draft_tokens": stats.proposed,
            "accepted_tokens": stats.accepted,
            "accepted_per_position": per_position,
            "acceptance_per_depth": _padded(stats.acceptance_per_depth, positions) if drafted else None,
            "acceptance_rate": stats.acceptance_rate if drafted else None,
            "tokens_per_call": stats.tokens_per_call,
            "alpha": stats.alpha if drafted else None,
        },
    }


def failure_id() -> str:
    """An id for a server-side failure, in its log line and in the error body the client gets."""
    return "err-" + uuid.uuid4().hex[:16]


@dataclass
class ServerState:
    """engine: the serving engine; target: its model (`engine.target`); vocab: the size of the
    target's vocabulary; names: the model ids the server answers to, `model_name` (the id responses
    carry) first, then the aliases; created: when the server started (the models' `created`)."""

    engine: Engine
    metrics: Metrics
    target: object
    vocab: int
    names: list[str]
    model_name: str
    limits: Limits
    max_body_bytes: int
    created: int

    def finished(self, job: Job) -> None:
        """The engine's on_finish: a finished request's numbers into the metrics."""
        self.metrics.finished(len(job.prompt_ids), job.stats, time.perf_counter() - job.submitted,
                              job.first_token_seconds)

    def generation_failed(self, job: Job, message: str) -> RequestError:
        """A generation that failed in the engine: logged with an id that the error body carries too."""
        rid = failure_id()
        log.error("500 %s: %s (prompt of %d tokens)", rid, message, len(job.prompt_ids))
        return RequestError(500, f"{message} ({rid})", None, "generation_failed", type="server_error")

    async def read_json(self, request: HTTPRequest):
        max_body_bytes = self.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            raise RequestError(413, f"the body has {length} bytes; at most {max_body_bytes} are accepted", None,
                               "body_too_large")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                raise RequestError(413, f"the body is over {max_body_bytes} bytes", None, "body_too_large")
        return decode_body(bytes(body))

    def encode(self, req) -> list[int]:
        biased = next((t for t, _ in req.settings.params.logit_bias if t >= self.vocab), None)
        if biased is not None:
            raise RequestError(400, f"'logit_bias' names token id {biased}; the model's vocabulary has ids "
                                    f"0..{self.vocab - 1}", "logit_bias", "invalid_value")
        if req.kind == "chat":
            messages, tools = conversation(req.messages, req.tools, self.target.tokenizer)
            try:
                return encode_chat(self.target.tokenizer, messages, tools)
            except Exception as err:  # a template that refuses this conversation (e.g. role order)
                raise RequestError(400, f"the chat template refused these messages: {err}", "messages",
                                   "invalid_value") from None
        if isinstance(req.prompt, tuple):  # token ids, as evaluation tools send them
            vocab = self.vocab
            bad = next((t for t in req.prompt if t >= vocab), None)
            if bad is not None:
                raise RequestError(400, f"'prompt' holds token id {bad}; the model's vocabulary has ids 0..{vocab - 1}",
                                   "prompt", "invalid_value")
            return list(req.prompt)
        return self.tokenize_text(req.prompt, True, "prompt")

    def check_grammar(self, req) -> None:
        """A grammar this model's tokenizer cannot follow is the request's problem, named (a matcher
        is built and dropped: about a millisecond)."""
        from ..grammar import GrammarError, constraint_for

        try:
            constraint_for(req.settings.grammar, self.target)
        except GrammarError as err:
            param = {"lark": "specdecode.grammar", "regex": "specdecode.regex",
                     "json_schema": "response_format.json_schema.schema"}[req.settings.grammar.kind]
            raise RequestError(400, str(err), param, "invalid_value") from None

    def tokenize_text(self, text: str, special: bool, param: str) -> list[int]:
        try:
            return self.target.tokenizer.encode(text, add_special_tokens=special)
        except Exception as err:  # whatever the tokenizer refuses is the request's problem, named
            raise RequestError(400, f"the tokenizer cannot encode '{param}': {err}", param, "invalid_value") from None

    def check_model(self, model: str) -> None:
        """A 404 for a model id this server does not answer to."""
        names = self.names
        if model not in names:
            raise RequestError(404, f"the model {model!r} does not exist; this server serves "
                                    f"{', '.join(map(repr, names))}", "model", "model_not_found")

    @staticmethod
    def new_id(kind: str) -> str:
        return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]

    def envelope(self, kind: str, rid: str, chunk: bool) -> dict:
        obj = {("chat", False): "chat.completion", ("chat", True): "chat.completion.chunk",
               ("completion", False): "text_completion", ("completion", True): "text_completion"}[(kind, chunk)]
        return {"id": rid, "object": obj, "created": int(time.time()), "model": self.model_name}

    def usage(self, job: Job) -> dict:
        req, engine = job.request, self.engine
        settings = req.settings
        gamma = engine.gamma if settings.gamma is None else settings.gamma
        positions = engine.scheduler.max_gamma if gamma == "auto" else gamma
        return _usage(len(job.prompt_ids), job.stats, req.draft or engine.default_draft, gamma,
                      positions if settings.max_draft is None else min(positions, settings.max_draft))

    @staticmethod
    def timings(job: Job) -> dict:
        """llama-server's `timings` of a finished job, so that its clients and dashboards read our
        prompt and generation speed and acceptance as they read its own."""
        stats = job.stats
        generating = max(stats.wall_seconds - stats.prefill_seconds, 0.0)
        return {"prompt_n": len(job.prompt_ids), "prompt_ms": stats.prefill_seconds * 1e3,
                "prompt_per_second": len(job.prompt_ids) / stats.prefill_seconds if stats.prefill_seconds else None,
                "predicted_n": stats.new_tokens, "predicted_ms": generating * 1e3,
                "predicted_per_second": stats.new_tokens / generating if generating else None,
                "draft_n": stats.proposed, "draft_n_accepted": stats.accepted}

    def token_text(self, token: int) -> str:
        return self.target.tokenizer.decode([token])

    def logprobs_of(self, kind: str, entries: list, offset: int = 0) -> dict:
        """OpenAI's logprobs object for these tokens (`decode.TokenLogprob`s): chat's content list,
        or completions' parallel lists (text offsets from `offset`)."""
        token_text = self.token_text
        if kind == "chat":
            def entry(token: int, logprob: float) -> dict:
                text = token_text(token)
                return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
            return {"content": [{**entry(e.token, e.logprob), "top_logprobs": [entry(t, v) for t, v in e.top]}
                                for e in entries]}
        texts = [token_text(e.token) for e in entries]
        offsets = [offset + sum(len(t) for t in texts[:i]) for i in range(len(texts))]
        return {"tokens": texts, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{token_text(t): v for t, v in e.top} for e in entries], "text_offset": offsets}

    def kept(self, entries: list, text: str, finish: str) -> list:
        """The tokens whose text the reply shows: at a stop string, none past it."""
        if finish != "stop":
            return entries
        shown, length = [], 0
        for e in entries:
            if length >= len(text):
                break
            shown.append(e)
            length += len(self.token_text(e.token))
        return shown
