"""GET / : the server's own page (`static/`): a chat with the served model that shows how each token
came (the paper's Figure 1, from the `trace` extension), the last reply's target calls over time
and its acceptance, and a live panel over /metrics. Plain files, no build step and
nothing fetched from elsewhere: the page works offline.

The page and its files are open, as /health is, even where an API key guards the server (its own
calls to the API send the key the user enters); they are not API operations, so /openapi.json
leaves them out.
"""

from __future__ import annotations

from importlib import resources

from fastapi.responses import Response

from ..request import RequestError

# the page's files: name -> content type
ASSETS = {"index.html": "text/html; charset=utf-8", "page.js": "text/javascript; charset=utf-8",
          "page.css": "text/css; charset=utf-8"}
PREFIX = "/page/"
PATHS = {"/", *(PREFIX + name for name in ASSETS)}  # what the API key does not guard
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
           "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"}


def _file(name: str) -> Response:
    body = resources.files("specdecode.server").joinpath("static", name).read_bytes()
    return Response(body, media_type=ASSETS[name], headers=HEADERS)


async def index():
    return _file("index.html")


async def asset(name: str):
    if name not in ASSETS:
        raise RequestError(404, f"the page has no file {name!r}", None, "not_found")
    return _file(name)
