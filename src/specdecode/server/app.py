"""The HTTP layer: OpenAI's routes over the engine.

    POST /v1/chat/completions   chat turns through the model's chat template
    POST /v1/completions        a raw prompt
    GET  /v1/models, /health, /metrics

Responses follow OpenAI's shapes; `usage.speculative` (and the last chunk of a stream) carries the
request's speculation statistics. Every error is OpenAI's error body with a fitting status.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from ..stats import Stats
from ..text import encode_chat
from .engine import Engine, Job
from .metrics import Metrics
from .request import Limits, RequestError, parse_request

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", None: "stop"}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _usage(prompt_tokens: int, stats: Stats, draft: str, gamma) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "total_tokens": prompt_tokens + stats.new_tokens,
        "speculative": {
            "draft": draft, "gamma": gamma,
            "target_calls": stats.target_calls,
            "num_drafts": stats.drafts,
            "draft_tokens": stats.proposed,
            "accepted_tokens": stats.accepted,
            "accepted_per_position": list(stats.accepted_per_position),
            "acceptance_rate": stats.acceptance_rate,
            "tokens_per_call": stats.tokens_per_call,
            "alpha": stats.alpha,
        },
    }


def create_app(engine: Engine, model_name: str, limits: Limits = Limits(), max_body_bytes: int = 1 << 20) -> FastAPI:
    app = FastAPI(title="specdecode", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = Metrics()
    target = engine.target
    created = int(time.time())

    def finished(job: Job) -> None:
        metrics.finished(len(job.prompt_ids), job.stats, time.perf_counter() - job.submitted,
                         job.first_token_seconds)

    engine.on_finish = finished
    app.state.engine, app.state.metrics = engine, metrics

    @app.exception_handler(RequestError)
    async def request_error(_, err: RequestError):
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(HTTPException)
    async def http_error(_, err: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return JSONResponse(RequestError(err.status_code, str(err.detail), None, code).body(),
                            status_code=err.status_code)

    @app.exception_handler(Exception)
    async def server_error(_, err: Exception):
        return JSONResponse(RequestError(500, f"internal error: {type(err).__name__}: {err}", None, "internal_error",
                                         type="server_error").body(), status_code=500)

    @app.middleware("http")
    async def count(request: HTTPRequest, call_next):
        response = await call_next(request)
        metrics.requests.labels(endpoint=request.url.path, status=str(response.status_code)).inc()
        metrics.queue.set(engine.in_flight)
        return response

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
        try:
            return json.loads(bytes(body), parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as err:
            raise RequestError(400, f"the body is not valid JSON: {err}", None, "invalid_json") from None

    def encode(req) -> list[int]:
        if req.kind == "chat":
            try:
                return encode_chat(target.tokenizer, req.messages)
            except Exception as err:  # a template that refuses this conversation (e.g. role order)
                raise RequestError(400, f"the chat template refused these messages: {err}", "messages",
                                   "invalid_value") from None
        return target.tokenizer.encode(req.prompt, add_special_tokens=True)

    async def submit(request: HTTPRequest, kind: str):
        req = parse_request(await read_json(request), kind, limits)
        if req.model != model_name:
            raise RequestError(404, f"the model {req.model!r} does not exist; this server serves {model_name!r}",
                               "model", "model_not_found")
        ids = encode(req)
        window = target.max_positions
        if window and len(ids) >= window:
            raise RequestError(400, f"the prompt has {len(ids)} tokens but the model's context window holds "
                                    f"{window}; shorten the prompt", "messages" if kind == "chat" else "prompt",
                               "context_length_exceeded")
        job = Job(req, ids, asyncio.get_running_loop(), asyncio.Queue())
        engine.submit(job)
        return job

    def new_id(kind: str) -> str:
        return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]

    def envelope(kind: str, rid: str, chunk: bool) -> dict:
        obj = {("chat", False): "chat.completion", ("chat", True): "chat.completion.chunk",
               ("completion", False): "text_completion", ("completion", True): "text_completion"}[(kind, chunk)]
        return {"id": rid, "object": obj, "created": int(time.time()), "model": model_name}

    def usage(job: Job) -> dict:
        req = job.request
        return _usage(len(job.prompt_ids), job.stats, req.draft or engine.default_draft,
                      engine.gamma if req.gamma is None else req.gamma)

    async def collect(job: Job, request: HTTPRequest, kind: str) -> dict:
        pieces = []
        try:
            while True:
                try:
                    event, value = await asyncio.wait_for(job.events.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        job.cancelled.set()
                        return {}
                    continue
                if event == "piece":
                    pieces.append(value.accepted_text + value.target_text)
                elif event == "error":
                    raise RequestError(500, value, None, "generation_failed", type="server_error")
                else:
                    break
        finally:
            job.cancelled.set()  # a no-op once done; stops the generation if this handler was cancelled
        text, finish = "".join(pieces), FINISH[job.stats.finish_reason]
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                  if kind == "chat" else {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
        return {**envelope(kind, new_id(kind), False), "choices": [choice], "usage": usage(job)}

    async def stream(job: Job, kind: str):
        rid = new_id(kind)

        def chunk(text: str | None, finish: str | None = None, role: bool = False, **extra) -> str:
            if kind == "chat":
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            return "data: " + json.dumps({**envelope(kind, rid, True), "choices": [choice], **extra}) + "\n\n"

        try:
            if kind == "chat":
                yield chunk(None, role=True)
            while True:
                event, value = await job.events.get()
                if event == "piece":
                    text = value.accepted_text + value.target_text
                    if text:
                        yield chunk(text)
                elif event == "error":
                    yield "data: " + json.dumps(RequestError(500, value, None, "generation_failed",
                                                             type="server_error").body()) + "\n\n"
                    break
                else:
                    yield chunk(None, FINISH[job.stats.finish_reason], usage=usage(job))
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled.set()  # the client left (or the stream ended): free the slot

    async def complete(request: HTTPRequest, kind: str):
        job = await submit(request, kind)
        if job.request.stream:
            return StreamingResponse(stream(job, kind), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return JSONResponse(await collect(job, request, kind))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest):
        return await complete(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await complete(request, "completion")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "specdecode"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "drafts": engine.drafts, "in_flight": engine.in_flight}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    return app
