"""The HTTP layer: OpenAI's routes over the engine.

    POST /v1/chat/completions   chat turns through the model's chat template
    POST /v1/completions        a raw prompt (text, or token ids)
    GET  /v1/models, /v1/models/{id}, /health, /metrics
    POST /tokenize, /detokenize text <-> token ids (llama.cpp's and vLLM's field names)

Responses follow OpenAI's shapes; `usage.speculative` carries the request's speculation statistics
(in a stream: in a last chunk with no choices, when stream_options.include_usage asks for usage).
Every error is OpenAI's error body with a fitting status. With an API key, every route but /health
(and /metrics when it is left open) needs `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
import uuid
from dataclasses import replace
from typing import Sequence

from fastapi import FastAPI, Path as PathParameter, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from ..decode import TokenLogprob
from ..stats import Stats
from ..text import encode_chat
from .engine import Engine, Job
from .schema import (TOKENIZE_BODY, chat_body, completion_body, detokenize_body, request_body, responses,
                     without_unsent_statuses)
from .metrics import CLIENT_LEFT, UNMATCHED, Metrics
from .request import (Limits, Request, RequestError, decode_body, parse_detokenize, parse_request,
                      parse_tokenize)

log = logging.getLogger("specdecode.server")

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", None: "stop"}


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


def _fit(req: Request, prompt_tokens: int, window: int | None) -> Request:
    """Check that the prompt and max_tokens fit the context window; an omitted max_tokens is capped
    at the room the prompt leaves."""
    if not window:
        return req
    room, asked = window - prompt_tokens, req.max_tokens_param
    if asked is None and room > 0:
        return replace(req, max_tokens=min(req.max_tokens, room))
    if asked is not None and req.max_tokens <= room:
        return req
    need = f" and {asked} is {req.max_tokens} ({prompt_tokens + req.max_tokens} in all)" if asked else ""
    fix = f"shorten the prompt or lower {asked}" if asked and room > 0 else "shorten the prompt"
    param = asked if asked and room > 0 else ("messages" if req.kind == "chat" else "prompt")
    raise RequestError(400, f"the prompt has {prompt_tokens} tokens{need}, but the model's context window holds "
                            f"{window} tokens; {fix}", param, "context_length_exceeded")


def failure_id() -> str:
    """An id for a server-side failure, in its log line and in the error body the client gets."""
    return "err-" + uuid.uuid4().hex[:16]


class _Gate:
    """The outermost layer: checks the API key, and counts each request by route template (every
    URL no route serves under one label) and status (499 when the client left before the end)."""

    def __init__(self, app, metrics: Metrics, routes: set[str], api_key: str | None, open_paths: set[str]) -> None:
        self.app, self.metrics, self.open_paths = app, metrics, open_paths
        # a route template's pattern: /v1/models/{model_id} counts every model's URL under the template
        self.routes = [(re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", route) + "$"), route) for route in routes]
        self.api_key = api_key.strip().encode() if api_key else None

    def label(self, path: str) -> str:
        return next((route for pattern, route in self.routes if pattern.match(path)), UNMATCHED)

    def authorized(self, scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, seen, failed = scope["path"], {"status": None, "done": False}, False

        async def watch(message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                seen["done"] = True
            await send(message)

        try:
            if self.api_key and path not in self.open_paths and not self.authorized(scope):
                error = RequestError(401, "a valid API key is required: send the header 'Authorization: Bearer <key>'",
                                     None, "invalid_api_key")
                await JSONResponse(error.body(), status_code=401,
                                   headers={"WWW-Authenticate": "Bearer"})(scope, receive, watch)
            else:
                await self.app(scope, receive, watch)
        except Exception as err:
            if seen["status"] is not None:  # a reply already begun cannot turn into a 500: the server closes it
                failed = True
                raise
            # A bug: answered as a 500 here, not re-raised, so the server keeps the client's connection
            # (re-raised, it would drop a kept-alive connection without a word)
            rid = failure_id()
            log.error("500 %s on %s %s", rid, scope.get("method"), path, exc_info=err)
            error = RequestError(500, f"internal error ({rid}): {type(err).__name__}: {err}", None, "internal_error",
                                 type="server_error")
            await JSONResponse(error.body(), status_code=500)(scope, receive, watch)
        finally:
            status = seen["status"] if seen["done"] else 500 if failed and seen["status"] is None else CLIENT_LEFT
            self.metrics.requests.labels(endpoint=self.label(path), status=str(status)).inc()


def create_app(engine: Engine, model_name: str, limits: Limits = Limits(), max_body_bytes: int = 1 << 20, *,
               aliases: Sequence[str] = (), api_key: str | None = None, metrics_open: bool = False) -> FastAPI:
    """The server's app. model_name: the id responses carry; aliases: other ids requests may send;
    api_key: if given, needed by every route but /health (and /metrics when `metrics_open`)."""
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise ValueError("the API key must be a non-empty string")
    names = list(dict.fromkeys([model_name, *aliases]))
    app = FastAPI(title="specdecode", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    metrics = Metrics(in_flight=lambda: engine.in_flight)
    target = engine.target
    vocab = len(target.tokenizer)
    created = int(time.time())

    def finished(job: Job) -> None:
        metrics.finished(len(job.prompt_ids), job.stats, time.perf_counter() - job.submitted,
                         job.first_token_seconds)

    engine.on_finish, engine.on_step = finished, metrics.step
    app.state.engine, app.state.metrics = engine, metrics

    @app.exception_handler(RequestError)
    async def request_error(_, err: RequestError):
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(HTTPException)
    async def http_error(_, err: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return JSONResponse(RequestError(err.status_code, str(err.detail), None, code).body(),
                            status_code=err.status_code, headers=err.headers)  # a 405's Allow

    def generation_failed(job: Job, message: str) -> RequestError:
        """A generation that failed in the engine: logged with an id that the error body carries too."""
        rid = failure_id()
        log.error("500 %s: %s (prompt of %d tokens)", rid, message, len(job.prompt_ids))
        return RequestError(500, f"{message} ({rid})", None, "generation_failed", type="server_error")

    async def read_json(request: HTTPRequest):
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

    def encode(req) -> list[int]:
        if req.kind == "chat":
            try:
                return encode_chat(target.tokenizer, req.messages)
            except Exception as err:  # a template that refuses this conversation (e.g. role order)
                raise RequestError(400, f"the chat template refused these messages: {err}", "messages",
                                   "invalid_value") from None
        if isinstance(req.prompt, tuple):  # token ids, as evaluation tools send them
            bad = next((t for t in req.prompt if t >= vocab), None)
            if bad is not None:
                raise RequestError(400, f"'prompt' holds token id {bad}; the model's vocabulary has ids 0..{vocab - 1}",
                                   "prompt", "invalid_value")
            return list(req.prompt)
        return tokenize_text(req.prompt, True, "prompt")

    def tokenize_text(text: str, special: bool, param: str) -> list[int]:
        try:
            return target.tokenizer.encode(text, add_special_tokens=special)
        except Exception as err:  # whatever the tokenizer refuses is the request's problem, named
            raise RequestError(400, f"the tokenizer cannot encode '{param}': {err}", param, "invalid_value") from None

    def check_model(model: str) -> None:
        """A 404 for a model id this server does not answer to."""
        if model not in names:
            raise RequestError(404, f"the model {model!r} does not exist; this server serves "
                                    f"{', '.join(map(repr, names))}", "model", "model_not_found")

    async def submit(request: HTTPRequest, kind: str) -> list[Job]:
        """The request's jobs: one, or one per prompt of a completions request with several (all
        queued, or none: a refusal withdraws the ones already queued)."""
        req = parse_request(await read_json(request), kind, limits)
        check_model(req.model)
        requests = [req] if len(req.prompts) < 2 else [replace(req, prompt=p, prompts=(p,)) for p in req.prompts]
        jobs = []
        for one in requests:
            ids = encode(one)
            jobs.append(Job(_fit(one, len(ids), target.max_positions), ids, asyncio.get_running_loop(),
                            asyncio.Queue()))
        try:
            for job in jobs:
                engine.submit(job)
        except RequestError:
            for job in jobs:
                job.cancelled.set()
            raise
        return jobs

    def new_id(kind: str) -> str:
        return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]

    def envelope(kind: str, rid: str, chunk: bool) -> dict:
        obj = {("chat", False): "chat.completion", ("chat", True): "chat.completion.chunk",
               ("completion", False): "text_completion", ("completion", True): "text_completion"}[(kind, chunk)]
        return {"id": rid, "object": obj, "created": int(time.time()), "model": model_name}

    def usage(job: Job) -> dict:
        req = job.request
        gamma = engine.gamma if req.gamma is None else req.gamma
        return _usage(len(job.prompt_ids), job.stats, req.draft or engine.default_draft, gamma,
                      engine.max_gamma if gamma == "auto" else gamma)

    def token_text(token: int) -> str:
        return target.tokenizer.decode([token])

    def logprobs_of(kind: str, entries: list, offset: int = 0) -> dict:
        """OpenAI's logprobs object for these tokens (`decode.TokenLogprob`s): chat's content list,
        or completions' parallel lists (text offsets from `offset`)."""
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

    def kept(entries: list, text: str, finish: str) -> list:
        """The tokens whose text the reply shows: at a stop string, none past it."""
        if finish != "stop":
            return entries
        shown, length = [], 0
        for e in entries:
            if length >= len(text):
                break
            shown.append(e)
            length += len(token_text(e.token))
        return shown

    async def collect(job: Job, kind: str) -> dict | None:
        """The reply's body once its job is done; None where the client left first (`watch_client`)."""
        pieces, entries = [], []
        try:
            while True:
                event, value = await job.events.get()
                if event == "left":
                    return None
                if event == "piece":
                    pieces.append(value.accepted_text + value.target_text)
                    entries += value.step.logprobs or []
                elif event == "error":
                    raise generation_failed(job, value)
                else:
                    break
        finally:
            job.cancelled.set()  # a no-op once done; stops the generation if this handler was cancelled
        text, finish = "".join(pieces), FINISH[job.stats.finish_reason]
        logprobs = (None if job.request.logprobs is None
                    else logprobs_of(kind, kept(entries, text, job.stats.finish_reason)))
        if job.request.echo:  # the prompt, then the completion; its first token has no log-probability
            req = job.request
            prompt = req.prompt if isinstance(req.prompt, str) else target.tokenizer.decode(job.prompt_ids)
            if logprobs is not None:
                first = logprobs_of(kind, [TokenLogprob(job.prompt_ids[0], None, [])] + job.prompt_logprobs)
                first["top_logprobs"][0] = None
                shift = sum(len(t) for t in first["tokens"])
                logprobs = {key: first[key] + ([o + shift for o in logprobs[key]] if key == "text_offset"
                                               else logprobs[key]) for key in first}
            text = prompt + text
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                   "logprobs": logprobs}
                  if kind == "chat" else {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs})
        return {**envelope(kind, new_id(kind), False), "choices": [choice], "usage": usage(job)}

    async def watch_client(request: HTTPRequest, jobs: list[Job]) -> None:
        """Cancel `jobs` as soon as their client disconnects (its body read, the next message the
        server gets for the request is the disconnect): the engine frees their slots before its next
        forward, and `collect` answers 499."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for job in jobs:
            job.cancelled.set()
            job.events.put_nowait(("left", None))

    async def stream(job: Job, kind: str):
        rid = new_id(kind)

        def chunk(text: str | None, finish: str | None = None, role: bool = False, logprobs: dict | None = None,
                  **extra) -> str:
            if kind == "chat":
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                if logprobs is not None:
                    choice["logprobs"] = logprobs
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
            return "data: " + json.dumps({**envelope(kind, rid, True), "choices": [choice], **extra}) + "\n\n"

        shown = 0  # characters streamed so far (completions' text offsets)

        try:
            if kind == "chat":
                yield chunk(None, role=True)
            while True:
                event, value = await job.events.get()
                if event == "piece":
                    text = value.accepted_text + value.target_text
                    entries = value.step.logprobs if job.request.logprobs is not None else None
                    if entries and value.finish_reason == "stop":
                        entries = kept(entries, text, "stop")
                    if text or entries:
                        yield chunk(text, logprobs=None if not entries else logprobs_of(kind, entries, shown))
                    shown += len(text)
                elif event == "error":
                    yield "data: " + json.dumps(generation_failed(job, value).body()) + "\n\n"
                    break
                else:
                    yield chunk(None, FINISH[job.stats.finish_reason])
                    if job.request.include_usage:  # as OpenAI: one more chunk, with no choices
                        yield "data: " + json.dumps({**envelope(kind, rid, True), "choices": [],
                                                     "usage": usage(job)}) + "\n\n"
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled.set()  # the client left (or the stream ended): free the slot

    async def complete(request: HTTPRequest, kind: str):
        jobs = await submit(request, kind)
        if jobs[0].request.stream:
            return StreamingResponse(stream(jobs[0], kind), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        bodies, watcher = [], asyncio.create_task(watch_client(request, jobs))
        try:
            for job in jobs:  # decoded together in the engine's batch; collected in order
                body = await collect(job, kind)
                if body is None:
                    return Response(status_code=CLIENT_LEFT)
                bodies.append(body)
        finally:
            watcher.cancel()
        if len(bodies) == 1:
            return JSONResponse(bodies[0])
        # several prompts: a choice each (index = the prompt's), the token counts summed, and each
        # prompt's speculation statistics in order
        merged = {**bodies[0], "choices": [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]}
        merged["usage"] = {key: sum(b["usage"][key] for b in bodies)
                           for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
        merged["usage"]["speculative"] = [b["usage"]["speculative"] for b in bodies]
        return JSONResponse(merged)

    keyed = api_key is not None
    generated = responses(400, 404, 413, 429, guarded=keyed, ok={"application/json": {"schema": {"type": "object"}},
                                                                  "text/event-stream": {"schema": {"type": "object", "required": ["data"],
                                                                                     "properties": {"data": {"type": "string"}}}}})

    @app.post("/v1/chat/completions", openapi_extra=request_body(chat_body(limits, names, engine.drafts)),
              responses=generated)
    async def chat_completions(request: HTTPRequest):
        return await complete(request, "chat")

    @app.post("/v1/completions", openapi_extra=request_body(completion_body(limits, names, engine.drafts, vocab)),
              responses=generated)
    async def completions(request: HTTPRequest):
        return await complete(request, "completion")

    @app.get("/v1/models", responses=responses(guarded=keyed))
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                            "owned_by": "specdecode"} for name in names]}

    @app.get("/v1/models/{model_id}", responses=responses(404, guarded=keyed))
    async def model(model_id: str = PathParameter(json_schema_extra={"enum": names})):
        check_model(model_id)
        return {"id": model_id, "object": "model", "created": created, "owned_by": "specdecode"}

    @app.post("/tokenize", openapi_extra=request_body(TOKENIZE_BODY), responses=responses(400, 413, guarded=keyed))
    async def tokenize(request: HTTPRequest):
        """Text -> token ids, as llama.cpp's server (`content`, `add_special`) and vLLM's (`prompt`,
        `add_special_tokens`) take it."""
        text, special = parse_tokenize(await read_json(request))
        tokens = tokenize_text(text, special, "content")
        return {"tokens": tokens, "count": len(tokens), "max_model_len": target.max_positions}

    @app.post("/detokenize", openapi_extra=request_body(detokenize_body(vocab)),
              responses=responses(400, 413, guarded=keyed))
    async def detokenize(request: HTTPRequest):
        text = target.tokenizer.decode(parse_detokenize(await read_json(request), vocab))
        return {"content": text, "prompt": text}

    @app.get("/tokenizer_info", responses=responses(guarded=keyed))
    async def tokenizer_info():
        """The tokenizer's special tokens and chat template, as vLLM's server gives them (what
        lm-evaluation-harness's remote tokenizer reads beside /tokenize and /detokenize)."""
        tokenizer = target.tokenizer
        return {"tokenizer_class": type(tokenizer).__name__, "eos_token": tokenizer.eos_token,
                "bos_token": tokenizer.bos_token, "pad_token": tokenizer.pad_token,
                "chat_template": getattr(tokenizer, "chat_template", None),
                "model_max_length": target.max_positions}

    @app.get("/health", responses=responses(guarded=False))
    async def health():
        return {"status": "ok", "model": model_name, "drafts": engine.drafts, "in_flight": engine.in_flight}

    @app.get("/metrics", responses=responses(guarded=keyed and not metrics_open,
                                             ok={"text/plain": {"schema": {"type": "string"}}}))
    async def prometheus():
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    without_unsent_statuses(app)
    app.add_middleware(_Gate, metrics=metrics, routes={route.path for route in app.routes}, api_key=api_key,
                       open_paths={"/health", "/metrics"} if metrics_open else {"/health"})
    return app
