"""`specdecode serve`: the parsed options become one `ServeOptions`, served here (build_app under
uvicorn) or handed to Ray Serve (--ray), whose replicas each build the same app from them."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from .loading import use_kernels

if TYPE_CHECKING:  # imported where used: the server's modules load fastapi
    from ..server.build import ServeOptions
    from ..server.ray import RayOptions


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """`serve`'s arguments as options, checked (ValueError); the API key from
    $SPECDECODE_API_KEY where --api-key is not given."""
    from ..server.build import ServeOptions, api_key_from_environment

    return ServeOptions(target=args.target, backend=args.backend, dtype=args.dtype, device=args.device,
                        threads=args.threads, ctx_size=args.ctx_size, kernels=args.kernels, draft=args.draft,
                        also_drafts=tuple(args.also_draft), draft_backend=args.draft_backend, gamma=args.gamma,
                        max_gamma=args.max_gamma, model_names=tuple(args.model_name or ()), max_batch=args.max_batch,
                        prompt_rows=args.prompt_rows, prefix_memory=args.prefix_memory,
                        max_queue=args.max_queue, max_tokens=args.max_tokens,
                        api_key=api_key_from_environment(args.api_key), metrics_open=args.metrics_open,
                        max_body_bytes=args.max_body_bytes, host=args.host, port=args.port)


def ray_options(args: argparse.Namespace, options: ServeOptions | None = None) -> RayOptions:
    """`serve --ray`'s arguments as options: `options` (default: made from the same
    arguments) for every replica, and the replicas' count and cluster; checked (ValueError)."""
    from ..server.ray import RayOptions

    return RayOptions(serve_options(args) if options is None else options, replicas=args.replicas,
                      min_replicas=args.min_replicas, max_replicas=args.max_replicas, address=args.address)


def cmd_serve(args: argparse.Namespace) -> int:
    """`specdecode serve`: serve until interrupted."""
    import uvicorn

    from ..server.build import build_app

    options = serve_options(args)
    if options.api_key is None and not _loopback(options.host):
        print(f"specdecode: warning: serving on {options.host} without an API key: anyone who can reach this port "
              "can use the model; set SPECDECODE_API_KEY (or --api-key)", file=sys.stderr, flush=True)
    drafts = options.drafts()  # each checked before anything starts
    if args.ray:  # build_app on every replica of a Ray Serve application
        from ..server.ray import serve_on_ray

        return serve_on_ray(ray_options(args, options))
    if (args.replicas, args.min_replicas, args.max_replicas, args.address) != (None,) * 4:
        raise ValueError("--replicas, --min-replicas, --max-replicas and --address need --ray")
    use_kernels(options.kernels)
    served = build_app(options, _load_target(options))
    print(f"specdecode: serving {', '.join(served.names)} (drafts: {', '.join(drafts)}; gamma {options.gamma}) on "
          f"http://{options.host}:{options.port}/v1", flush=True)
    # the server's own errors (every 5xx, with its id and traceback) on stderr
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        uvicorn.run(served.app, host=options.host, port=options.port, log_level="warning")
    finally:
        served.engine.close()
    return 0


def _load_target(options: ServeOptions):
    """The target, loaded here before the app is built (where a test stops `serve`)."""
    from ..server.build import load_target

    return load_target(options)


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
