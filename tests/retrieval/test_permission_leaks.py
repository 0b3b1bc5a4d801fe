"""Permission leaks, property-based (issue 8, item 1).

What is under test is the real thing: documents are written as Markdown files with
front-matter ``permissions`` (or none, so the folder's ``DOC_ROOTS`` default applies), ingested
by ``run_ingest`` (``parse_acl``, fingerprints, one transaction per document) into the real
embedded PostgreSQL, and searched with ``HybridRetriever.search`` / ``PgDocumentStore.
hybrid_candidates`` (the ACL check in SQL, the ``acl_match`` GIN and its ``*`` public
sentinel). Callers are real ``AuthUser`` objects built from claims (the mesh header, base64,
when it fits in the 16 KiB limit; the flat eval-token shape otherwise), and their ACL entries
are what ``AuthUser.acl_entries`` derives.

Only the embedder is fake: ``HashedEmbedder`` (``tests/ingest_jobs/corpus.py``) is the
scripted model server's deterministic hashed bag of words, in-process, so an example costs
milliseconds instead of a MiniLM forward pass. Vectors are not what is tested; the store and
its SQL are.

The oracle is ``ref_visible``: the visibility rule restated in plain Python from the spec
(roles from ``foundation/roles.json``, read here directly) and written independently of
``foundation.acl`` and of the SQL:

* a document's ACL is its front-matter ``permissions`` if present (an explicit ``[]`` is
  public), else its folder's default; entries are ``role:<known role>`` or
  ``domain:<name>``, compared after ``strip().lower()``; any other entry makes the file
  invalid, so it is skipped - never public;
* an empty ACL is public;
* a caller holds ``role:R`` when R's weight is at most the weight of its highest known role,
  and ``domain:D`` for each of its (stripped, lower-cased, non-empty) domains; a domain never
  counts as a role, whatever it is called.

Properties, for every example (corpus x callers x queries):

1. soundness: every chunk ``search`` returns, and every candidate either side of the hybrid
   statement returns, is visible to the caller under ``ref_visible``;
2. exactness: the vector side asked for more rows than the store holds returns *exactly* the
   chunks ``ref_visible`` allows (so nothing is hidden that should be visible either);
3. completeness: searching a visible chunk's own embedding input (so the query vector equals
   the chunk's vector) finds that chunk;
4. ACL changes on re-ingest take effect at once, narrower and wider, both from front matter
   and from a folder default that changes under an unchanged file.

The known traps are in every corpus and every caller set (``TRAP_DOCS``, ``TRAP_CALLERS``); the
random part adds more. ``test_nothing_leaks_through_the_agent`` then asks the full ``/ask`` API
(JSON and SSE, both tool-calling modes) as each test caller of ``documentation/FACTS.md``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import string
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from foundation.acl import caller_entries
from foundation.identity import MAX_CLAIMS_HEADER_CHARS, AuthUser
from foundation.roles import ROLE_WEIGHTS
from foundation.settings import Settings
from ingest_jobs.pipeline import IngestOptions, IngestReport, run_ingest
from retrieval.rerankers import NoopReranker
from retrieval.search import HybridRetriever, RetrievalConfig, embedding_input
from retrieval.store import ACL_PREDICATE, HYBRID_SQL_BY_RANKING, PgDocumentStore
from serve_app.wiring import ingest_config
from tests.ingest_jobs.corpus import HashedEmbedder
from tests.serve_app.api.api_helpers import parse_sse_text

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# The fleet's hierarchy, read from the file itself (not through foundation.settings).
RANK: dict[str, int] = json.loads((ROOT / "foundation/roles.json").read_text())["roles"]
DIM = 384


# --- the reference rule ---------------------------------------------------------------------------


def _norm(name: str) -> str:
    return name.strip().lower()


@dataclass(frozen=True)
class RefCaller:
    label: str
    top: int | None  # weight of the highest known role, None without one
    domains: frozenset[str]


def ref_caller(label: str, claims: dict[str, Any]) -> RefCaller:
    if "memberships" in claims:
        roles = [m["role"] for m in claims["memberships"]]
        domains = [m["domain"] for m in claims["memberships"]]
    else:
        roles, domains = claims.get("roles", []), claims.get("domains", [])
    ranks = [RANK[_norm(r)] for r in roles if _norm(r) in RANK]
    return RefCaller(
        label, max(ranks) if ranks else None, frozenset(_norm(d) for d in domains if _norm(d))
    )


RefAcl = tuple[tuple[str, str], ...]


def ref_acl(raw: Sequence[str]) -> RefAcl | None:
    """The typed entries of a raw ACL, or None when the file is invalid (skipped)."""
    out: list[tuple[str, str]] = []
    for entry in raw:
        if not entry.strip():
            continue
        if ":" not in entry or "\x00" in entry:  # NUL: PostgreSQL text cannot hold it
            return None
        kind, name = (_norm(part) for part in entry.split(":", 1))
        if not name or (kind == "role" and name not in RANK) or kind not in {"role", "domain"}:
            return None
        out.append((kind, name))
    return tuple(out)


def ref_visible(acl: RefAcl, caller: RefCaller) -> bool:
    if not acl:
        return True
    for kind, name in acl:
        if kind == "role" and caller.top is not None and RANK[name] <= caller.top:
            return True
        if kind == "domain" and name in caller.domains:
            return True
    return False


def test_the_reference_rule_on_the_known_traps() -> None:
    """The oracle itself, on the cases the issue names (so a wrong oracle cannot pass)."""
    named_admin = ref_caller("x", {"memberships": [{"domain": "admin", "role": "x"}]})
    admin = ref_caller("a", {"memberships": [{"domain": "ops", "role": "ADMIN "}]})
    empty = ref_caller("e", {"memberships": []})
    assert not ref_visible((("role", "admin"),), named_admin)
    assert ref_visible((("domain", "admin"),), named_admin)
    assert ref_visible((("role", "standard_customer"),), admin)
    assert not ref_visible((("domain", "acme"),), admin)
    assert ref_visible((), empty) and not ref_visible((("role", "standard_customer"),), empty)
    assert ref_acl(["admin"]) is None and ref_acl(["role:root"]) is None
    assert ref_acl([" Domain:ACME ", "domain:acme"]) == (("domain", "acme"), ("domain", "acme"))


# --- corpora --------------------------------------------------------------------------------------

FOLDER_DEFAULTS = {"pub": [], "staff": ["role:business_staff"]}
VOCAB = (
    *("occupancy", "sensor", "capacity", "alert", "cooldown", "gateway", "warehouse", "dock"),
    *("badge", "floor", "room", "door", "counter", "admin", "role", "domain", "staff"),
    *("customer", "public", "billing", "runbook"),
)


@dataclass(frozen=True)
class Doc:
    folder: str  # a DOC_ROOTS folder: "pub" (default public) or "staff" (role:business_staff)
    name: str
    acl: tuple[str, ...] | None  # raw front-matter permissions; None: the folder default
    words: tuple[str, ...] = ()
    sections: int = 2

    @property
    def raw_acl(self) -> Sequence[str]:
        return FOLDER_DEFAULTS[self.folder] if self.acl is None else self.acl


def _pads(prefix: str, start: int, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}pad{k}" for k in range(start, start + count))


TRAP_DOCS: tuple[Doc, ...] = (
    Doc("pub", "trap-role-admin", ("role:admin",)),
    Doc("pub", "trap-role-business-admin", ("role:business_admin",)),
    Doc("pub", "trap-role-standard", ("role:standard_customer",)),
    Doc("pub", "trap-domain-admin", ("domain:admin",)),  # a tenant called "admin"
    Doc("pub", "trap-domain-business-admin", ("domain:business_admin",)),
    Doc("pub", "trap-domain-role-admin", ("domain:role:admin",)),  # a tenant "role:admin"
    Doc("pub", "trap-domain-star", ("domain:*",)),  # "*" is the SQL public sentinel
    Doc("pub", "trap-public-default", None),
    Doc("staff", "trap-staff-default", None),
    Doc("staff", "trap-staff-explicit-public", ()),  # front matter [] beats the folder default
    Doc("pub", "trap-upper-dupes", ("Domain:ACME", " ROLE:Business_Admin ", "domain:acme")),
    Doc("pub", "trap-long", tuple(f"domain:{p}" for p in _pads("", 150, 300))),
    Doc("pub", "trap-untyped-admin", ("admin",)),  # invalid: skipped, never public
    Doc("pub", "trap-unknown-role", ("role:root", "domain:acme")),  # invalid: skipped
    Doc("pub", "trap-group", ("group:ops",)),  # invalid: skipped
    Doc("pub", "trap-nul", ("domain:acme\x00", "role:admin")),  # invalid (U+0000): skipped
)

ROLE_NAMES = tuple(RANK)
BOGUS_ROLES = ("root", "superadmin", "admins", "administrator", "role:admin", "domain:admin", "")
DOMAIN_NAMES = (
    "acme",
    "northwind",
    "globex",
    "ops",
    "admin",
    "business_admin",
    "business_staff",
    "standard_customer",
    "role:admin",
    "*",
    "ärger",
    "straße",
)


@st.composite
def spelled(draw: st.DrawFn, names: Sequence[str]) -> str:
    """A name in any case, sometimes padded with spaces (the claims and front matter may)."""
    name = draw(st.sampled_from(names))
    case = draw(st.sampled_from([str.lower, str.upper, str.title, str.swapcase]))
    pad = draw(st.sampled_from(["", "", " ", "  "]))
    return pad + case(name) + draw(st.sampled_from(["", "", " "]))


@st.composite
def acl_entries(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["role", "domain", "domain"]))
    names = ROLE_NAMES if kind == "role" else DOMAIN_NAMES
    return draw(spelled([kind])) + ":" + draw(spelled(names))


@st.composite
def random_docs(draw: st.DrawFn) -> list[Doc]:
    docs: list[Doc] = []
    for i in range(draw(st.integers(1, 8))):
        acl: tuple[str, ...] | None = draw(
            st.one_of(
                st.none(),
                st.lists(acl_entries(), max_size=4).map(tuple),
                # very long ACLs: pad domains that long caller lists may (or may not) overlap
                st.integers(0, 500).map(lambda s: tuple(f"domain:{p}" for p in _pads("", s, 250))),
            )
        )
        words = tuple(draw(st.lists(st.sampled_from(VOCAB), min_size=3, max_size=12)))
        folder = draw(st.sampled_from(["pub", "staff"]))
        docs.append(Doc(folder, f"rand-{i}", acl, words, draw(st.integers(1, 3))))
    return docs


def _membership(domain: str, role: str) -> dict[str, str]:
    return {"domain": domain, "role": role}


TRAP_CALLERS: dict[str, dict[str, Any]] = {
    "domain_named_admin": {"memberships": [_membership("admin", "standard_customer")]},
    "domain_named_business_admin": {
        "memberships": [_membership("business_admin", "standard_customer")]
    },
    "domain_named_role_admin_and_star": {"roles": [], "domains": ["role:admin", "*"]},
    "roles_named_like_entries": {"roles": ["role:admin", "domain:admin", "*"], "domains": []},
    "empty_memberships": {"memberships": []},
    "no_roles_no_domains": {"roles": [], "domains": []},
    "upper_case": {"memberships": [_membership("ACME", "BUSINESS_ADMIN")]},
    "duplicates": {
        "memberships": [_membership("acme", "business_staff")] * 3
        + [_membership(" Acme ", "Business_Staff")]
    },
    "admin_reads_lower_roles": {"memberships": [_membership("ops", "admin")]},
    "staff_of_globex": {"memberships": [_membership("globex", "business_staff")]},
    "unknown_roles_only": {"roles": ["root", "superadmin", "Admins"], "domains": []},
    "nul_in_names": {"roles": ["admin\x00"], "domains": ["acme\x00", "a\x00b", "globex"]},
    "long_memberships": {
        "memberships": [_membership(p, "standard_customer") for p in _pads("", 0, 200)]
        + [_membership("acme", "standard_customer")]
    },
    "long_flat_lists": {
        "roles": ["standard_customer"] * 50 + ["wizard"] * 50,
        "domains": list(_pads("", 400, 1000)),
    },
}


@st.composite
def random_callers(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    callers: dict[str, dict[str, Any]] = {}
    for i in range(draw(st.integers(2, 5))):
        role_names = st.one_of(spelled(ROLE_NAMES), spelled(BOGUS_ROLES))
        if draw(st.booleans()):
            memberships = draw(
                st.lists(st.builds(_membership, spelled(DOMAIN_NAMES), role_names), max_size=4)
            )
            if draw(st.booleans()):
                memberships = memberships + memberships[:2]  # duplicates
            if draw(st.integers(0, 4)) == 0:
                start = draw(st.integers(0, 500))
                memberships += [_membership(p, "standard_customer") for p in _pads("", start, 120)]
            callers[f"random_{i}"] = {"memberships": memberships}
        else:
            roles = draw(st.lists(role_names, max_size=3))
            domains = draw(st.lists(spelled(DOMAIN_NAMES), max_size=4))
            if draw(st.integers(0, 4)) == 0:
                domains += list(_pads("", draw(st.integers(0, 500)), 400))
            callers[f"random_{i}"] = {"roles": roles, "domains": domains}
    return callers


QUERY_ALPHABET = string.ascii_letters + string.digits + " -\"'!&|:*()<>@.,?^~[]/%_\\äİß\x00"
queries = st.one_of(
    st.lists(st.sampled_from(VOCAB), min_size=1, max_size=6).map(" ".join),
    st.text(alphabet=QUERY_ALPHABET, min_size=1, max_size=40),
    st.sampled_from(
        [
            "-alert cooldown",
            '"dock floor"',
            "!",
            "& |",
            "a:*",
            "'",
            "or",
            "-",
            '""',
            "role:admin",
            "domain:admin",
            "*",
            "uniq0s0",
            "trap",
            "cooldown\x00alert",
        ]
    ),
).filter(lambda q: bool(q.strip()))


def user_for(label: str, claims: dict[str, Any]) -> AuthUser:
    """The caller as the service builds it: the mesh header when it fits, else the flat
    eval-token claims (a header over 16 KiB is a 401 before any search)."""
    payload = {"sub": f"u-{label}", **claims}
    header = base64.b64encode(json.dumps(payload).encode()).decode()
    if len(header) <= MAX_CLAIMS_HEADER_CHARS:
        return AuthUser.from_claims_header(header)
    return AuthUser.from_claims(payload)


def write_doc(root: Path, doc: Doc) -> Path:
    path = root / doc.folder / f"{doc.name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    front = [f"title: {doc.name}"]
    if doc.acl is not None:
        front.append(f"permissions: {json.dumps(list(doc.acl))}")
    parts = [f"# {doc.name}", ""]
    for j in range(doc.sections):
        tag = re.sub(r"[^a-z0-9]", "", doc.name.lower())
        body = " ".join(doc.words) or "plain words"
        parts += [f"## Part {j}", "", f"uniq{tag}s{j} {body} {tag}", ""]
    path.write_text("---\n" + "\n".join(front) + "\n---\n" + "\n".join(parts), encoding="utf-8")
    return path


# --- the harness ----------------------------------------------------------------------------------


@dataclass
class Corpus:
    docs: dict[str, Doc]  # by source
    chunks: dict[str, tuple[str, str, str]]  # chunk id -> (source, section, text)
    report: IngestReport


class Harness:
    """One store and retriever on a private event loop (hypothesis drives a sync test)."""

    def __init__(self, url: str, home: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.home = home
        self.embedder = HashedEmbedder()
        self.settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            agent_service_home=home / "home",
            embedding_backend="openai",  # no tokenizer to load: 4 characters per token
            embedding_model=self.embedder.name,
            embedding_dim=DIM,
        )
        self.store = self.run(PgDocumentStore.connect(url, embedding_dim=DIM, max_size=2))
        config = RetrievalConfig(top_k_final=50)
        self.retriever = HybridRetriever(self.store, self.embedder, NoopReranker(), config)
        self.examples = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.store.close())
        self.loop.close()

    def roots(self, root: Path, defaults: dict[str, list[str]]) -> list[tuple[Path, list[str]]]:
        return [(root / folder, list(acl)) for folder, acl in defaults.items()]

    async def ingest(
        self, root: Path, defaults: dict[str, list[str]] = FOLDER_DEFAULTS
    ) -> IngestReport:
        options = IngestOptions(roots=self.roots(root, defaults), executor="local", max_tokens=120)
        return await run_ingest(
            self.store, ingest_config(self.settings), options, embedder=self.embedder
        )

    async def load(self, docs: Sequence[Doc]) -> Corpus:
        self.examples += 1
        root = self.home / f"corpus-{self.examples}"
        for folder in FOLDER_DEFAULTS:
            (root / folder).mkdir(parents=True, exist_ok=True)
        by_source = {write_doc(root, d).as_posix(): d for d in docs}
        await self.store.pool.execute("TRUNCATE documents CASCADE")
        report = await self.ingest(root)
        rows = await self.store.pool.fetch(
            "SELECT c.id, d.source, c.section, c.text FROM chunks c "
            "JOIN documents d ON d.id = c.document_id"
        )
        chunks = {r["id"]: (r["source"], r["section"], r["text"]) for r in rows}
        return Corpus(by_source, chunks, report)


@pytest.fixture
def harness(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(db_url, tmp_path)
    yield h
    h.close()


# --- 1-3: soundness, exactness, completeness ----------------------------------------------------


async def check_example(
    h: Harness,
    corpus: Corpus,
    callers: dict[str, dict[str, Any]],
    query_list: Sequence[str],
    pick: Any,
    counts: Counter[str],
) -> None:
    acls: dict[str, RefAcl | None] = {s: ref_acl(d.raw_acl) for s, d in corpus.docs.items()}
    stored_sources = {s for s, _, _ in corpus.chunks.values()}
    # invalid files are skipped, never stored (so never public); valid ones are all stored
    assert {s for s, a in acls.items() if a is None} == set(corpus.docs) - stored_sources
    assert corpus.report.skipped == sum(a is None for a in acls.values())
    total = len(corpus.chunks)
    counts["examples"] += 1
    counts["documents"] += len(corpus.docs)
    counts["chunks"] += total

    for label, claims in callers.items():
        user = user_for(label, claims)
        ref = ref_caller(label, claims)
        held = user.acl_entries
        visible = {
            cid for cid, (src, _, _) in corpus.chunks.items() if ref_visible(acls[src] or (), ref)
        }
        counts["callers"] += 1

        def explain(cid: str, *, _label: str = label, _held: list[str] = held) -> str:
            src = corpus.chunks[cid][0]
            return f"{_label} held={_held[:8]} chunk of {Path(src).name} acl={acls[src]}"

        # 2. exactness: the vector side with k above the store's size returns exactly the
        # visible chunks (any query vector: a chunk's own)
        probe = next(iter(corpus.chunks))
        vector = (await h.embedder.aencode([embedding_input(*corpus.chunks[probe][1:])]))[0]
        rows = await h.store.hybrid_candidates(
            "occupancy", vector, held, k_vector=total + 5, k_keyword=total + 5
        )
        got = {c.chunk_id for c in rows if c.vector_rank is not None}
        for cid in got - visible:
            pytest.fail(f"LEAK: {explain(cid)}")
        for cid in visible - got:
            pytest.fail(f"MISSING: {explain(cid)}")
        # ... and the read-time check of a conversation's citations (the same predicate):
        # exactly the visible chunks, and never an id that is gone
        assert await h.store.visible_chunk_ids([*corpus.chunks, "gone"], held) == visible
        counts["acl_sweeps"] += 1
        counts["pairs_checked"] += total

        # 1. soundness: random queries, both the public search and the raw hybrid statement
        for query in query_list:
            hits = await h.retriever.search(query, acl=held, top_k=50)
            for hit in hits:
                assert hit.chunk_id in visible, (
                    f"LEAK via search({query!r}): {explain(hit.chunk_id)}"
                )
            vec = await h.retriever.embed_query(query)
            for cand in await h.store.hybrid_candidates(
                query, vec, held, k_vector=total + 5, k_keyword=total + 5
            ):
                assert cand.chunk_id in visible, f"LEAK via {query!r}: {explain(cand.chunk_id)}"
            counts["queries"] += 1
            counts["hits_returned"] += len(hits)

        # 3. completeness: a visible chunk's own text (its vector exactly) finds it
        for cid in pick(sorted(visible), 2):
            _, section, text = corpus.chunks[cid]
            hits = await h.retriever.search(embedding_input(section, text), acl=held, top_k=50)
            assert cid in {x.chunk_id for x in hits}, f"NOT FOUND: {explain(cid)}"
            for x in hits:
                assert x.chunk_id in visible, f"LEAK via a chunk's text: {explain(x.chunk_id)}"
            counts["completeness_probes"] += 1


EXAMPLES = 60
# No shrinking: a failure's message already names the caller, its entries, the chunk's page
# and ACL, and shrinking a store-backed example can take many minutes.
PHASES = (Phase.explicit, Phase.generate)


def search_property(harness: Harness, examples: int) -> Counter[str]:
    """Properties 1-3 over ``examples`` random corpora, caller sets and query lists (plus
    the traps in each); returns what was counted."""
    counts: Counter[str] = Counter()

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=PHASES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        docs=random_docs(),
        callers=random_callers(),
        query_list=st.lists(queries, min_size=2, max_size=3),
        rnd=st.randoms(use_true_random=False),
    )
    def run(
        docs: list[Doc], callers: dict[str, dict[str, Any]], query_list: list[str], rnd: Any
    ) -> None:
        corpus = harness.run(harness.load([*TRAP_DOCS, *docs]))

        def pick(items: list[str], n: int) -> list[str]:
            return rnd.sample(items, min(n, len(items)))

        harness.run(
            check_example(harness, corpus, {**TRAP_CALLERS, **callers}, query_list, pick, counts)
        )

    run()
    return counts


@pytest.mark.slow
def test_search_returns_exactly_what_the_reference_rule_allows(harness: Harness) -> None:
    started = time.perf_counter()
    counts = search_property(harness, EXAMPLES)
    seconds = time.perf_counter() - started
    print(
        f"\npermission leaks (search): {counts['examples']} corpora "
        f"({counts['documents']} documents, {counts['chunks']} chunks) x "
        f"{counts['callers']} callers: {counts['acl_sweeps']} exact ACL sweeps "
        f"({counts['pairs_checked']} caller-chunk pairs), {counts['queries']} random queries "
        f"({counts['hits_returned']} hits checked), {counts['completeness_probes']} "
        f"completeness probes; 0 leaks, 0 missing; {seconds:.1f} s"
    )


def _domains_as_roles(roles: Sequence[str], domains: Sequence[str]) -> list[str]:
    """Bug: untyped matching (a domain called "admin" becomes the admin role)."""
    held = set(caller_entries(roles, domains))
    return sorted(held | {"role:" + d.strip().lower() for d in domains})


def _hierarchy_upside_down(roles: Sequence[str], domains: Sequence[str]) -> list[str]:
    """Bug: a role holds the roles *above* it instead of below."""
    held = {e for e in caller_entries(roles, domains) if not e.startswith("role:")}
    weights = [ROLE_WEIGHTS[r.strip().lower()] for r in roles if r.strip().lower() in ROLE_WEIGHTS]
    if weights:
        held |= {"role:" + name for name, w in ROLE_WEIGHTS.items() if w >= max(weights)}
    return sorted(held)


@pytest.mark.parametrize(
    "mutant", ["domains_as_roles", "hierarchy_upside_down", "keyword_side_unfiltered"]
)
def test_the_property_catches_planted_bugs(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, mutant: str
) -> None:
    """The property is not blind: with a known ACL bug planted (in the caller's entries, or
    the keyword side of the hybrid SQL without its ACL filter) it fails within 10 examples."""
    import foundation.identity
    import retrieval.store

    if mutant == "keyword_side_unfiltered":
        keyword_filter = "c.tsv @@ q.select_q"
        for ranking, sql in HYBRID_SQL_BY_RANKING.items():  # the statement of each ranking
            broken = sql.replace(f"{keyword_filter} AND {ACL_PREDICATE}", keyword_filter)
            assert broken != sql
            monkeypatch.setitem(retrieval.store.HYBRID_SQL_BY_RANKING, ranking, broken)
    else:
        bug = _domains_as_roles if mutant == "domains_as_roles" else _hierarchy_upside_down
        monkeypatch.setattr(foundation.identity, "caller_entries", bug)
    with pytest.raises((AssertionError, pytest.fail.Exception)) as caught:
        search_property(harness, 10)
    print(f"\nplanted bug {mutant}: caught - {str(caught.value).splitlines()[0][:160]}")


# --- 4. ACL changes on re-ingest ------------------------------------------------------------------

STAFF_DEFAULTS: tuple[tuple[str, ...], ...] = (
    (),
    ("role:business_staff",),
    ("role:admin",),
    ("domain:acme",),
    ("domain:admin", "role:business_admin"),
)


def test_acl_changes_on_reingest_take_effect_at_once(harness: Harness) -> None:
    """A page's front-matter ACL and, for a page without front matter, its folder's default
    change between ingestion runs (narrower, wider, sideways, back); after each run, every
    caller sees exactly what the new ACL allows - nothing of the old one lingers."""
    counts: Counter[str] = Counter()
    started = time.perf_counter()

    @settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        database=None,
        phases=PHASES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        steps=st.lists(
            st.tuples(
                st.one_of(st.none(), st.lists(acl_entries(), max_size=3).map(tuple)),
                st.sampled_from(STAFF_DEFAULTS),
            ),
            min_size=2,
            max_size=5,
        ),
        callers=random_callers(),
    )
    def run(
        steps: list[tuple[tuple[str, ...] | None, tuple[str, ...]]],
        callers: dict[str, dict[str, Any]],
    ) -> None:
        harness.examples += 1
        root = harness.home / f"reingest-{harness.examples}"
        harness.run(harness.store.pool.execute("TRUNCATE documents CASCADE"))
        everyone = {**TRAP_CALLERS, **callers}
        previous: tuple[str, ...] | None = None
        previous_text: str | None = None
        seen: dict[str, set[str]] = {}
        for index, (target_acl, staff_default) in enumerate(steps):
            target = Doc("pub", "target", target_acl, ("occupancy", "badge"), 2)
            plain = Doc("staff", "plain", None, ("gateway", "dock"), 2)
            target_path = write_doc(root, target)
            write_doc(root, plain)
            defaults = {"pub": [], "staff": list(staff_default)}
            report = harness.run(harness.ingest(root, defaults))
            text = target_path.read_text()
            expected_replaced = 0
            if index:
                expected_replaced += text != previous_text
                expected_replaced += ref_acl(staff_default) != ref_acl(previous or ())
            assert (report.new, report.replaced) == (0 if index else 2, expected_replaced), (
                report.as_dict()
            )
            previous, previous_text = staff_default, text
            docs = {
                target_path.as_posix(): ref_acl(target.acl if target.acl is not None else []),
                (root / "staff/plain.md").as_posix(): ref_acl(staff_default),
            }
            rows = harness.run(
                harness.store.pool.fetch(
                    "SELECT c.id, d.source, c.section, c.text FROM chunks c "
                    "JOIN documents d ON d.id = c.document_id"
                )
            )
            chunks = {r["id"]: (r["source"], r["section"], r["text"]) for r in rows}
            counts["runs"] += 1
            for label, claims in everyone.items():
                user, ref = user_for(label, claims), ref_caller(label, claims)
                visible = {
                    cid for cid, (src, _, _) in chunks.items() if ref_visible(docs[src] or (), ref)
                }
                vector = harness.run(harness.embedder.aencode(["occupancy gateway"]))[0]
                got = {
                    c.chunk_id
                    for c in harness.run(
                        harness.store.hybrid_candidates(
                            "occupancy gateway", vector, user.acl_entries, k_vector=50, k_keyword=50
                        )
                    )
                }
                assert got == visible, (label, user.acl_entries, target.acl, staff_default)
                counts["checks"] += 1
                if index:
                    before = seen[label]
                    counts["documents hidden by a narrower ACL"] += len(
                        {chunks[c][0] for c in before if c in chunks} - {chunks[c][0] for c in got}
                    )
                    counts["documents shown by a wider ACL"] += len(
                        {chunks[c][0] for c in got} - {chunks[c][0] for c in before if c in chunks}
                    )
                seen[label] = got
        counts["examples"] += 1

    run()
    print(
        f"\npermission leaks (re-ingest): {counts['examples']} ACL histories, {counts['runs']} "
        f"ingestion runs, {counts['checks']} caller checks (documents hidden by a narrower "
        f"ACL: {counts['documents hidden by a narrower ACL']}, shown by a wider one: "
        f"{counts['documents shown by a wider ACL']}); all exact; "
        f"{time.perf_counter() - started:.1f} s"
    )


# --- through the agent: search_docs, /ask JSON and SSE, citations, tool trace, errors ----------

FACTS = ROOT / "documentation/FACTS.md"
INVENTED_ID = "0123456789ab"  # shaped like a chunk id, never one: the control for hidden ids


def load_facts() -> dict[str, Any]:
    import yaml

    text = FACTS.read_text(encoding="utf-8")
    block = text.split("## Machine-readable form", 1)[1].split("```yaml", 1)[1].split("```")[0]
    facts: dict[str, Any] = yaml.safe_load(block)
    return facts


def claims_header(claims: dict[str, Any]) -> dict[str, str]:
    return {"x-gateway-claims": base64.b64encode(json.dumps(claims).encode()).decode()}


class ReactiveModel:
    """The worst-case model, over the scripted OpenAI-compatible server (real wire protocol,
    both tool-calling modes): before each hop it scripts the server's next reply from what
    the hop's request holds. Hop 1 searches the documentation with the question. Hop 2
    repeats every watched leak token that it *saw* in a tool result (and only those: the
    question does not count), cites every chunk id it saw, and also tries to cite the hidden
    page's chunk ids and an invented id. With ``fail_after_search`` hop 2 is instead a
    provider 500 whose body echoes everything the model was sent (a provider that reflects
    its prompt into an error)."""

    def __init__(self, inner: Any, state: Any, mode: str) -> None:
        self.inner = inner
        self.state = state
        self.mode = mode
        self.watch: list[str] = []
        self.attempt_ids: list[str] = []
        self.fail_after_search = False

    @property
    def default_model(self) -> str:
        return str(self.inner.default_model)

    async def chat(self, request: Any) -> Any:
        self._plan(request)
        return await self.inner.chat(request)

    def stream(self, request: Any) -> Any:
        self._plan(request)
        return self.inner.stream(request)

    def _plan(self, request: Any) -> None:
        question = next(m.content for m in request.messages if m.role == "user")
        seen = "\n".join(m.content or "" for m in request.messages if m.role == "tool")
        step: dict[str, Any]
        if not seen:
            call = {"name": "search_docs", "arguments": {"query": question[:500]}}
            if self.mode == "native":
                step = {"tool_calls": [call]}
            else:
                step = {"json": {"reason": "look it up", "tool": call["name"], **call}}
                step["json"].pop("name")
        elif self.fail_after_search:
            step = {"fault": "server_error", "status": 500, "message": "echo: " + seen[:4000]}
        else:
            ids = re.findall(r'"chunk_id":\s*"([^"]+)"', seen)
            cite = list(dict.fromkeys([*ids, *self.attempt_ids, INVENTED_ID]))
            echoed = [token for token in self.watch if token in seen]
            text = "Found: " + "; ".join(echoed) + ". " + " ".join(f"[^{i}]" for i in cite)
            if self.mode == "native":
                step = {"text": text, "chunk_chars": 7}
            else:
                final = {"reason": "answer", "final_answer": text, "sources": cite}
                step = {"json": final, "chunk_chars": 7}
        self.state.script(step, key=question)


def textual(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without its numbers (durations, usage, cost, trace id: digits such as
    ``10.853`` would contain a leak token like ``0.85`` by chance)."""
    out = {k: v for k, v in answer.items() if k not in {"usage", "cost", "trace_id"}}
    out["tool_calls"] = [
        {k: v for k, v in c.items() if k != "duration_ms"} for c in answer.get("tool_calls", [])
    ]
    return out


