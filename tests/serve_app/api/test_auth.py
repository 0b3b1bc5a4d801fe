"""Authentication at the HTTP edge: the mesh's claims header, the HS256 eval token (header or
cookie), REQUIRE_AUTH=false, and a fuzz table of malformed credentials: each one a 401 with
the error envelope and a clear message, never a 500, never echoing the secret."""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import httpx
import jwt
import pytest
from api_helpers import (
    ADMIN,
    CLAIMS,
    NORTHWIND_STAFF,
    SECRET,
    FakeBackend,
    b64,
    b64url,
    expect_401,
    hs256_with_header,
    is_envelope,
    unsigned,
)
from cryptography.hazmat.primitives.asymmetric import rsa

from foundation.eval_tokens import mint_eval_token
from foundation.settings import Settings
from local_world.servers import run_in_thread
from serve_app.auth import (
    EVAL_TOKEN_COOKIE,
    AuthenticationError,
    authenticate,
)

AppFactory = Callable[..., tuple[Any, FakeBackend]]
ClientFactory = Callable[..., httpx.AsyncClient]


def claims_header(value: str | bytes) -> dict[bytes, bytes]:
    """The claims header as raw bytes (so non-ASCII values go through as sent)."""
    return {CLAIMS.encode(): value if isinstance(value, bytes) else value.encode("latin-1")}


