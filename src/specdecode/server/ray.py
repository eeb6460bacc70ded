"""`specdecode serve --ray`: the same OpenAI endpoint on a Ray Serve application of specdecode replicas.

    specdecode serve --ray --replicas 2 --threads 1        # a Ray cluster started on this machine
    specdecode serve --ray --address auto --replicas 8     # replicas across a running cluster
    serve run specdecode.server.ray:app_builder replicas=2 threads=1 draft=suffix

Two deployments. Each `Replica` builds what `specdecode serve` builds, from the same `ServeOptions`
(build.build_app: one target, one engine with its queue, create_app's routes and validation) and
runs the HTTP requests forwarded to it through that app. The `Ingress` takes every HTTP request,
hands it to one replica and passes the answer back as it comes (streams too). It answers two routes
itself, from every replica's own answer: GET /metrics sums the replicas' samples that have the same
name and labels (a replica gone keeps its counters in the sum: `Totals`), and GET /health adds up
their requests in flight.

Routing: a request whose drafter remembers earlier outputs (`suffix`) carries its conversation: the
`user` field, else the first user message, else the prompt's start. `ConversationRouter` sends it to
the replica with the highest hash of (conversation, replica) (rendezvous hashing), so a conversation
stays on the replica that served its earlier turns; when that replica is gone, the next highest
serves it: the same output, only colder drafts. Any other request goes to the less busy of two
random replicas, as Ray Serve's default router does.

A replica that dies mid-request: its client gets a 503 with OpenAI's error body (mid-stream: an
error event, then [DONE]), and Ray Serve starts a new replica.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, replace

try:
    import ray
    from ray import serve
    from ray.exceptions import ActorUnavailableError, RayActorError
    from ray.serve.config import AutoscalingConfig, RequestRouterConfig
    from ray.serve.exceptions import DeploymentUnavailableError
    from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
except ImportError:
    raise ImportError("--ray needs Ray Serve, which is not installed: pip install 'specdecode[ray]'") from None

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..drafters.spec import remembers
from ..checks import check_positive_settings, option_name
from .build import ServeOptions, api_key_from_environment, build_app
from .request import RequestError

APP = "specdecode"
GONE = (RayActorError, ActorUnavailableError, DeploymentUnavailableError)  # the replica died or cannot be reached
SPARE_CALLS = 8  # calls a replica takes beyond its engine's queue (health, metrics, refusals) before Ray queues them
BROADCAST_SECONDS = 5.0  # how long /metrics and /health wait for each replica's answer
REPLICA_HEADER = "x-specdecode-replica"  # which replica answered

_routers: dict[str, "ConversationRouter"] = {}  # app name -> the router of its replicas, in the ingress's process


def _registry() -> dict[str, "ConversationRouter"]:
    """_routers of the imported module: Ray pickles the router class (and may pickle the deployments)
    by value, with copies of this module's globals."""
    from specdecode.server import ray as module

    return module._routers


def route_key(body: bytes, default_draft: str) -> str | None:
    """The conversation a request belongs to when its drafter remembers across requests (suffix, pool, auto), else
    None: the `user` field, else the first user message (chat), else the prompt's first 256 characters."""
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    extension = request.get("specdecode")
    draft = extension.get("draft") if isinstance(extension, dict) and extension.get("draft") else default_draft
    if not isinstance(draft, str) or not remembers(draft):
        return None
    if isinstance(request.get("user"), str) and request["user"]:
        return "user:" + request["user"]
    messages = request.get("messages")
    if isinstance(messages, list):
        first = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
        return None if first is None else "chat:" + json.dumps(first.get("content"))
    prompt = request.get("prompt")
    return "prompt:" + prompt[:256] if isinstance(prompt, str) else None


def rank(key: str, replica_id: str) -> bytes:
    """A conversation goes to the replica where this is highest."""
    return hashlib.blake2b(f"{key}\0{replica_id}".encode(), digest_size=8).digest()


