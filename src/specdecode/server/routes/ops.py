"""GET /health (open even with an API key) and /metrics (Prometheus' text exposition)."""

from __future__ import annotations

from fastapi import Request as HTTPRequest
from fastapi.responses import Response


async def health(request: HTTPRequest):
    state = request.app.state.server
    engine = state.engine
    return {"status": "ok", "model": state.model_name, "drafts": engine.drafts, "in_flight": engine.in_flight}


async def prometheus(request: HTTPRequest):
    return Response(request.app.state.server.metrics.exposition(), media_type="text/plain; version=0.0.4")
