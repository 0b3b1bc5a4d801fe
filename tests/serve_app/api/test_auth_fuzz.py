"""Auth fuzzing at the HTTP edge (issue 8, item 3): property-based and adversarial
credentials against the real app (``create_app`` with the real Cedar policies) over ASGI, and
the huge-header cases over real HTTP (uvicorn).

The property: whatever credential a client sends - a claims header that is not base64, base64
of non-JSON, JSON of the wrong shape or types, nested past the parser's limit, lone
surrogates, 64 KB headers, JWTs with ``alg: none``, another algorithm (RS256, ES256, PS256,
HS384, HS512), the wrong secret, expired, not yet valid, without ``sub``, repeated credential
headers, a bad header next to a good cookie... - the answer is a 401 with the error envelope,
``WWW-Authenticate: Bearer`` and no secret in it; never a 500, and the backend is never
called. ``test_auth.py`` holds the readable table of single cases; this module generates them.

Every test prints how many credentials it tried (``pytest -s`` shows the counts).
"""

from __future__ import annotations

import base64
import json
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
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from foundation.eval_tokens import mint_eval_token
from local_world.claims import ClaimsError, parse_claims
from local_world.servers import run_in_thread
from serve_app.auth import CLOCK_SKEW_SECONDS, EVAL_TOKEN_COOKIE

AppFactory = Callable[..., tuple[Any, FakeBackend]]
ClientFactory = Callable[..., httpx.AsyncClient]

FUZZ = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same cases in CI every time: a failure is reproducible
)
HUGE = 64 * 1024

# Endpoints that need a caller: an ``/ask`` that would succeed (so a credential wrongly
# accepted shows as a 200), and the admin-only ``/ingest`` (a Cedar decision on the caller).
ENDPOINTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/ask", {"question": "hi"}),
    ("POST", "/ingest", None),
    ("GET", "/ingest/run-1", None),
]


async def send(
    client: httpx.AsyncClient,
    endpoint: tuple[str, str, dict[str, Any] | None],
    headers: dict[bytes, bytes] | dict[str, str] | None = None,
    cookies: dict[str, str] | None = None,
) -> httpx.Response:
    method, path, body = endpoint
    if cookies:  # one Cookie header, built by hand: httpx's per-request cookies are deprecated
        cookie = "; ".join(f"{k}={v}" for k, v in cookies.items())
        headers = {
            **{_raw(k): _raw(v) for k, v in (headers or {}).items()},
            b"cookie": _raw(cookie),
        }
    return await client.request(method, path, json=body, headers=headers)