class ConversationRouter(RequestRouter):
    """Routes on the first argument of a replica call: "replica:ID" goes to that replica, a conversation
    key to the replica with the highest rank(key, replica), None to the less busy of two random ones."""

    def initialize_state(self, **kwargs) -> None:
        _registry()[self.app_name] = self

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas or pending_request is None:
            return [candidate_replicas]
        pending_request.routing_context.should_backoff = True  # else Ray asks again at once, in a busy loop
        key = pending_request.args[0] if pending_request.args else None
        if key is None:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        if key.startswith("replica:"):
            chosen = [r for r in candidate_replicas if r.replica_id.unique_id == key[len("replica:"):]]
            return [chosen] if chosen else []
        return [[max(candidate_replicas, key=lambda r: rank(key, r.replica_id.unique_id))]]


def sum_expositions(texts: list[str], frozen: list[str] = ()) -> bytes:
    """One Prometheus exposition from several: samples with the same name and labels add up (counters,
    histogram buckets, sums and counts, and the in-flight gauge: the total over the replicas). `frozen`
    texts (replicas gone, or not answering now) add their counters and histograms, not their gauges."""
    families: dict[str, tuple[Metric, dict]] = {}
    for text, live in [(t, True) for t in texts] + [(t, False) for t in frozen]:
        for family in text_string_to_metric_families(text):
            if not live and family.type == "gauge":
                continue
            _, samples = families.setdefault(family.name, (Metric(family.name, family.documentation, family.type), {}))
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = samples.get(key, 0.0) + sample.value
    metrics = []
    for metric, samples in families.values():
        for (name, labels), value in samples.items():
            metric.add_sample(name, dict(labels), value)
        metrics.append(metric)

    class Summed:
        def collect(self):
            return metrics

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Summed())
    return generate_latest(registry)


class Totals:
    """The replicas' metrics as the ingress sums them, so that no counter ever decreases (Prometheus'
    rate() reads a decrease as a restart of the whole series): each replica's last exposition is
    kept, a replica that does not answer this time counts with it, and one that is gone (killed,
    replaced, scaled down) keeps its counters in the sum for good; its gauges go with it. The
    ingress's own count of requests it answered 503 (their replica was gone) is added."""

    UNAVAILABLE = "specdecode_ingress_unavailable"

    def __init__(self) -> None:
        self.last: dict[str, str] = {}  # replica id -> its last exposition
        self.gone: list[str] = []  # expositions of replicas no longer serving
        self.unavailable = 0  # requests the ingress answered 503

    def exposition(self, answered: dict[str, str], alive: list[str]) -> bytes:
        """`answered`: replica id -> its exposition now; `alive`: the replicas serving now."""
        for replica in [r for r in self.last if r not in alive]:
            self.gone.append(self.last.pop(replica))
        self.last.update(answered)
        own = (f"# HELP {self.UNAVAILABLE}_total Requests the ingress answered 503: their replica was gone\n"
               f"# TYPE {self.UNAVAILABLE}_total counter\n{self.UNAVAILABLE}_total {float(self.unavailable)}\n")
        silent = [self.last[r] for r in alive if r in self.last and r not in answered]
        return sum_expositions([*answered.values(), own], frozen=silent + self.gone)


def _error(status: int, message: str, code: str, **headers) -> JSONResponse:
    return JSONResponse(RequestError(status, message, None, code, type="server_error").body(), status_code=status,
                        headers=headers)


def _unavailable(err: Exception) -> JSONResponse:
    return _error(503, f"the replica serving this request is gone ({type(err).__name__}); another one serves "
                       "the next request: retry", "replica_unavailable", **{"Retry-After": "1"})


