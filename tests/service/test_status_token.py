"""A browser opening the status page without a token is told how to pass one (an HTML page,
401); API clients still get the JSON error envelope."""

from __future__ import annotations

import httpx

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def test_a_browser_without_a_token_gets_a_page_saying_how_to_pass_one(
    served: tuple[str, dict[str, str]],
) -> None:
    url, tokens = served
    for path in ("/", "/v1/status"):
        page = httpx.get(f"{url}{path}", headers=BROWSER)
        assert page.status_code == 401
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["www-authenticate"] == "Bearer"
        assert f"<code>{path}?token=YOUR_TOKEN</code>" in page.text
        assert "serves its status to callers with a token" in page.text
    wrong = httpx.get(f"{url}/", params={"token": "not-a-token"}, headers=BROWSER)
    assert wrong.status_code == 401
    assert "The token given is not one this service knows" in wrong.text
    opened = httpx.get(f"{url}/", params={"token": tokens["read"]}, headers=BROWSER)
    assert opened.status_code == 200
    assert 'id="topology-section"' in opened.text


def test_api_clients_still_get_the_json_error(served: tuple[str, dict[str, str]]) -> None:
    url, _ = served
    for path, accept in (("/", "*/*"), ("/v1/status", "application/json"), ("/v1/tables", None)):
        headers = {} if accept is None else {"Accept": accept}
        refused = httpx.get(f"{url}{path}", headers=headers)
        assert refused.status_code == 401
        assert refused.json()["error"] == "AuthenticationError"
    # other routes answer JSON even to a browser: only the status page is for people
    assert httpx.get(f"{url}/v1/tables", headers=BROWSER).json()["error"] == "AuthenticationError"
