"""POST /v1/chat/completions (chat turns through the model's chat template) and /v1/completions (a
raw prompt: text, or token ids; several prompts decode together): each request's jobs go to the
engine, and the reply is one body once they are done, or a stream of server-sent events. A request
with the extension's `trace` also gets each target call's tokens (`trace.py`)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...decode import TokenLogprob
from ..engine import Job
from ..metrics import CLIENT_LEFT
from ..request import EXTENSION, Request, RequestError, parse_request
from ..state import ServerState
from ..trace import Tracer

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", None: "stop"}


def _fit(req: Request, prompt_tokens: int, window: int | None) -> Request:
    """Check that the prompt and max_tokens fit the context window; an omitted max_tokens is capped
    at the room the prompt leaves."""
    if not window:
        return req
    room, asked, max_tokens = window - prompt_tokens, req.max_tokens_param, req.settings.max_new_tokens
    if asked is None and room > 0:
        return replace(req, settings=replace(req.settings, max_new_tokens=min(max_tokens, room)))
    if asked is not None and max_tokens <= room:
        return req
    need = f" and {asked} is {max_tokens} ({prompt_tokens + max_tokens} in all)" if asked else ""
    fix = f"shorten the prompt or lower {asked}" if asked and room > 0 else "shorten the prompt"
    param = asked if asked and room > 0 else ("messages" if req.kind == "chat" else "prompt")
    raise RequestError(400, f"the prompt has {prompt_tokens} tokens{need}, but the model's context window holds "
                            f"{window} tokens; {fix}", param, "context_length_exceeded")


async def submit(state: ServerState, request: HTTPRequest, kind: str) -> tuple[Request, list[Job]]:
    """The request and its jobs: one, one per prompt of a completions request with several, or one
    per choice where it asks for n (all queued, or none: a refusal withdraws the ones already queued)."""
    req = parse_request(await state.read_json(request), kind, state.limits)
    state.check_model(req.model)
    if req.best_of > 1:  # n (or best_of) choices of one prompt, decoded together, each on its own seed stream;
        # best_of's scored by their tokens' log-probabilities (`_best`)
        settings = req.settings
        logprobs = 0 if req.best_of > req.n and settings.logprobs is None else settings.logprobs
        requests = [replace(req, n=1, best_of=1, settings=replace(
                            settings, logprobs=logprobs, seed=None if settings.seed is None else (settings.seed + i) % 2**63))
                    for i in range(req.best_of)]
    elif len(req.prompts) > 1:
        requests = [replace(req, prompt=p, prompts=(p,)) for p in req.prompts]
    else:
        requests = [req]
    jobs = []
    for one in requests:
        ids = state.encode(one)
        state.check_grammar(one)
        jobs.append(Job(_fit(one, len(ids), state.target.max_positions), ids, asyncio.get_running_loop(),
                        asyncio.Queue()))
    try:
        for job in jobs:
            state.engine.submit(job)
    except RequestError:
        for job in jobs:
            job.cancelled.set()
        raise
    return req, jobs


async def collect(state: ServerState, job: Job, kind: str) -> dict | None:
    """The reply's body once its job is done; None where the client left first (`watch_client`)."""
    pieces, entries, traced = [], [], []
    tracer = Tracer(state.target.tokenizer) if job.request.trace else None
    try:
        while True:
            event, value = await job.events.get()
            if event == "left":
                return None
            if event == "piece":
                pieces.append(value.accepted_text + value.target_text)
                entries += value.step.logprobs or []
                if tracer is not None:
                    traced.append(tracer.entry(value))
            elif event == "error":
                raise state.generation_failed(job, value)
            else:
                break
    finally:
        job.cancelled.set()  # a no-op once done; stops the generation if this handler was cancelled
    text, finish = "".join(pieces), FINISH[job.stats.finish_reason]
    logprobs = (None if job.request.settings.logprobs is None
                else state.logprobs_of(kind, state.kept(entries, text, job.stats.finish_reason)))
    if job.request.echo:  # the prompt, then the completion; its first token has no log-probability
        req = job.request
        prompt = req.prompt if isinstance(req.prompt, str) else state.target.tokenizer.decode(job.prompt_ids)
        if logprobs is not None:
            first = state.logprobs_of(kind, [TokenLogprob(job.prompt_ids[0], None, [])] + job.prompt_logprobs)
            first["top_logprobs"][0] = None
            shift = sum(len(t) for t in first["tokens"])
            logprobs = {key: first[key] + ([o + shift for o in logprobs[key]] if key == "text_offset"
                                           else logprobs[key]) for key in first}
        text = prompt + text
    message = {"role": "assistant", "content": text}
    call = job.request.tools.call_of(text) if kind == "chat" and job.request.tools else None
    if call is not None:  # the reply is a function call (`tools`)
        message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    choice = ({"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}
              if kind == "chat" else {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs})
    trace = {EXTENSION: {"trace": traced}} if tracer is not None else {}
    return {**state.envelope(kind, state.new_id(kind), False), "choices": [choice], "usage": state.usage(job),
            "timings": state.timings(job), **trace}


async def watch_client(request: HTTPRequest, jobs: list[Job]) -> None:
    """Cancel `jobs` as soon as their client disconnects (its body read, the next message the
    server gets for the request is the disconnect): the engine frees their slots before its next
    forward, and `collect` answers 499."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for job in jobs:
        job.cancelled.set()
        job.events.put_nowait(("left", None))


async def stream(state: ServerState, job: Job, kind: str):
    rid = state.new_id(kind)

    def chunk(text: str | None, finish: str | None = None, role: bool = False, logprobs: dict | None = None,
              delta: dict | None = None, **extra) -> str:
        if kind == "chat":
            if delta is None:
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            if logprobs is not None:
                choice["logprobs"] = logprobs
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        if traced:  # the target calls not sent yet ride on this chunk
            extra[EXTENSION] = {"trace": traced[:]}
            traced.clear()
        return "data: " + json.dumps({**state.envelope(kind, rid, True), "choices": [choice], **extra}) + "\n\n"

    shown = 0  # characters streamed so far (completions' text offsets)
    # a function call (`tools`) is held back and sent whole as one tool_calls delta once it ends; with
    # tool_choice auto, the reply's first characters tell a call ("{") from text
    tools = job.request.tools if kind == "chat" else None
    calling = None if tools is not None and tools.choice == "auto" else (tools is not None and tools.choice != "none")
    held: list[str] = []
    tracer, traced = (Tracer(state.target.tokenizer) if job.request.trace else None), []

    try:
        if kind == "chat":
            yield chunk(None, role=True)
        while True:
            event, value = await job.events.get()
            if event == "piece":
                text = value.accepted_text + value.target_text
                if tracer is not None:
                    traced.append(tracer.entry(value))
                if calling is None and ("".join(held) + text).strip():
                    calling = ("".join(held) + text).lstrip().startswith("{")
                    if not calling and held:
                        text, held = "".join(held) + text, []
                if calling is not False:
                    held.append(text)
                    continue
                entries = value.step.logprobs if job.request.settings.logprobs is not None else None
                if entries and value.finish_reason == "stop":
                    entries = state.kept(entries, text, "stop")
                if text or entries:
                    yield chunk(text, logprobs=None if not entries else state.logprobs_of(kind, entries, shown))
                shown += len(text)
            elif event == "error":
                yield "data: " + json.dumps(state.generation_failed(job, value).body()) + "\n\n"
                break
            else:
                finish = FINISH[job.stats.finish_reason]
                call = tools.call_of("".join(held)) if held else None
                if call is not None:
                    yield chunk(None, delta={"tool_calls": [{"index": 0, **call}]})
                    finish = "tool_calls"
                elif held:  # not a call after all (cut short): the text as it came
                    yield chunk("".join(held))
                yield chunk(None, finish, timings=state.timings(job))  # llama-server's
                if job.request.include_usage:  # as OpenAI: one more chunk, with no choices
                    yield "data: " + json.dumps({**state.envelope(kind, rid, True), "choices": [],
                                                 "usage": state.usage(job)}) + "\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:
        job.cancelled.set()  # the client left (or the stream ended): free the slot


async def complete(request: HTTPRequest, kind: str):
    state: ServerState = request.app.state.server
    req, jobs = await submit(state, request, kind)
    if jobs[0].request.stream:
        return StreamingResponse(stream(state, jobs[0], kind), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    bodies, watcher = [], asyncio.create_task(watch_client(request, jobs))
    try:
        for job in jobs:  # decoded together in the engine's batch; collected in order
            body = await collect(state, job, kind)
            if body is None:
                return Response(status_code=CLIENT_LEFT)
            bodies.append(body)
    finally:
        watcher.cancel()
    if len(bodies) == 1:
        return JSONResponse(bodies[0])
    # several prompts, n or best_of choices: a choice each (index = the prompt's or the choice's), the
    # token counts summed over every choice decoded (a prompt counted once for its choices), each one's
    # speculation statistics in order
    chosen = _best(bodies, req) if req.best_of > req.n else bodies
    merged = {**chosen[0], "choices": [{**b["choices"][0], "index": i} for i, b in enumerate(chosen)]}
    prompts = bodies[:1] if req.best_of > 1 else bodies
    merged["usage"] = {"prompt_tokens": sum(b["usage"]["prompt_tokens"] for b in prompts),
                       "completion_tokens": sum(b["usage"]["completion_tokens"] for b in bodies)}
    merged["usage"]["total_tokens"] = merged["usage"]["prompt_tokens"] + merged["usage"]["completion_tokens"]
    merged["usage"]["speculative"] = [b["usage"]["speculative"] for b in bodies]
    merged["timings"] = [b["timings"] for b in bodies]
    if req.trace:
        merged[EXTENSION] = {"trace": [b[EXTENSION]["trace"] for b in chosen]}
    return JSONResponse(merged)


def _best(bodies: list[dict], req: Request) -> list[dict]:
    """OpenAI's best_of: of the choices decoded, the n with the highest mean log-probability of their
    tokens (the target's own, `logprobs`), best first; their logprobs dropped where the request did
    not ask for them."""
    def mean(body: dict) -> float:  # over the completion's tokens (an echoed prompt's come first)
        kept = body["choices"][0]["logprobs"]["token_logprobs"]
        values = [v for v in kept[len(kept) - min(len(kept), body["usage"]["completion_tokens"]):] if v is not None]
        return sum(values) / len(values) if values else 0.0

    ranked = sorted(bodies, key=mean, reverse=True)[: req.n]
    if req.settings.logprobs is None:
        ranked = [{**b, "choices": [{**b["choices"][0], "logprobs": None}]} for b in ranked]
    return ranked


async def chat_completions(request: HTTPRequest):
    return await complete(request, "chat")


async def completions(request: HTTPRequest):
    return await complete(request, "completion")