def payload(**overrides: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {
        "sub": "eve",
        "roles": ["admin"],
        "domains": ["acme"],
        "exp": int(time.time()) + 86_400,  # built at import: must outlive a long suite
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)

NOW = time.time()
BAD_CLAIMS: dict[str, str | bytes] = {
    "not base64": "!!! definitely not base64 !!!",
    "base64 of non-JSON": b64("hello world"),
    "base64 of non-UTF-8": b64(b"\xff\xfe\xfd"),
    "JSON number": b64("5"),
    "JSON list": b64("[]"),
    "JSON null": b64("null"),
    "sub not a string": b64(json.dumps({"sub": 5, "roles": []})),
    "empty sub": b64(json.dumps({"sub": "  ", "roles": []})),
    "no sub": b64(json.dumps({"roles": ["admin"]})),
    "memberships not a list": b64(json.dumps({"sub": "a", "memberships": "admin"})),
    "membership not an object": b64(json.dumps({"sub": "a", "memberships": ["admin"]})),
    "membership domain not a string": b64(
        json.dumps({"sub": "a", "memberships": [{"domain": 1, "role": "admin"}]})
    ),
    "roles not a list": b64(json.dumps({"sub": "a", "roles": "admin"})),
    "roles of numbers": b64(json.dumps({"sub": "a", "roles": [1, 2]})),
    "neither shape": b64(json.dumps({"sub": "a"})),
    "empty header": "",
    "huge header": "A" * 20_000,
    "latin-1 bytes": b"\xe9\xe8\xff",
}

with warnings.catch_warnings():
    warnings.simplefilter("ignore", jwt.InsecureKeyLengthWarning)  # HS512 with a 37-byte key
    HS512_TOKEN = jwt.encode(payload(), SECRET, algorithm="HS512")

BAD_TOKENS: dict[str, str] = {
    "alg none": unsigned({"alg": "none", "typ": "JWT"}, payload()),
    "alg none, uppercase": unsigned({"alg": "NONE", "typ": "JWT"}, payload()),
    "HS512 with the right secret": HS512_TOKEN,
    "RS256": jwt.encode(payload(), RSA_KEY, algorithm="RS256"),
    "RS256 header, HMAC signature": hs256_with_header({"alg": "RS256"}, payload(), SECRET),
    "no alg": unsigned({"typ": "JWT"}, payload()),
    "wrong secret": mint_eval_token("another-secret-that-is-long-enough!!", "eve", ["admin"]),
    "tampered payload": (
        lambda t: (
            t.split(".")[0]
            + "."
            + b64url(json.dumps(payload(sub="root")).encode())
            + "."
            + t.split(".")[2]
        )
    )(mint_eval_token(SECRET, "eve", ["standard_customer"])),
    "expired": mint_eval_token(SECRET, "eve", ["admin"], ttl=-3600),
    "nbf in the future": mint_eval_token(SECRET, "eve", ["admin"], extra={"nbf": NOW + 3600}),
    "iat in the future": mint_eval_token(SECRET, "eve", ["admin"], now=NOW + 3600),
    "missing sub": jwt.encode(payload(sub=None), SECRET, algorithm="HS256"),
    "sub not a string": jwt.encode(payload(sub=42), SECRET, algorithm="HS256"),
    "missing exp": jwt.encode(payload(exp=None), SECRET, algorithm="HS256"),
    "exp not a number": jwt.encode(payload(exp="tomorrow"), SECRET, algorithm="HS256"),
    "roles not a list": jwt.encode(payload(roles="admin"), SECRET, algorithm="HS256"),
    "no roles or domains": jwt.encode(
        {"sub": "eve", "exp": int(NOW) + 86_400}, SECRET, algorithm="HS256"
    ),
    "two segments": "abc.def",
    "garbage": "not-a-jwt-at-all",
    "non-JSON header": "bm90anNvbg.e30.c2ln",
    "oversized": "a" * 9000,
}


# --- the fuzz table over HTTP ---------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(BAD_CLAIMS))
async def test_malformed_claims_headers_are_401(
    case: str, fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    client = asgi_client(app)
    response = await client.get("/ingest/some-run", headers=claims_header(BAD_CLAIMS[case]))
    await expect_401(response, says="invalid x-gateway-claims header")
    assert fake.asks == []


@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
@pytest.mark.parametrize("carrier", ["bearer", "cookie"])
async def test_bad_eval_tokens_are_401(
    case: str, carrier: str, fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    token = BAD_TOKENS[case]
    if carrier == "bearer":
        client = asgi_client(app)
        response = await client.get("/ingest/x", headers={"authorization": f"Bearer {token}"})
    else:
        client = asgi_client(app, cookies={EVAL_TOKEN_COOKIE: token})
        response = await client.get("/ingest/x")
    await expect_401(response)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("alg none", "only HS256"),
        ("HS512 with the right secret", "only HS256"),
        ("RS256", "only HS256"),
        ("RS256 header, HMAC signature", "only HS256"),
        ("wrong secret", "signature does not verify"),
        ("tampered payload", "signature does not verify"),
        ("expired", "expired"),
        ("nbf in the future", "not valid yet"),
        ("iat in the future", "not valid yet"),
        ("missing sub", "'sub'"),
        ("sub not a string", "'sub'"),
        ("missing exp", "'exp'"),
        ("roles not a list", "'roles' must be a list of strings"),
        ("garbage", "not a well-formed JWT"),
        ("oversized", "too large"),
    ],
)
async def test_token_rejections_say_why(
    case: str, message: str, fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    response = await asgi_client(app).get(
        "/ingest/x", headers={"authorization": f"Bearer {BAD_TOKENS[case]}"}
    )
    await expect_401(response, says=message)


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        ("Basic dXNlcjpwYXNz", "unsupported Authorization scheme"),
        ("Bearer", "empty bearer token"),
        ("Bearer    ", "empty bearer token"),
        ("Token abc", "unsupported Authorization scheme"),
    ],
)
async def test_bad_authorization_headers(
    authorization: str, message: str, fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    response = await asgi_client(app).get("/ingest/x", headers={"authorization": authorization})
    await expect_401(response, says=message)


async def test_no_credentials_is_401_naming_what_to_send(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    response = await asgi_client(app).post("/ask", json={"question": "hi"})
    await expect_401(response, says="x-gateway-claims")
    assert "Bearer" in response.json()["error"]["message"]


# --- what is accepted -----------------------------------------------------------------------------


async def test_mesh_claims_are_the_caller(fake_app: AppFactory, asgi_client: ClientFactory) -> None:
    app, fake = fake_app()
    response = await asgi_client(app).post("/ask", json={"question": "hi"}, headers=NORTHWIND_STAFF)
    assert response.status_code == 200, response.text
    user = fake.asks[0][0]
    assert (user.sub, user.roles, user.domains) == ("nina", ("business_staff",), ("northwind",))
    assert user.claims_header == NORTHWIND_STAFF[CLAIMS]  # forwarded verbatim downstream


@pytest.mark.parametrize("carrier", ["bearer", "cookie", "lowercase bearer"])
async def test_valid_eval_token_from_header_or_cookie(
    carrier: str, fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    token = mint_eval_token(SECRET, "eve", ["business_admin"], ["acme", "civic"], ttl=60)
    if carrier == "cookie":
        client = asgi_client(app, cookies={EVAL_TOKEN_COOKIE: token})
        response = await client.post("/ask", json={"question": "hi"})
    else:
        scheme = "bearer" if carrier.startswith("lowercase") else "Bearer"
        response = await asgi_client(app).post(
            "/ask", json={"question": "hi"}, headers={"authorization": f"{scheme} {token}"}
        )
    assert response.status_code == 200, response.text
    user = fake.asks[0][0]
    assert (user.sub, user.roles, user.domains) == ("eve", ("business_admin",), ("acme", "civic"))
    assert user.claims_header is None  # downstream gets an equivalent flat header


async def test_memberships_inside_an_eval_token_are_flattened_too(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, fake = fake_app()
    token = jwt.encode(
        {
            "sub": "m",
            "exp": int(time.time()) + 60,
            "memberships": [{"domain": "acme", "role": "business_staff"}],
        },
        SECRET,
        algorithm="HS256",
    )
    response = await asgi_client(app).post(
        "/ask", json={"question": "hi"}, headers={"authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200
    assert fake.asks[0][0].roles == ("business_staff",)


async def test_the_claims_header_wins_over_a_token(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app()
    headers = {**ADMIN, "authorization": f"Bearer {BAD_TOKENS['garbage']}"}
    response = await asgi_client(app).get("/ingest/nope", headers=headers)
    assert response.status_code == 404  # authenticated as the admin of the header
    # ... and an invalid header is not rescued by a valid token
    token = mint_eval_token(SECRET, "eve", ["admin"])
    headers = {CLAIMS: "%%%", "authorization": f"Bearer {token}"}
    await expect_401(await asgi_client(app).get("/ingest/nope", headers=headers))


async def test_eval_path_is_off_without_a_secret(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    app, _ = fake_app(eval_jwt_secret=None)
    token = mint_eval_token(SECRET, "eve", ["admin"])
    response = await asgi_client(app).get("/ingest/x", headers={"authorization": f"Bearer {token}"})
    await expect_401(response, says="token authentication is disabled")
    response = await asgi_client(app).get("/ingest/x")
    await expect_401(response)
    assert "Bearer" not in response.json()["error"]["message"]


# --- REQUIRE_AUTH=false ---------------------------------------------------------------------------


async def test_require_auth_false_gives_an_anonymous_user(
    fake_app: AppFactory, asgi_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="serve_app.auth"):
        app, fake = fake_app(require_auth=False)
    assert any("REQUIRE_AUTH=false" in r.getMessage() for r in caplog.records)
    client = asgi_client(app)
    response = await client.post("/ask", json={"question": "hi"})
    assert response.status_code == 200
    user = fake.asks[0][0]
    assert user.anonymous and user.roles == () and user.acl_entries == []
    # anonymous is no admin
    forbidden = await client.post("/ingest")
    assert forbidden.status_code == 403 and is_envelope(forbidden.json(), "forbidden")
    # credentials that are sent are still verified: no silent downgrade to anonymous
    bad = await client.get("/ingest/x", headers={"authorization": "Bearer nope"})
    await expect_401(bad)
    await expect_401(await client.get("/ingest/x", headers={CLAIMS: "%%%"}))


def test_no_warning_when_auth_is_required(
    fake_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="serve_app.auth"):
        fake_app(require_auth=True)
    assert not any("REQUIRE_AUTH=false" in r.getMessage() for r in caplog.records)


# --- the plain function ---------------------------------------------------------------------------


def test_authenticate_takes_plain_dicts_in_any_case(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    user = authenticate({"X-Gateway-Claims": ADMIN[CLAIMS]}, {}, settings)
    assert user.sub == "root" and user.is_admin
    token = mint_eval_token(SECRET, "eve", ["business_staff"], ["acme"])
    user = authenticate({"Authorization": f"Bearer {token}"}, {}, settings)
    assert user.sub == "eve"
    user = authenticate({}, {EVAL_TOKEN_COOKIE: token}, settings)
    assert user.sub == "eve"
    with pytest.raises(AuthenticationError) as info:
        authenticate({}, {}, settings)
    assert info.value.status == 401


def test_mint_eval_token_round_trip() -> None:
    token = mint_eval_token(SECRET, "eve", ["admin"], ["acme"], ttl=120, now=1_000_000)
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    claims = jwt.decode(token, SECRET, algorithms=["HS256"], options={"verify_exp": False})
    assert claims == {
        "sub": "eve",
        "roles": ["admin"],
        "domains": ["acme"],
        "iat": 1_000_000,
        "exp": 1_000_120,
    }
    with pytest.raises(ValueError):
        mint_eval_token("", "eve")


# --- over real HTTP -------------------------------------------------------------------------------


async def test_malformed_credentials_over_real_http_are_never_500(fake_app: AppFactory) -> None:
    app, _ = fake_app()
    with run_in_thread(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            for name, value in BAD_CLAIMS.items():
                if name == "huge header":
                    value = "A" * 12_000  # under the HTTP server's own header limit
                response = await client.get("/ingest/x", headers=claims_header(value))
                await expect_401(response)
            for token in BAD_TOKENS.values():
                response = await client.get(
                    "/ingest/x", headers={"authorization": f"Bearer {token}"}
                )
                await expect_401(response)
            # Past the server's header limit the HTTP server answers itself: still no 500.
            response = await client.get("/ingest/x", headers={CLAIMS: "A" * 70_000})
            assert 400 <= response.status_code < 500
