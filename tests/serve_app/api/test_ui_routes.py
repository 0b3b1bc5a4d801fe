"""The chat page's routes in-process (``serve_app.api.routes.ui``): the page and its files
with a strict CSP, the session endpoint, and the development sign-in, which exists only with
``REQUIRE_AUTH=false`` or ``EVAL_JWT_SECRET`` (absent otherwise: 404, no route at all)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from api_helpers import ADMIN, NORTHWIND_STAFF, SECRET

from foundation.roles import ROLE_WEIGHTS
from local_world.world import build_world
from local_world.world_file import WORLDS_DIR
from serve_app.auth import EVAL_TOKEN_COOKIE, verify_eval_token
from serve_app.ui import CONTENT_SECURITY_POLICY, STATIC_DIR
from serve_app.ui.dev_users import DEV_USERS

App = Callable[..., tuple[Any, Any]]
Client = Callable[..., httpx.AsyncClient]

PRODUCTION = {"eval_jwt_secret": None, "require_auth": True}


def _csp(response: httpx.Response) -> dict[str, str]:
    policy = response.headers["content-security-policy"]
    return {d.split()[0]: d.partition(" ")[2] for d in policy.split("; ")}


async def test_the_page_is_served_with_a_strict_csp(fake_app: App, asgi_client: Client) -> None:
    app, _ = fake_app(**PRODUCTION)
    client = asgi_client(app)
    redirect = await client.get("/ui")
    assert redirect.status_code == 307 and redirect.headers["location"] == "/ui/"
    page = await client.get("/ui/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = _csp(page)
    assert csp["default-src"] == "'self'"
    assert csp["script-src"] == "'self'" and csp["style-src"] == "'self'"
    assert "unsafe" not in page.headers["content-security-policy"]
    assert csp["object-src"] == "'none'" and csp["frame-ancestors"] == "'none'"
    assert page.headers["x-content-type-options"] == "nosniff"
    # no inline script or style, nothing from another origin
    assert "<script>" not in page.text and "<style" not in page.text and "style=" not in page.text
    assert "http://" not in page.text and "https://" not in page.text
    assert 'src="js/app.js"' in page.text


@pytest.mark.parametrize(
    ("path", "media"),
    [
        ("js/app.js", "text/javascript"),
        ("style.css", "text/css"),
        ("vendor/marked/marked.esm.js", "text/javascript"),
        ("vendor/dompurify/purify.es.mjs", "text/javascript"),
        ("vendor/eventsource-parser/index.js", "text/javascript"),
    ],
)
async def test_static_files_are_served_with_the_headers(
    fake_app: App, asgi_client: Client, path: str, media: str
) -> None:
    app, _ = fake_app(**PRODUCTION)
    response = await asgi_client(app).get(f"/ui/{path}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith(media)
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


async def test_no_file_outside_the_static_folder(fake_app: App, asgi_client: Client) -> None:
    app, _ = fake_app(**PRODUCTION)
    client = asgi_client(app)
    for path in ("/ui/../auth.py", "/ui/%2e%2e/__init__.py", "/ui/nope.js"):
        assert (await client.get(path)).status_code == 404, path


async def test_the_page_lives_under_the_api_prefix(fake_app: App, asgi_client: Client) -> None:
    app, _ = fake_app(api_prefix="/agent", **PRODUCTION)
    client = asgi_client(app)
    assert (await client.get("/agent/ui")).headers["location"] == "/agent/ui/"
    assert (await client.get("/agent/ui/")).status_code == 200
    assert (await client.get("/ui/")).status_code == 404
    session = (await client.get("/agent/ui/session", headers=NORTHWIND_STAFF)).json()
    assert session["api_prefix"] == "/agent"


async def test_the_page_is_not_in_the_api_schema(fake_app: App, asgi_client: Client) -> None:
    app, _ = fake_app()
    schema = (await asgi_client(app).get("/openapi.json")).json()
    assert not [p for p in schema["paths"] if p.startswith("/ui")]


async def test_dev_sign_in_is_absent_when_auth_is_on(fake_app: App, asgi_client: Client) -> None:
    app, _ = fake_app(**PRODUCTION)
    client = asgi_client(app)
    assert not [r for r in app.routes if "/dev/" in getattr(r, "path", "")]
    assert (await client.get("/ui/dev/users")).status_code == 404
    signed = await client.post("/ui/dev/sign-in", json={"user": "eve"})
    assert signed.status_code in (404, 405)
    assert EVAL_TOKEN_COOKIE not in signed.cookies
    session = (await client.get("/ui/session")).json()
    assert session["dev_sign_in"] is False and session["user"] is None
    assert "x-gateway-claims" in session["unauthenticated_reason"]


@pytest.mark.parametrize("client_host", ["203.0.113.5", "10.0.0.7", "::ffff:192.0.2.1"])
async def test_dev_sign_in_answers_this_machine_only(
    fake_app: App, asgi_client: Client, client_host: str
) -> None:
    """With EVAL_JWT_SECRET it mints any local user's token, an admin's too: a caller from
    elsewhere gets exactly the 404 of a service without it, and no cookie."""
    app, _ = fake_app(eval_jwt_secret=SECRET, require_auth=True)
    remote = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=(client_host, 40000)),
        base_url="http://testserver",
    )
    async with remote:
        users = await remote.get("/ui/dev/users")
        signed = await remote.post("/ui/dev/sign-in", json={"user": "ada"})
    production, _ = fake_app(**PRODUCTION)
    absent = await asgi_client(production).get("/ui/dev/users")
    assert users.status_code == signed.status_code == 404
    assert users.content == absent.content
    assert signed.json()["error"]["code"] == "not_found"
    assert EVAL_TOKEN_COOKIE not in signed.cookies
    here = await asgi_client(app).get("/ui/dev/users")  # the test client is 127.0.0.1
    assert here.status_code == 200


async def test_session_says_what_the_caller_may_see(fake_app: App, asgi_client: Client) -> None:
    app, _ = fake_app(
        **PRODUCTION,
        allowed_models=["local/scripted", "local/other"],
        answer_model="local/scripted",
    )
    client = asgi_client(app)
    staff = (await client.get("/ui/session", headers=NORTHWIND_STAFF)).json()["user"]
    assert staff["roles"] == ["business_staff"] and staff["domains"] == ["northwind"]
    assert staff["can_override_model"] is False and staff["models"] == []
    assert staff["can_ingest"] is False
    admin = (await client.get("/ui/session", headers=ADMIN)).json()["user"]
    assert admin["can_override_model"] is True
    assert admin["models"] == ["local/scripted", "local/other"]
    assert admin["can_ingest"] is True


async def test_dev_sign_in_mints_an_httponly_cookie_server_side(
    fake_app: App, asgi_client: Client
) -> None:
    app, _ = fake_app(eval_jwt_secret=SECRET, require_auth=True)
    client = asgi_client(app)
    users = (await client.get("/ui/dev/users")).json()["users"]
    assert [u["id"] for u in users] == [u.id for u in DEV_USERS]
    assert SECRET not in json.dumps(users)
    signed = await client.post("/ui/dev/sign-in", json={"user": "bram"})
    assert signed.status_code == 200 and signed.json() == {"mode": "cookie", "user": "bram"}
    assert SECRET not in signed.text
    cookie = signed.headers["set-cookie"]
    assert "httponly" in cookie.lower()
    assert "samesite=strict" in cookie.lower()
    user = verify_eval_token(signed.cookies[EVAL_TOKEN_COOKIE], SECRET)
    assert (user.sub, user.roles, user.domains) == ("bram", ("business_admin",), ("northwind",))
    session = (await client.get("/ui/session")).json()["user"]
    assert session["sub"] == "bram"
    assert (await client.post("/ui/dev/sign-in", json={"user": "mallory"})).status_code == 404
    out = await client.post("/ui/dev/sign-out")
    assert out.status_code == 200
    assert (await client.get("/ui/session")).json()["user"] is None


async def test_without_a_secret_dev_sign_in_hands_back_the_claims(
    fake_app: App, asgi_client: Client
) -> None:
    app, _ = fake_app(eval_jwt_secret=None, require_auth=False)
    client = asgi_client(app)
    anonymous = (await client.get("/ui/session")).json()["user"]
    assert anonymous["anonymous"] is True
    signed = (await client.post("/ui/dev/sign-in", json={"user": "carla"})).json()
    assert signed["mode"] == "header"
    payload = json.loads(base64.b64decode(signed["claims"]))
    assert payload == {
        "sub": "carla",
        "memberships": [{"domain": "acme", "role": "standard_customer"}],
    }
    session = await client.get("/ui/session", headers={"x-gateway-claims": signed["claims"]})
    assert session.json()["user"]["sub"] == "carla"


async def test_dev_users_are_the_users_of_the_world_served(
    fake_app: App, asgi_client: Client
) -> None:
    second = WORLDS_DIR / "second.yaml"
    app, _ = fake_app(eval_jwt_secret=None, require_auth=False, local_world_file=second)
    client = asgi_client(app)
    users = (await client.get("/ui/dev/users")).json()["users"]
    assert [u["id"] for u in users] == ["ines", "tomas", "mei", "ravi", "ops"]
    domains = {d.id for d in build_world(path=second).domains} | {"crowdvision-ops"}
    assert {d for u in users for d in u["domains"]} == domains
    assert {r for u in users for r in u["roles"]} == set(ROLE_WEIGHTS)  # every role is shown
    signed = (await client.post("/ui/dev/sign-in", json={"user": "ravi"})).json()
    payload = json.loads(base64.b64decode(signed["claims"]))
    assert payload["memberships"] == [
        {"domain": "aurelia-health", "role": "standard_customer"},
        {"domain": "tidewater.edu", "role": "standard_customer"},
    ]
    # the sample's users are not the second world's
    assert (await client.post("/ui/dev/sign-in", json={"user": "nina"})).status_code == 404


def test_dev_users_live_in_the_local_world() -> None:
    domains = {d.id for d in build_world().domains} | {"crowdvision-ops"}
    roles = set(ROLE_WEIGHTS)
    for user in DEV_USERS:
        assert set(user.domains) <= domains and set(user.roles) <= roles
    assert {r for u in DEV_USERS for r in u.roles} == roles  # every role is shown


def test_vendored_modules_match_the_lockfile() -> None:
    lock = json.loads((STATIC_DIR.parent / "npm" / "package-lock.json").read_text())
    versions = (STATIC_DIR / "vendor" / "VERSIONS.txt").read_text().splitlines()
    for line in versions:
        name, version = line.split()[:2]
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
        assert (STATIC_DIR / "vendor" / name / "LICENSE").is_file()


def test_serve_prints_how_to_sign_in_to_the_page(make_settings: Callable[..., Any]) -> None:
    from serve_app.cli.serve import chat_sign_in

    assert "development sign-in" in chat_sign_in(make_settings(eval_jwt_secret=SECRET))
    assert "development sign-in" in chat_sign_in(
        make_settings(eval_jwt_secret=None, require_auth=False)
    )
    production = chat_sign_in(make_settings(eval_jwt_secret=None, require_auth=True))
    assert "x-gateway-claims" in production and "EVAL_JWT_SECRET" in production


async def test_a_stream_the_client_closes_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """What the stop button does to the server: the SSE generator is closed mid-stream; the
    backend's iterator is closed (cancelling the model call and tools), and it is logged."""
    import asyncio
    import logging
    from collections.abc import AsyncIterator

    from agent.answer import AgentEvent, TokenEvent
    from serve_app.api.routes.ask import sse_events

    closed = asyncio.Event()

    async def events() -> AsyncIterator[AgentEvent]:
        try:
            yield TokenEvent(text="a")
            await asyncio.sleep(30)
            yield TokenEvent(text="b")
        finally:
            closed.set()

    stream = sse_events(events(), "req-stop-1")
    with caplog.at_level(logging.INFO, logger="serve_app.api.routes.ask"):
        first = await anext(stream)
        assert first.event == "token"
        await stream.aclose()
    assert closed.is_set()
    assert "answer stream cancelled by the client (request_id=req-stop-1)" in caplog.text