@serve.deployment(name="Replica", health_check_period_s=2)
class Replica:
    """One engine and the app `specdecode serve` runs; `call` runs one forwarded HTTP request through it."""

    def __init__(self, options: ServeOptions) -> None:
        if options.kernels:  # this replica's process runs the kernel path asked for, as `specdecode serve`'s does
            from ..models.native.plan import ENV

            os.environ[ENV] = options.kernels
        self.app = build_app(options).app
        self.id = serve.get_replica_context().replica_id.unique_id

    async def call(self, route: str | None, method: str, path: str, query: bytes, headers: list, body: bytes):
        """Yields (status, headers), then the body's chunks. `route` is for the router only. When the
        caller goes away (this generator is closed), the app sees the client disconnect."""
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": query,
                 "headers": headers, "client": None, "server": None}
        messages: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        task = asyncio.ensure_future(self.app(scope, receive, messages.put))
        task.add_done_callback(lambda _: messages.put_nowait(None))
        try:
            while (message := await messages.get()) is not None:
                if message["type"] == "http.response.start":
                    yield message["status"], [*message.get("headers", []), (REPLICA_HEADER.encode(), self.id.encode())]
                elif message["type"] == "http.response.body" and message.get("body"):
                    yield message["body"]
        finally:
            gone.set()
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # raised after the app sent its 500: retrieved, not logged again