@dataclass
class AskWorld:
    scripted_url: str
    state: Any
    twin_url: str
    sensor_url: str


@pytest.fixture(scope="module")
def ask_world() -> Iterator[AskWorld]:
    from local_world.clock import FixedClock
    from local_world.scripted_llm import ScriptedLLM, create_llm_app
    from local_world.sensor_service import create_sensor_app
    from local_world.servers import run_in_thread
    from local_world.twin_service import create_twin_app
    from local_world.world import build_world

    world, clock, state = build_world(), FixedClock("2025-03-04T10:30:00Z"), ScriptedLLM()
    with (
        run_in_thread(create_llm_app(state)) as llm_url,
        run_in_thread(create_twin_app(world, clock=clock)) as twin_url,
        run_in_thread(create_sensor_app(world, clock=clock)) as sensor_url,
    ):
        yield AskWorld(llm_url + "/v1", state, twin_url, sensor_url)


@pytest.mark.parametrize("mode", ["native", "json_schema"])
async def test_nothing_leaks_through_the_agent(
    mode: str, ask_world: AskWorld, sample_docs_url: str, cached_minilm: Any, tmp_path: Path
) -> None:
    """Every FACTS.md test caller (plus an empty membership list and upper-case domains
    named like roles) asks each restricted page's question and paraphrase, as JSON and as
    SSE, and once more with a provider error after the search. For a caller who may not see
    the page, none of its leak tokens, chunk ids or file name appears in the answer, the
    citations, the tool trace, any SSE event, the error, or what the model was sent; its
    chunk ids the model tries to cite are reported exactly like an invented id. For a
    caller who may see it, the same model does repeat the page (the check is not blind).

    The provider-error variant plays a provider that echoes its whole prompt in its error
    message, which the service shows the caller (redacted of keys, truncated): safe for
    permissions only because the prompt never holds a chunk the caller may not see."""
    import httpx

    from agent.llm.openai_client import OpenAICompatibleClient
    from serve_app.api.app import create_app
    from serve_app.authz import load_authorizer
    from serve_app.wiring import build_local_backend

    facts = load_facts()
    callers: dict[str, dict[str, Any]] = dict(facts["callers"])
    callers["empty_memberships"] = {"sub": "u-empty", "memberships": []}
    callers["upper_case_role_named_domains"] = {
        "sub": "u-trick3",
        "roles": [],
        "domains": ["ADMIN", "Business_Admin", "role:admin"],
    }
    pages = facts["restricted_pages"]
    watch = [t for p in pages for t in p["leak_tokens"]]

    settings_ = Settings(
        _env_file=None,  # type: ignore[call-arg]
        agent_service_home=tmp_path / "home",
        database_url=sample_docs_url,
        twin_service_url=ask_world.twin_url,
        sensor_service_url=ask_world.sensor_url,
        llm_base_url=ask_world.scripted_url,
        llm_api_key="test-key",  # type: ignore[arg-type]
        answer_model="local/scripted",
        llm_max_retries=0,
        llm_timeout_seconds=10.0,
        tool_calling_mode=mode,  # type: ignore[arg-type]
    )
    inner = OpenAICompatibleClient(
        base_url=ask_world.scripted_url,
        api_key="test-key",
        default_model="local/scripted",
        tool_calling_mode=mode,  # type: ignore[arg-type]
        timeout_seconds=10.0,
        max_retries=0,
    )
    model = ReactiveModel(inner, ask_world.state, mode)
    model.watch = watch
    authorizer = load_authorizer()
    # MiniLM's vectors of these fixed questions are kept between sessions (the same vectors)
    backend = build_local_backend(
        settings_, authorizer=authorizer, llm=model, embedder=cached_minilm
    )
    app = create_app(backend, settings_, authorizer)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)

    try:
        store = await PgDocumentStore.connect(sample_docs_url, embedding_dim=DIM, max_size=1)
        try:
            ids_by_page = {
                p["id"]: [
                    r["id"]
                    for r in await store.pool.fetch(
                        "SELECT c.id FROM chunks c JOIN documents d ON d.id = c.document_id "
                        "WHERE d.source = $1 ORDER BY c.ordinal",
                        (ROOT / "documentation" / p["source"]).as_posix(),
                    )
                ]
                for p in pages
            }
        finally:
            await store.close()
        assert all(ids_by_page.values()), "the sample docs lack a restricted page"

        counts: Counter[str] = Counter()
        started = time.perf_counter()
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            for caller, claims in callers.items():
                ref = ref_caller(caller, claims)
                for page in pages:
                    acl = ref_acl(page["permissions"])
                    assert acl is not None
                    visible = ref_visible(acl, ref)
                    # the oracle agrees with FACTS.md wherever FACTS.md names the caller
                    assert caller not in page["visible_to"] or visible, (caller, page["id"])
                    assert caller not in page["hidden_from"] or not visible, (caller, page["id"])
                    hidden_ids = ids_by_page[page["id"]]
                    model.attempt_ids = hidden_ids[:3]
                    for variant, question in (("q", page["question"]), ("p", page["paraphrase"])):
                        for how in ("json", "sse", "provider_error"):
                            if how == "provider_error" and variant == "p":
                                continue
                            model.fail_after_search = how == "provider_error"
                            ask = f"[{caller} {how} {variant}] {question}"
                            counts["asks"] += 1
                            response = await client.post(
                                "/ask",
                                json={"question": ask, "stream": how == "sse", "top_k": 10},
                                headers=claims_header(claims),
                            )
                            answer, streamed = _collect(response, how)
                            sent = json.dumps(
                                [r.body for r in ask_world.state.chat_requests(ask)],
                                ensure_ascii=False,
                            )
                            if visible:
                                counts["visible asks"] += 1
                                _assert_visible_control(
                                    page, hidden_ids, answer, streamed, sent, how, variant, counts
                                )
                                continue
                            counts["hidden asks"] += 1
                            forbidden = [
                                t for t in page["leak_tokens"] if t.lower() not in ask.lower()
                            ]
                            forbidden += [*hidden_ids, Path(page["source"]).stem]
                            # the model's attempts at hidden ids are reported like an invented id
                            if how != "provider_error":
                                hallucinated = set(
                                    answer["retrieval"].pop("hallucinated_citations")
                                )
                                assert hallucinated == {*hidden_ids[:3], INVENTED_ID}, hallucinated
                            for label, blob in (
                                ("response", json.dumps(textual(answer), ensure_ascii=False)),
                                ("stream", streamed),
                                ("model input", sent),
                            ):
                                for token in forbidden:
                                    assert token not in blob, (
                                        f"LEAK of {page['id']} to {caller} ({how}, {mode}) "
                                        f"in the {label}: {token!r}"
                                    )
                            counts["forbidden strings checked"] += len(forbidden) * 3
    finally:
        await backend.close()
        await inner.aclose()
    print(
        f"\npermission leaks (/ask, {mode}): {len(callers)} callers x {len(pages)} restricted "
        f"pages: {counts['asks']} asks ({counts['hidden asks']} by a caller the page is hidden "
        f"from: {counts['forbidden strings checked']} forbidden-string checks, 0 found; "
        f"{counts['visible asks']} visible controls, the page repeated in "
        f"{counts['control repeated']} of {counts['control answers']} answers, and echoed in "
        f"{counts['control errors echoing the page']} of {counts['control errors']} provider "
        "errors); "
        f"{time.perf_counter() - started:.1f} s"
    )