def _raw(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("latin-1")


async def expect_rejected(response: httpx.Response, fake: FakeBackend) -> None:
    await expect_401(response)
    assert fake.asks == [] and fake.runs == {}, "the backend ran for a rejected credential"


def report(name: str, count: int) -> None:
    print(f"\n[auth-fuzz] {name}: {count} credentials tried, every one a 401")


# --- strategies: claims headers ------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
non_strings = json_values.filter(lambda v: not isinstance(v, str))
blank = st.text(alphabet=" \t\r\n\u00a0\u2003", max_size=4)
good_sub = st.text(min_size=1, max_size=24).filter(lambda s: bool(s.strip()))
good_strings = st.lists(st.text(min_size=1, max_size=12), max_size=3)
LONE_SURROGATES = ["\ud800", "a\udfffb", "\udbff"]


@st.composite
def bad_payloads(draw: st.DrawFn) -> Any:
    """A JSON value that is NOT a valid claims payload, by construction."""
    kind = draw(
        st.sampled_from(
            [
                "not an object",
                "bad sub",
                "memberships not a list",
                "membership not an object",
                "membership field not a string",
                "roles or domains not a list of strings",
                "neither shape",
                "lone surrogate",
            ]
        )
    )
    sub = draw(good_sub)
    if kind == "not an object":
        return draw(json_values.filter(lambda v: not isinstance(v, dict)))
    if kind == "bad sub":
        body: dict[str, Any] = {"roles": draw(good_strings), "domains": draw(good_strings)}
        if draw(st.booleans()):  # missing, or present with a non-string / blank value
            body["sub"] = draw(non_strings | blank)
        return body
    if kind == "memberships not a list":
        return {
            "sub": sub,
            "memberships": draw(json_values.filter(lambda v: not isinstance(v, list))),
        }
    if kind == "membership not an object":
        good = [{"domain": "acme", "role": "admin"}] * draw(st.integers(0, 2))
        bad = draw(json_values.filter(lambda v: not isinstance(v, dict)))
        return {"sub": sub, "memberships": [*good, bad]}
    if kind == "membership field not a string":
        field, other = draw(st.sampled_from([("domain", "role"), ("role", "domain")]))
        entry: dict[str, Any] = {other: "acme"}
        if draw(st.booleans()):
            entry[field] = draw(non_strings)
        return {"sub": sub, "memberships": [entry]}
    if kind == "roles or domains not a list of strings":
        key = draw(st.sampled_from(["roles", "domains"]))
        value = draw(
            json_values.filter(lambda v: not isinstance(v, list))
            | st.lists(non_strings, min_size=1, max_size=3).map(lambda items: ["ok", *items])
        )
        return {"sub": sub, key: value}
    if kind == "neither shape":
        extra = draw(
            st.dictionaries(st.sampled_from(["exp", "iat", "role", "domain", "x"]), scalars)
        )
        return {"sub": sub, **extra}
    surrogate = draw(st.sampled_from(LONE_SURROGATES))
    where = draw(st.sampled_from(["sub", "role", "domain", "flat role", "flat domain"]))
    if where == "sub":
        return {"sub": surrogate, "roles": ["admin"]}
    if where in ("role", "domain"):
        entry = {"domain": "acme", "role": "admin", where: surrogate}
        return {"sub": sub, "memberships": [entry]}
    return {"sub": sub, where.split()[1] + "s": ["admin", surrogate]}


def encode(raw: bytes, variant: str) -> str:
    text = (base64.urlsafe_b64encode(raw) if "url" in variant else base64.b64encode(raw)).decode()
    return text.rstrip("=") if "unpadded" in variant else text


variants = st.sampled_from(["standard", "standard unpadded", "url", "url unpadded"])
header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=300,
)


def _accepted_by_the_simulators(header: str) -> bool:
    """An independent parser (the simulators'): used to skip the rare random header that is
    valid claims after all, so the property never depends on the code under test."""
    try:
        parse_claims(header)
    except ClaimsError:
        return False
    return True


@st.composite
def bad_claims_headers(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(
            ["random text", "base64 of random bytes", "base64 of bad JSON", "bad claims"]
        )
    )
    if kind == "random text":
        text = draw(header_text)
        assume(not _accepted_by_the_simulators(text))
        return text.encode("latin-1")
    if kind == "base64 of random bytes":
        raw = draw(st.binary(max_size=200))
        return encode(raw, draw(variants)).encode()
    if kind == "base64 of bad JSON":
        raw = draw(st.text(max_size=80)).encode("utf-8", "surrogatepass")
        assume(not _accepted_by_the_simulators(encode(raw, "standard")))
        return encode(raw, draw(variants)).encode()
    payload = json.dumps(draw(bad_payloads()))  # ensure_ascii: lone surrogates as \\uXXXX
    return encode(payload.encode(), draw(variants)).encode()


# --- the claims header ---------------------------------------------------------------------------


@pytest.fixture
def apps(fake_app: AppFactory) -> dict[bool, tuple[Any, FakeBackend]]:
    """The app with REQUIRE_AUTH on and off: a credential that is sent is verified either way."""
    return {True: fake_app(), False: fake_app(require_auth=False)}


