"""GET /v1/models and /v1/models/{model_id}: the model ids the server answers to (the primary first,
then the aliases)."""

from __future__ import annotations

from fastapi import Request as HTTPRequest


async def models(request: HTTPRequest):
    state = request.app.state.server
    return {"object": "list", "data": [{"id": name, "object": "model", "created": state.created,
                                        "owned_by": "specdecode"} for name in state.names]}


# /openapi.json lists the served ids as model_id's enum: `schema.without_unsent_statuses` sets it,
# since a module-level route cannot know them when it is defined
async def model(request: HTTPRequest, model_id: str):
    state = request.app.state.server
    state.check_model(model_id)
    return {"id": model_id, "object": "model", "created": state.created, "owned_by": "specdecode"}