def _collect(response: Any, how: str) -> tuple[dict[str, Any], str]:
    """The final answer object and everything else the response carried, as text."""
    if how == "json":
        assert response.status_code == 200, response.text
        return response.json(), ""
    if how == "provider_error":
        assert response.status_code in (502, 503), response.text
        body = response.json()
        assert body["decision"] == "provider_error", body
        return body, ""
    assert response.status_code == 200, response.text
    events = parse_sse_text(response.text)
    assert events and events[-1][0] == "done", events[-1:]
    answer = events[-1][1]
    rest = [
        (name, {k: v for k, v in data.items() if k != "duration_ms"} if name == "tool" else data)
        for name, data in events[:-1]
    ]
    return answer, json.dumps(rest, ensure_ascii=False)


def _assert_visible_control(
    page: dict[str, Any],
    page_ids: list[str],
    answer: dict[str, Any],
    streamed: str,
    sent: str,
    how: str,
    variant: str,
    counts: Counter[str],
) -> None:
    """A caller who may see the page: retrieval hands it to the model, which repeats it -
    so the hidden-caller checks above would catch a leak - except through a provider error,
    whose echo of the prompt (the page included) is the caller's own data."""
    if how == "provider_error":
        counts["control errors"] += 1
        if any(t in answer["error"]["message"] for t in page["leak_tokens"]):
            counts["control errors echoing the page"] += 1
        return
    counts["control answers"] += 1
    cited = {c["chunk_id"] for c in answer["citations"]}
    if any(t in answer["answer"] for t in page["leak_tokens"]) and cited & set(page_ids):
        counts["control repeated"] += 1
        if how == "sse":
            assert any(t in streamed for t in page["leak_tokens"])
    if variant == "q":  # the exact question retrieves the page for whoever may see it
        assert any(t in sent for t in page["leak_tokens"]), page["id"]
        assert cited & set(page_ids), (page["id"], answer["citations"])