@FUZZ
@given(
    header=bad_claims_headers(),
    endpoint=st.sampled_from(ENDPOINTS),
    require_auth=st.booleans(),
    with_token=st.booleans(),
)
async def test_fuzzed_claims_headers_are_401(
    header: bytes,
    endpoint: tuple[str, str, dict[str, Any] | None],
    require_auth: bool,
    with_token: bool,
    apps: dict[bool, tuple[Any, FakeBackend]],
    asgi_client: ClientFactory,
    tried: list[str],
) -> None:
    app, fake = apps[require_auth]
    headers = {CLAIMS.encode(): header}
    if with_token:  # a valid admin token does not rescue a bad claims header
        token = mint_eval_token(SECRET, "eve", ["admin"], ["acme"])
        headers[b"authorization"] = f"Bearer {token}".encode()
    response = await send(asgi_client(app), endpoint, headers)
    await expect_rejected(response, fake)
    assert "invalid x-gateway-claims header" in response.json()["error"]["message"]
    tried.append("claims")


@pytest.fixture(scope="module")
def tried() -> Any:
    """Counts what each test tried (module scope: hypothesis examples share it)."""
    seen: list[str] = []
    yield seen
    for name in sorted(set(seen)):
        report(name, seen.count(name))


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"[" * 5000, id="array nested 5000 deep"),
        pytest.param(b'{"sub":' * 3000, id="object nested 3000 deep"),
        pytest.param(b'{"sub": "a", "roles": ' + b"[" * 2000 + b"]" * 2000 + b"}", id="deep roles"),
        pytest.param(b"1" * 5000, id="5000-digit number"),
        pytest.param(b'{"sub": "a", "roles": ["admin"], "domains": NaN}', id="NaN"),
    ],
)
async def test_pathological_claims_json_is_401(
    payload: bytes, fake_app: AppFactory, asgi_client: ClientFactory, tried: list[str]
) -> None:
    """Regression: JSON nested past the parser's depth limit raised ``RecursionError`` (not a
    ``ValueError``) out of the header decoder: a 500."""
    app, fake = fake_app()
    client = asgi_client(app)
    for endpoint in ENDPOINTS:
        response = await send(client, endpoint, {CLAIMS: encode(payload, "standard")})
        await expect_rejected(response, fake)
        tried.append("pathological claims JSON")


@pytest.mark.parametrize("where", ["sub", "domain", "role"])
async def test_lone_surrogates_in_claims_are_401_not_500(
    where: str, fake_app: AppFactory, asgi_client: ClientFactory, tried: list[str]
) -> None:
    """Regression: ``{"sub": "\\ud800"}`` decoded to a string no UTF-8 encoder accepts; the
    Cedar decision on ``/ingest`` then failed with a 500."""
    app, fake = fake_app()
    entry = {"domain": "acme", "role": "admin"}
    body: dict[str, Any] = {"sub": "mallory", "memberships": [entry]}
    if where == "sub":
        body["sub"] = "\ud800mallory"
    else:
        entry[where] = "acme\udfff"
    header = b64(json.dumps(body))  # \\ud800 escapes, as a client would send them
    client = asgi_client(app)
    for endpoint in ENDPOINTS:
        await expect_rejected(await send(client, endpoint, {CLAIMS: header}), fake)
        tried.append("lone surrogates (claims)")
    token = jwt.encode({**body, "exp": int(time.time()) + 60}, SECRET, algorithm="HS256")
    for endpoint in ENDPOINTS:
        response = await send(client, endpoint, {"authorization": f"Bearer {token}"})
        await expect_rejected(response, fake)
        tried.append("lone surrogates (token)")