@serve.deployment(name="Ingress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
class Ingress:
    """The HTTP entry: forwards each request to a replica; /metrics and /health gather every replica's."""

    def __init__(self, replicas, default_draft: str, max_body_bytes: int) -> None:
        self.replicas = replicas
        self.default_draft = default_draft
        self.max_body_bytes = max_body_bytes
        self.totals = Totals()

    async def __call__(self, request: HTTPRequest) -> Response:
        path, headers = request.url.path, request.headers.raw
        if request.method == "GET" and path in ("/metrics", "/health"):
            return await self.gather(path, headers)
        body = bytearray()
        async for chunk in request.stream():  # one byte over the limit is enough for the replica's 413
            body += chunk
            if len(body) > self.max_body_bytes:
                break
        body = bytes(body)
        call = self.replicas.options(stream=True).call.remote(route_key(body, self.default_draft), request.method,
                                                             path, request.url.query.encode(), headers, body)
        try:
            status, head = await call.__anext__()
            head = {k.decode("latin-1"): v.decode("latin-1") for k, v in head}
            if head.get("content-type", "").startswith("text/event-stream"):
                return StreamingResponse(self.rest(call), status_code=status, headers=head)
            return Response(b"".join([chunk async for chunk in call]), status_code=status, headers=head)
        except GONE as err:
            self.totals.unavailable += 1
            return _unavailable(err)
        except asyncio.CancelledError:
            call.cancel()
            raise
        except Exception as err:  # a fault between here and the app: OpenAI's error body all the same
            return _error(500, f"internal error: {type(err).__name__}", "internal_error")

    async def rest(self, call):
        try:
            async for chunk in call:
                yield chunk
        except GONE as err:
            self.totals.unavailable += 1
            yield ("data: " + _unavailable(err).body.decode() + "\n\ndata: [DONE]\n\n").encode()
        finally:
            call.cancel()  # a no-op once done; else the client left: the replica's app sees it go

    async def fetch(self, route: str | None, path: str, headers) -> tuple[int, dict, bytes]:
        call = self.replicas.options(stream=True).call.remote(route, "GET", path, b"", headers, b"")

        async def whole():
            status, head = await call.__anext__()
            return status, {k.decode("latin-1"): v.decode("latin-1") for k, v in head}, b"".join(
                [chunk async for chunk in call])

        try:
            return await asyncio.wait_for(whole(), BROADCAST_SECONDS)
        except BaseException:
            call.cancel()
            raise

    async def replica_ids(self, headers) -> list[str]:
        app = serve.get_replica_context().app_name
        if app not in _registry():  # the handle makes its router on its first call
            await self.fetch(None, "/health", headers)
        router = _registry().get(app)
        return sorted(r.unique_id for r in router.curr_replicas) if router else []

    async def gather(self, path: str, headers) -> Response:
        """Every replica's answer to GET path, combined; a replica's refusal (e.g. 401) is passed on."""
        try:
            ids = await self.replica_ids(headers)
        except (*GONE, asyncio.TimeoutError) as err:
            return _unavailable(err)
        answers, failed = {}, []  # one at a time: calls made within one request share its id, which Ray's
        for i in ids:             # router matches on while they wait for a replica
            try:
                answers[i] = await self.fetch("replica:" + i, path, headers)
            except (*GONE, asyncio.TimeoutError) as err:  # a replica being replaced
                failed.append(err)
        if not answers:
            why = f" ({type(failed[0]).__name__}: {failed[0]})" if failed else ""
            return _error(503, f"no replica answered{why}; Ray Serve restarts them: retry", "replica_unavailable",
                          **{"Retry-After": "1"})
        refused = next((a for a in answers.values() if a[0] != 200), None)
        if refused is not None:
            return Response(refused[2], status_code=refused[0], headers=refused[1])
        if path == "/metrics":
            texts = {i: a[2].decode() for i, a in answers.items()}
            return Response(self.totals.exposition(texts, ids),
                            media_type=next(iter(answers.values()))[1]["content-type"])
        each = [json.loads(a[2]) for a in answers.values()]
        return JSONResponse({**each[0], "in_flight": sum(h["in_flight"] for h in each), "replicas": len(each)})


@dataclass(frozen=True)
class RayOptions:
    """`specdecode serve --ray`: the options every replica serves with (`serve.host` and `serve.port`:
    where Ray Serve's proxy listens), how many replicas, and the cluster; checked when made."""

    serve: ServeOptions
    replicas: int | None = None  # default 1; with autoscaling, how many start
    min_replicas: int | None = None  # either bound set: autoscaling
    max_replicas: int | None = None
    address: str | None = None  # the cluster to join (auto or HEAD:6379); None: start one on this machine

    def __post_init__(self) -> None:
        check_positive_settings(self, "replicas", "min_replicas", "max_replicas")
        check_positive_settings(self.serve, "threads")
        if self.min_replicas is not None or self.max_replicas is not None:
            low, high = self.bounds()
            if low > high:
                raise ValueError(f"--min-replicas {low} is above --max-replicas {high}")
            if self.replicas is not None and not low <= self.replicas <= high:
                raise ValueError(f"--replicas {self.replicas} is outside --min-replicas {low} .. --max-replicas {high}")

    def bounds(self) -> tuple[int, int]:
        """The autoscaling bounds: --min-replicas (default 1), --max-replicas (default: --replicas, at least
        --min-replicas)."""
        low = self.min_replicas or 1
        return low, self.max_replicas or max(low, self.replicas or 1)


def replica_options(options: RayOptions) -> dict:
    """The Replica deployment's options: a fixed count, or autoscaling bounds; one CPU per thread."""
    serving = options.serve
    result = dict(ray_actor_options={"num_cpus": serving.threads or 1},
                  max_ongoing_requests=serving.max_queue + serving.max_batch + SPARE_CALLS,
                  request_router_config=RequestRouterConfig(request_router_class=ConversationRouter))
    if options.min_replicas is None and options.max_replicas is None:
        result["num_replicas"] = options.replicas or 1
    else:
        low, high = options.bounds()
        result["autoscaling_config"] = AutoscalingConfig(min_replicas=low, max_replicas=high,
                                                         initial_replicas=options.replicas or low,
                                                         target_ongoing_requests=2)
    return result


def build(options: RayOptions):
    """The application: replicas each running build_app on the same serve options (one thread each
    unless --threads; the API key as the options carry it: $SPECDECODE_API_KEY was read where they
    were made), one ingress in front."""
    serving = replace(options.serve, threads=options.serve.threads or 1)
    replicas = Replica.options(**replica_options(options)).bind(serving)
    return Ingress.bind(replicas, serving.draft, serving.max_body_bytes)


def _gamma_value(text: str) -> int | str:
    return text if text == "auto" else int(text)


FLAGS = {"metrics_open", "ray"}
# `specdecode serve`'s options that take a value: how `serve run` reads it (a name: one of those choices)
VALUES = {"target": str, "draft": str, "backend": "backends", "draft_backend": "backends",
          "min_draft_confidence": float, "threads": int, "ctx_size": int, "prefix_memory": int,
          "kernels": "kernels", "dtype": str, "device": str, "also_draft": str, "gamma": _gamma_value,
          "max_gamma": int, "host": str, "port": int, "model_name": str, "max_batch": int, "prompt_rows": int,
          "max_queue": int, "max_tokens": int, "api_key": str, "max_body_bytes": int,
          "replicas": int, "min_replicas": int, "max_replicas": int, "address": str}
SCALING = ("replicas", "min_replicas", "max_replicas", "address")


def options_from_config(config: dict) -> RayOptions:
    """`serve run`'s KEY=VALUE pairs as options: the keys are `specdecode serve`'s options without the
    dashes (max_queue=4 is --max-queue 4); a flag takes true. The API key defaults to $SPECDECODE_API_KEY
    on the machine that deploys, as with `specdecode serve --ray`."""
    from ..models.load import BACKENDS
    from ..models.native.plan import PATHS

    choices = {"backends": BACKENDS, "kernels": ("auto", *PATHS)}
    given, values, refused = [], {}, False
    for key, value in config.items():
        key, text = str(key), str(value)
        flag = text.lower() == "true"
        given += [option_name(key)] if flag else [option_name(key), text]
        read = VALUES.get(key)
        if key in FLAGS and flag:
            values[key] = True
        elif read is None or flag:  # not an option, or a flag given a value, or an option given none
            refused = True
        elif read in choices:
            refused |= text not in choices[read]
            values[key] = text
        else:
            try:
                values[key] = read(text)
            except ValueError:
                refused = True
    if refused:  # the whole line, as the command line's parser refused it
        raise ValueError(f"these options are not `specdecode serve`'s: {' '.join(given)}")
    serving = {k: v for k, v in values.items() if k not in (*SCALING, "ray", "min_draft_confidence")}
    if "also_draft" in serving:
        serving["also_drafts"] = (serving.pop("also_draft"),)
    if "model_name" in serving:
        serving["model_names"] = (serving.pop("model_name"),)
    serving["api_key"] = api_key_from_environment(serving.get("api_key"))
    return RayOptions(ServeOptions(**serving), **{k: values[k] for k in SCALING if k in values})


def app_builder(config: dict):
    """For `serve run specdecode.server.ray:app_builder KEY=VALUE ...` (see options_from_config)."""
    return build(options_from_config(config))


def serve_on_ray(options: RayOptions) -> int:
    """`specdecode serve --ray`: deploy on the cluster at --address (default: a new one on this machine),
    serve HTTP at --host:--port until interrupted, then remove the application."""
    app = build(options)
    host, port = options.serve.host, options.serve.port
    if options.address is None:
        ray.init(address="local", include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    else:
        ray.init(address=options.address, logging_level="WARNING", log_to_driver=False)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop like Ctrl-C: the cleanup below runs
    try:
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(app, name=APP, route_prefix="/")
        except RuntimeError as err:  # a replica failed to start: its own error is the last line
            raise ValueError(f"the Ray Serve application failed to start: {str(err).strip().splitlines()[-1]}") from None
        deployment = replica_options(options)
        count = (f"{deployment['num_replicas']} replica(s)" if "num_replicas" in deployment else
                 f"{deployment['autoscaling_config'].min_replicas}..{deployment['autoscaling_config'].max_replicas} "
                 "replicas")
        print(f"specdecode: serving on Ray ({count} of {options.serve.threads or 1} thread(s)) at "
              f"http://{host}:{port}/v1", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        if options.address is None:
            serve.shutdown()
        else:
            serve.delete(APP)
        ray.shutdown()
