"""What a browser sees when it opens the status page without a (known) token: a short page
saying how to pass one, rather than the API's JSON 401 (which asks for an ``Authorization``
header a browser cannot send). API clients, which do not ask for HTML, still get the JSON
error envelope."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from starlette.responses import HTMLResponse

from lockstep.service.auth import URL_TOKEN_ROUTES
from lockstep.service.status_style import PAGE_CSS

# the page says to pass a token in the URL: it is shown where one is taken, and only there
STATUS_PATHS = frozenset(URL_TOKEN_ROUTES)


def wants_token_page(method: str, path: str, headers: Mapping[str, str]) -> bool:
    """Whether a refused request is a browser opening a status route: a GET (or HEAD) of
    one that accepts HTML (browsers send ``Accept: text/html,...``; httpx, curl and the
    Lockstep client send ``*/*`` or JSON)."""
    accept = headers.get("accept", "").lower()
    return method in ("GET", "HEAD") and path in STATUS_PATHS and "text/html" in accept


def token_page(path: str, *, presented: bool) -> HTMLResponse:
    """401, as HTML: how to open ``path`` with a token (``?token=``)."""
    why = (
        "The token given is not one this service knows."
        if presented
        else "This Lockstep coordinator serves its status to callers with a token."
    )
    example = escape(f"{path}?token=YOUR_TOKEN")
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Lockstep status: a token is needed</title>
<style>{PAGE_CSS}</style></head>
<body><header class="top"><h1>Lockstep</h1></header>
<main id="token-needed"><section><h2>A token is needed</h2>
<p>{why} Open this page with a read (or admin) token from the service's token file in
its address:</p>
<p><code>{example}</code></p>
<p>Scripts and API clients send the header <code>Authorization: Bearer TOKEN</code>
instead.</p></section></main></body></html>"""
    return HTMLResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