# --- eval tokens ---------------------------------------------------------------------------------

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
RSA_PUBLIC_PEM = (
    RSA_KEY.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def now() -> int:
    """Tokens are minted when a test runs, never at import: a long suite must not turn a
    "not valid yet" token valid, or expire a control token."""
    return int(time.time())


def claims_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "sub": "eve",
        "roles": ["admin"],
        "domains": ["acme"],
        "iat": now(),
        "exp": now() + 86_400,  # tokens are built at collection: outlive a long suite
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


def _hs(body: dict[str, Any], algorithm: str = "HS256", key: str = SECRET) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyJWT warns about short keys for HS384/HS512
        return jwt.encode(body, key, algorithm=algorithm)


def _with_header(header: dict[str, Any], body: dict[str, Any]) -> str:
    """An HS256-signed token (right secret) whose JOSE header is ``header`` verbatim."""
    return hs256_with_header(header, body, SECRET)


def _nested_segment(depth: int) -> str:
    return b64url(b"[" * depth)


def adversarial_tokens() -> dict[str, str]:
    t0 = now()
    return {
        # algorithm confusion: only HS256 with EVAL_JWT_SECRET is accepted
        "alg none, no signature": unsigned({"alg": "none", "typ": "JWT"}, claims_body()),
        "alg None": unsigned({"alg": "None"}, claims_body()),
        "alg nOnE with an HS256 signature": _with_header({"alg": "nOnE"}, claims_body()),
        "alg none with the right HMAC": _with_header({"alg": "none", "typ": "JWT"}, claims_body()),
        "HS384, right secret": _hs(claims_body(), "HS384"),
        "HS512, right secret": _hs(claims_body(), "HS512"),
        "RS256": jwt.encode(claims_body(), RSA_KEY, algorithm="RS256"),
        "PS256": jwt.encode(claims_body(), RSA_KEY, algorithm="PS256"),
        "ES256": jwt.encode(claims_body(), EC_KEY, algorithm="ES256"),
        "RS256 header, HMAC keyed with the RSA public key": hs256_with_header(
            {"alg": "RS256", "typ": "JWT"}, claims_body(), RSA_PUBLIC_PEM
        ),
        "HS256 keyed with the RSA public key": hs256_with_header(
            {"alg": "HS256", "typ": "JWT"}, claims_body(), RSA_PUBLIC_PEM
        ),
        "alg as a list": _with_header({"alg": ["HS256"]}, claims_body()),
        "alg lower-case hs256": _with_header({"alg": "hs256"}, claims_body()),
        "no alg": _with_header({"typ": "JWT"}, claims_body()),
        "header not an object": b64url(b'"HS256"') + "." + b64url(b"{}") + ".c2ln",
        "header nested 3000 deep": _nested_segment(3000) + "." + b64url(b"{}") + ".c2ln",
        # signature
        "wrong secret": _hs(claims_body(), key="another-secret-that-is-long-enough-0123"),
        "empty signature": _with_header({"alg": "HS256"}, claims_body()).rsplit(".", 1)[0] + ".",
        "signature of another token": (
            _hs(claims_body(sub="root")).rsplit(".", 1)[0]
            + "."
            + _hs(claims_body()).rsplit(".", 1)[1]
        ),
        # time
        "expired just past the leeway": _hs(claims_body(exp=t0 - CLOCK_SKEW_SECONDS - 30)),
        "expired long ago": _hs(claims_body(iat=t0 - 7200, exp=t0 - 3600)),
        "nbf just past the leeway": _hs(claims_body(nbf=t0 + CLOCK_SKEW_SECONDS + 60)),
        "nbf in a day": _hs(claims_body(nbf=t0 + 86400)),
        "iat in the future": _hs(claims_body(iat=t0 + 3600, exp=t0 + 7200)),
        "exp a string": _hs(claims_body(exp="never")),
        "exp missing": _hs(claims_body(exp=None)),
        "nbf a string": _hs(claims_body(nbf="now")),
        # subject and claims
        "sub missing": _hs(claims_body(sub=None)),
        "sub empty": _hs(claims_body(sub="")),
        "sub blank": _hs(claims_body(sub="   ")),
        "sub a number": _hs(claims_body(sub=42)),
        "sub a list": _hs(claims_body(sub=["eve"])),
        "sub null": _hs({**claims_body(), "sub": None}),
        "roles a string": _hs(claims_body(roles="admin")),
        "memberships a dict": _hs(claims_body(memberships={"domain": "acme", "role": "admin"})),
        "memberships with a number": _hs(claims_body(memberships=[{"domain": 1, "role": "admin"}])),
        "neither shape": _hs({"sub": "eve", "exp": t0 + 86_400}),
        "payload a list": _with_header({"alg": "HS256"}, claims_body()).split(".")[0]
        + "."
        + b64url(b"[1, 2]")
        + ".c2ln",
        "payload nested 3000 deep": b64url(b'{"alg":"HS256"}')
        + "."
        + _nested_segment(3000)
        + ".c2ln",
        # shape
        "two segments": "abc.def",
        "four segments": _hs(claims_body()) + ".extra",
        "five segments (JWE-like)": "a.b.c.d.e",
        "not base64": "@@@.###.$$$",
        "over the size limit": _hs(claims_body(pad="x" * 9000)),
    }


ADVERSARIAL_CASES = sorted(adversarial_tokens())


@pytest.mark.parametrize("case", ADVERSARIAL_CASES)
@pytest.mark.parametrize("carrier", ["bearer", "cookie"])
async def test_adversarial_tokens_are_401(
    case: str,
    carrier: str,
    fake_app: AppFactory,
    asgi_client: ClientFactory,
    tried: list[str],
) -> None:
    app, fake = fake_app()
    client = asgi_client(app)
    token = adversarial_tokens()[case]
    for endpoint in ENDPOINTS:
        if carrier == "bearer":
            response = await send(client, endpoint, {"authorization": f"Bearer {token}"})
        else:
            response = await send(client, endpoint, cookies={EVAL_TOKEN_COOKIE: token})
        await expect_rejected(response, fake)
        tried.append(f"adversarial tokens ({carrier})")


async def test_the_control_tokens_are_accepted(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    """The adversarial table is not vacuous: the same claims, HS256 with the right secret,
    within the leeway, are accepted."""
    app, fake = fake_app()
    client = asgi_client(app)
    for body in (
        claims_body(),
        claims_body(exp=now() - CLOCK_SKEW_SECONDS // 2),  # expired, but inside the leeway
        claims_body(nbf=now() + CLOCK_SKEW_SECONDS // 2),
    ):
        token = _hs(body)
        response = await send(client, ENDPOINTS[0], {"authorization": f"Bearer {token}"})
        assert response.status_code == 200, response.text
    assert [user.sub for user, _ in fake.asks] == ["eve", "eve", "eve"]


jwt_like = st.builds(
    lambda parts: ".".join(parts),
    st.lists(
        st.text(
            alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=",
            max_size=60,
        ),
        min_size=1,
        max_size=6,
    ),
)
json_headers = st.fixed_dictionaries(
    {},
    optional={
        "alg": st.sampled_from(["none", "HS384", "HS512", "RS256", "ES256", "PS512", "EdDSA", ""])
        | non_strings,
        "typ": st.sampled_from(["JWT", "at+jwt"]) | non_strings,
        "kid": st.text(max_size=20) | non_strings,
        "jku": st.just("http://attacker.example/jwks.json"),
        "crit": st.lists(st.text(max_size=6), max_size=2),
    },
)


@st.composite
def bad_tokens(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["random", "jwt-like", "foreign header", "bad claims"]))
    if kind == "random":
        return draw(
            st.text(
                alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E),
                min_size=1,
                max_size=200,
            )
        )
    if kind == "jwt-like":
        return draw(jwt_like.filter(lambda t: t.strip()))
    if kind == "foreign header":  # any JOSE header but HS256, with the right HMAC
        header = draw(json_headers.filter(lambda h: h.get("alg") != "HS256"))
        return _with_header(header, claims_body())
    body = draw(bad_payloads())  # right algorithm and secret, bad claims
    if isinstance(body, dict):
        body.setdefault("exp", now() + 86_400)
    return _with_header({"alg": "HS256", "typ": "JWT"}, body)


@FUZZ
@given(
    token=bad_tokens(),
    scheme=st.sampled_from(["Bearer", "bearer", "BEARER"]),
    carrier=st.sampled_from(["bearer", "cookie"]),
    endpoint=st.sampled_from(ENDPOINTS),
    require_auth=st.booleans(),
)
async def test_fuzzed_tokens_are_401(
    token: str,
    scheme: str,
    carrier: str,
    endpoint: tuple[str, str, dict[str, Any] | None],
    require_auth: bool,
    apps: dict[bool, tuple[Any, FakeBackend]],
    asgi_client: ClientFactory,
    tried: list[str],
) -> None:
    app, fake = apps[require_auth]
    client = asgi_client(app)
    if carrier == "bearer":
        response = await send(client, endpoint, {"authorization": f"{scheme} {token}"})
    else:
        assume(";" not in token and "," not in token and " " not in token)
        response = await send(client, endpoint, cookies={EVAL_TOKEN_COOKIE: token})
    await expect_rejected(response, fake)
    tried.append("fuzzed tokens")


@FUZZ
@given(value=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=120))
async def test_fuzzed_authorization_schemes_are_401(
    value: str,
    apps: dict[bool, tuple[Any, FakeBackend]],
    asgi_client: ClientFactory,
    tried: list[str],
) -> None:
    """Any Authorization header that is not ``Bearer <valid HS256 token>``."""
    app, fake = apps[True]
    response = await send(asgi_client(app), ENDPOINTS[0], {"authorization": value})
    await expect_rejected(response, fake)
    tried.append("fuzzed Authorization values")


# --- several credentials at once ----------------------------------------------------------------

BAD_CLAIMS = b64("not json")
Credentials = tuple[list[tuple[str, str]], dict[str, str]]


def valid_token() -> str:
    return mint_eval_token(SECRET, "eve", ["admin"], ["acme"])


def bad_token() -> str:
    return adversarial_tokens()["wrong secret"]


def combinations() -> dict[str, Credentials]:
    good, bad = valid_token(), bad_token()
    return {
        # (header list, cookies): the Authorization header decides over the cookie; the claims
        # header decides over both; a bad one is never rescued by a good one.
        "bad bearer + valid cookie": (
            [("authorization", f"Bearer {bad}")],
            {EVAL_TOKEN_COOKIE: good},
        ),
        "empty bearer + valid cookie": (
            [("authorization", "Bearer ")],
            {EVAL_TOKEN_COOKIE: good},
        ),
        "Basic scheme + valid cookie": (
            [("authorization", "Basic dXNlcjpwYXNz")],
            {EVAL_TOKEN_COOKIE: good},
        ),
        "bad claims + valid bearer + valid cookie": (
            [(CLAIMS, BAD_CLAIMS), ("authorization", f"Bearer {good}")],
            {EVAL_TOKEN_COOKIE: good},
        ),
        "empty claims header + valid cookie": ([(CLAIMS, "")], {EVAL_TOKEN_COOKIE: good}),
        "bad cookie only": ([], {EVAL_TOKEN_COOKIE: bad}),
        "blank cookie": ([], {EVAL_TOKEN_COOKIE: "   "}),
        "two claims headers, valid first": ([(CLAIMS, ADMIN[CLAIMS]), (CLAIMS, BAD_CLAIMS)], {}),
        "two claims headers, both valid": (
            [(CLAIMS, NORTHWIND_STAFF[CLAIMS]), (CLAIMS, ADMIN[CLAIMS])],
            {},
        ),
        "two Authorization headers, valid first": (
            [("authorization", f"Bearer {good}"), ("authorization", f"Bearer {bad}")],
            {},
        ),
    }


@pytest.mark.parametrize("case", sorted(combinations()))
async def test_combined_credentials_are_401(
    case: str, fake_app: AppFactory, asgi_client: ClientFactory, tried: list[str]
) -> None:
    """Regression for the repeated headers: the first copy used to win, so a mesh that
    appended its claims header after a client's copy would have let the client's win."""
    header_list, cookies = combinations()[case]
    app, fake = fake_app()
    client = asgi_client(app)
    for endpoint in ENDPOINTS:
        headers = [(_raw(k), _raw(v)) for k, v in header_list]
        if cookies:
            cookie = "; ".join(f"{k}={v}" for k, v in cookies.items())
            headers.append((b"cookie", _raw(cookie)))
        method, path, body = endpoint
        response = await client.request(method, path, json=body, headers=headers)
        await expect_rejected(response, fake)
        tried.append("combined credentials")


async def test_precedence_with_valid_credentials(
    fake_app: AppFactory, asgi_client: ClientFactory
) -> None:
    """The positive side of the table above: header over cookie, claims over token."""
    app, fake = fake_app()
    client = asgi_client(app)
    good, bad = valid_token(), bad_token()
    cases: list[tuple[dict[str, str], dict[str, str], str]] = [
        ({"authorization": f"Bearer {good}"}, {EVAL_TOKEN_COOKIE: bad}, "eve"),
        (ADMIN, {EVAL_TOKEN_COOKIE: bad}, "root"),
        ({**NORTHWIND_STAFF, "authorization": f"Bearer {bad}"}, {}, "nina"),
    ]
    for headers, cookies, sub in cases:
        response = await send(client, ENDPOINTS[0], headers, cookies)
        assert response.status_code == 200, response.text
        assert fake.asks[-1][0].sub == sub


# --- huge headers --------------------------------------------------------------------------------


def huge_cases() -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    return {
        "64 KB claims header": ({CLAIMS: "A" * HUGE}, {}),
        "64 KB claims header of valid base64 JSON": (
            {CLAIMS: b64(json.dumps({"sub": "a" * HUGE, "roles": ["admin"]}))},
            {},
        ),
        "64 KB bearer token": ({"authorization": "Bearer " + "a" * HUGE}, {}),
        "64 KB signed token": ({"authorization": f"Bearer {_hs(claims_body(pad='x' * HUGE))}"}, {}),
        "64 KB cookie": ({}, {EVAL_TOKEN_COOKIE: "a" * HUGE}),
        "64 KB Authorization scheme": ({"authorization": "X" * HUGE}, {}),
    }


@pytest.mark.parametrize("case", sorted(huge_cases()))
async def test_huge_credentials_over_asgi_are_401(
    case: str, fake_app: AppFactory, asgi_client: ClientFactory, tried: list[str]
) -> None:
    headers, cookies = huge_cases()[case]
    app, fake = fake_app()
    response = await send(asgi_client(app), ENDPOINTS[0], headers, cookies)
    await expect_rejected(response, fake)
    tried.append("huge credentials (ASGI)")


async def test_huge_credentials_over_real_http_are_never_500(
    fake_app: AppFactory, tried: list[str]
) -> None:
    """Over real HTTP the server may refuse a 64 KB header itself (uvicorn/h11: 400 or 431)
    before the app runs; where the app answers, it is the 401 envelope. Never a 5xx, and the
    server keeps serving afterwards."""
    app, fake = fake_app()
    statuses: dict[str, int] = {}
    with run_in_thread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
            for case, (headers, cookies) in sorted(huge_cases().items()):
                try:
                    response = await send(client, ENDPOINTS[0], headers, cookies)
                except httpx.RemoteProtocolError:  # the server closed the connection: no 5xx
                    statuses[case] = 0
                    continue
                statuses[case] = response.status_code
                assert response.status_code < 500, (case, response.text)
                if response.status_code == 401:
                    assert is_envelope(response.json(), "unauthenticated")
                else:
                    assert response.status_code in (400, 413, 431), (case, response.status_code)
                tried.append("huge credentials (HTTP)")
            ok = await client.post("/ask", json={"question": "hi"}, headers=ADMIN)
            assert ok.status_code == 200
    assert fake.asks and all(user.sub == "root" for user, _ in fake.asks)
    print(f"\n[auth-fuzz] real-HTTP statuses for 64 KB credentials: {statuses}")
