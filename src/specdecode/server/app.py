"""The HTTP layer: OpenAI's routes over the engine.

    POST /v1/chat/completions   chat turns through the model's chat template
    POST /v1/completions        a raw prompt (text, or token ids)
    GET  /v1/models, /v1/models/{id}, /health, /metrics
    POST /tokenize, /detokenize text <-> token ids (llama.cpp's and vLLM's field names)
    GET  /                      the server's own page: a chat showing how each token came (`routes/page.py`)

Responses follow OpenAI's shapes; `usage.speculative` carries the request's speculation statistics
(in a stream: in a last chunk with no choices, when stream_options.include_usage asks for usage);
with the extension's `trace`, each target call's tokens (`trace.py`). Every error is OpenAI's error
body with a fitting status. With an API key, every route but /health, the page and its files (and
/metrics when it is left open) needs `Authorization: Bearer <key>`.

The routes live in `routes/` (one module per family: generation, models, tokens, ops, page) and read what
they need from the one `state.ServerState` at `app.state.server`; `create_app` builds that state and
wires the routes, the error handlers and the outer gate (`_Gate`).
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from typing import Sequence

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .. import defaults
from .engine import Engine
from .metrics import CLIENT_LEFT, UNMATCHED, Metrics
from .request import Limits, RequestError
from .routes import generation, models, ops, page, tokens
from .schema import (TOKENIZE_BODY, chat_body, completion_body, detokenize_body, request_body, responses,
                     without_unsent_statuses)
from .state import ServerState, failure_id

log = logging.getLogger("specdecode.server")


async def request_error(_, err: RequestError):
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def http_error(_, err: HTTPException):
    code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
    return JSONResponse(RequestError(err.status_code, str(err.detail), None, code).body(),
                        status_code=err.status_code, headers=err.headers)  # a 405's Allow


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


def create_app(engine: Engine, model_name: str, limits: Limits = Limits(),
               max_body_bytes: int = defaults.MAX_BODY_BYTES, *,
               aliases: Sequence[str] = (), api_key: str | None = None, metrics_open: bool = False) -> FastAPI:
    """The server's app. model_name: the id responses carry; aliases: other ids requests may send;
    api_key: if given, needed by every route but /health (and /metrics when `metrics_open`)."""
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise ValueError("the API key must be a non-empty string")
    names = list(dict.fromkeys([model_name, *aliases]))
    app = FastAPI(title="specdecode", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    metrics = Metrics(in_flight=lambda: engine.in_flight)
    state = ServerState(engine=engine, metrics=metrics, target=engine.target, vocab=len(engine.target.tokenizer),
                        names=names, model_name=model_name, limits=limits, max_body_bytes=max_body_bytes,
                        created=int(time.time()))
    engine.on_finish, engine.on_step = state.finished, metrics.step
    app.state.server, app.state.engine, app.state.metrics = state, engine, metrics
    app.add_exception_handler(RequestError, request_error)
    app.add_exception_handler(HTTPException, http_error)

    keyed = api_key is not None
    event = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}  # an SSE event
    generated = responses(400, 404, 413, 429, guarded=keyed, ok={"application/json": {"schema": {"type": "object"}},
                                                                  "text/event-stream": {"schema": event}})
    app.add_api_route("/v1/chat/completions", generation.chat_completions, methods=["POST"],
                      openapi_extra=request_body(chat_body(limits, names, engine.drafts, state.vocab)),
                      responses=generated)
    app.add_api_route("/v1/completions", generation.completions, methods=["POST"],
                      openapi_extra=request_body(completion_body(limits, names, engine.drafts, state.vocab)),
                      responses=generated)
    app.add_api_route("/v1/models", models.models, methods=["GET"], responses=responses(guarded=keyed))
    app.add_api_route("/v1/models/{model_id}", models.model, methods=["GET"], responses=responses(404, guarded=keyed))
    app.add_api_route("/tokenize", tokens.tokenize, methods=["POST"], openapi_extra=request_body(TOKENIZE_BODY),
                      responses=responses(400, 413, guarded=keyed))
    app.add_api_route("/detokenize", tokens.detokenize, methods=["POST"],
                      openapi_extra=request_body(detokenize_body(state.vocab)),
                      responses=responses(400, 413, guarded=keyed))
    app.add_api_route("/tokenizer_info", tokens.tokenizer_info, methods=["GET"], responses=responses(guarded=keyed))
    app.add_api_route("/health", ops.health, methods=["GET"], responses=responses(guarded=False))
    app.add_api_route("/metrics", ops.prometheus, methods=["GET"],
                      responses=responses(guarded=keyed and not metrics_open,
                                          ok={"text/plain": {"schema": {"type": "string"}}}))
    app.add_api_route("/", page.index, methods=["GET"], include_in_schema=False)
    app.add_api_route(page.PREFIX + "{name}", page.asset, methods=["GET"], include_in_schema=False)

    without_unsent_statuses(app, model_ids=names)  # model_ids: GET /v1/models/{model_id}'s enum
    app.add_middleware(_Gate, metrics=metrics, routes={route.path for route in app.routes}, api_key=api_key,
                       open_paths={"/health", *page.PATHS} | ({"/metrics"} if metrics_open else set()))
    return app
