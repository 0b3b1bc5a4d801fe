"""No existence oracle (issue 8, item 2): for every twin/sensor tool that takes a building or
room id, an id that does not exist and an id that exists but belongs to a domain the caller
may not see give the same answer, byte for byte, and take the same time.

The tools run through the registry (argument validation, error mapping) against the real
twin and sensor simulators, in process (ASGI, no sockets) for the bodies and over HTTP for
the timing (the round trips an outside observer would time), as ``nina``
(``business_staff`` of ``northwind``): Acme and Civic buildings and rooms exist but are
forbidden to her.

Timing: 200 calls per side, the two sides interleaved in a seeded random order (so load from
other processes hits both alike), compared with a two-sided Mann-Whitney U test. A side
channel is reported only when the difference is both significant (p < ``ALPHA``) and large
enough to matter (medians apart by more than ``MIN_EFFECT_MS`` and ``REL_EFFECT`` of the
pooled median). A real oracle is well past both: one extra downstream round trip is about
+1 ms on a ~1.1 ms call (``test_the_timing_test_detects_a_real_oracle``); the interleaved
sides of an honest pair differ by about 0.01 ms. ``pytest -s`` prints the medians and
p-values.

The timing property assumes what the spec requires of twin-service and sensor-service (and
what the simulators do): one 404 for unknown and forbidden. A downstream that answers for a
building Cedar then denies still yields the identical body
(``test_bodies_stay_identical_when_a_downstream_overshares``), but not the same time: the
room tools then make their building lookup on one side only (see docs/security.md).
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from agent_helpers import NORTHWIND_STAFF, Service, mesh_user
from scipy.stats import mannwhitneyu

from agent.llm.base import ToolCall
from agent.loop import Agent
from agent.testing import ScriptedModel, text_reply, tool_call, tool_calls_reply
from agent.tools import ToolContext, ToolOutcome, ToolRegistry
from agent.tools.twin import BUILDING_NOT_FOUND, ROOM_NOT_FOUND
from foundation.identity import AuthUser
from local_world.claims import encode_claims
from local_world.world import World

MakeCtx = Callable[..., ToolContext]

TRIES = 200
WARMUP = 10
ALPHA = 1e-3
MIN_EFFECT_MS = 0.1
REL_EFFECT = 0.1
CALLER = NORTHWIND_STAFF
HARBOR = "bld-northwind-harbor"

# Ids that do not exist, shaped like real ones (some like the caller's own).
UNKNOWN_BUILDINGS = ["bld-acme-annex", "bld-northwind-depot", "bld-nowhere", "x"]
UNKNOWN_ROOMS = ["room-acme-tower-roof", "room-harbor-dock-z", "room-nowhere", "r"]


def forbidden_buildings(world: World) -> list[str]:
    return [b.id for b in world.buildings if b.domain != "northwind"]


def forbidden_rooms(world: World) -> list[str]:
    foreign = set(forbidden_buildings(world))
    return [r.id for r in world.rooms if r.building_id in foreign]


@dataclass(frozen=True)
class Probe:
    """One tool, and how to call it with a building or room id in the probed position."""

    tool: str
    arguments: Callable[[str], dict[str, Any]]
    kind: str  # "building" or "room"
    error: str
    forbidden: str  # the representative ids for the timing test (similar lengths)
    unknown: str


PROBES = [
    Probe(
        "get_building",
        lambda i: {"building_id": i},
        "building",
        BUILDING_NOT_FOUND,
        "bld-acme-tower",
        "bld-acme-annex",
    ),
    Probe(
        "list_sensors",
        lambda i: {"building_id": i},
        "building",
        BUILDING_NOT_FOUND,
        "bld-acme-tower",
        "bld-acme-annex",
    ),
    Probe(
        "list_sensors (room of a visible building)",
        lambda i: {"building_id": HARBOR, "room_id": i},
        "room",
        ROOM_NOT_FOUND,
        "room-acme-tower-lobby",
        "room-harbor-dock-zzz1",
    ),
    Probe(
        "get_room",
        lambda i: {"room_id": i},
        "room",
        ROOM_NOT_FOUND,
        "room-acme-tower-lobby",
        "room-acme-tower-roof1",
    ),
    Probe(
        "get_room_occupancy",
        lambda i: {"room_ids": [i]},
        "room",
        ROOM_NOT_FOUND,
        "room-acme-tower-lobby",
        "room-acme-tower-roof1",
    ),
    Probe(
        "get_latest_sensor_data",
        lambda i: {"room_id": i, "sensor_type": "co2"},
        "room",
        ROOM_NOT_FOUND,
        "room-library-reading",
        "room-library-cellar1",
    ),
    Probe(
        "get_sensor_history",
        lambda i: {"room_id": i, "sensor_type": "co2", "hours": 6},
        "room",
        ROOM_NOT_FOUND,
        "room-library-reading",
        "room-library-cellar1",
    ),
]


def error_json(message: str) -> str:
    """A failed tool's result, as the model reads it (the registry's compact JSON)."""
    return json.dumps({"error": message}, separators=(",", ":"), ensure_ascii=False)


def tool_name(probe: Probe) -> str:
    return probe.tool.split(" ")[0]


async def dispatch(
    registry: ToolRegistry, ctx: ToolContext, probe: Probe, entity_id: str
) -> ToolOutcome:
    call = ToolCall("call_1", tool_name(probe), json.dumps(probe.arguments(entity_id)))
    return await registry.dispatch(call, ctx)


async def timed(
    registry: ToolRegistry, ctx: ToolContext, probe: Probe, entity_id: str
) -> tuple[float, ToolOutcome]:
    started = time.perf_counter()
    outcome = await dispatch(registry, ctx, probe, entity_id)
    return (time.perf_counter() - started) * 1000.0, outcome


# --- bodies ------------------------------------------------------------------------------------


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.tool)
async def test_unknown_and_forbidden_ids_give_byte_identical_results(
    probe: Probe, registry: ToolRegistry, make_local_ctx: MakeCtx, world: World
) -> None:
    ctx = make_local_ctx(CALLER)
    forbidden = forbidden_buildings(world) if probe.kind == "building" else forbidden_rooms(world)
    unknown = UNKNOWN_BUILDINGS if probe.kind == "building" else UNKNOWN_ROOMS
    outcomes = {i: await dispatch(registry, ctx, probe, i) for i in [*forbidden, *unknown]}
    assert all(not o.ok for o in outcomes.values())
    assert {o.error for o in outcomes.values()} == {probe.error}
    results = {o.result_json.encode("utf-8") for o in outcomes.values()}
    assert results == {error_json(probe.error).encode("utf-8")}, results
    print(f"\n[existence-oracle] {probe.tool}: {len(outcomes)} ids, one body")


async def test_a_mixed_occupancy_request_does_not_tell_them_apart(
    registry: ToolRegistry, make_local_ctx: MakeCtx, world: World
) -> None:
    """A visible room next to a forbidden or an unknown one: the same entry for both (but for
    the echoed id, which the caller sent)."""
    ctx = make_local_ctx(CALLER)
    bodies = set()
    for other in [*forbidden_rooms(world), *UNKNOWN_ROOMS]:
        call = ToolCall(
            "call_1",
            "get_room_occupancy",
            json.dumps({"room_ids": ["room-harbor-dock-a", other]}),
        )
        outcome = await registry.dispatch(call, ctx)
        assert outcome.ok
        rooms = json.loads(outcome.result_json)["rooms"]
        assert rooms[1] == {"room_id": other, "error": ROOM_NOT_FOUND}
        bodies.add(outcome.result_json.replace(json.dumps(other), '"<id>"'))
    assert len(bodies) == 1


async def test_bodies_stay_identical_when_a_downstream_overshares(
    registry: ToolRegistry, make_local_ctx: MakeCtx, world: World
) -> None:
    """The downstream answer is untrusted: here twin-service and sensor-service see an admin
    (they answer for every building), while the caller is Nina. Cedar's re-check turns a
    forbidden building into the very same error as an unknown one."""
    admin_header = encode_claims(CALLER.sub, [("northwind", "admin")])
    user = AuthUser(CALLER.sub, CALLER.roles, CALLER.domains, claims_header=admin_header)
    ctx = make_local_ctx(user)
    for probe in PROBES:
        forbidden = (
            forbidden_buildings(world) if probe.kind == "building" else forbidden_rooms(world)
        )
        unknown = UNKNOWN_BUILDINGS if probe.kind == "building" else UNKNOWN_ROOMS
        results = {
            (await dispatch(registry, ctx, probe, i)).result_json for i in [*forbidden, *unknown]
        }
        assert results == {error_json(probe.error)}, (probe.tool, results)


# --- timing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    forbidden_ms: list[float]
    unknown_ms: list[float]
    labels: tuple[str, str] = ("forbidden", "unknown")

    @property
    def medians(self) -> tuple[float, float]:
        return statistics.median(self.forbidden_ms), statistics.median(self.unknown_ms)

    @property
    def p_value(self) -> float:
        result = mannwhitneyu(self.forbidden_ms, self.unknown_ms, alternative="two-sided")
        return float(result.pvalue)

    @property
    def tolerance_ms(self) -> float:
        pooled = statistics.median(self.forbidden_ms + self.unknown_ms)
        return max(MIN_EFFECT_MS, REL_EFFECT * pooled)

    def distinguishable(self) -> bool:
        forbidden, unknown = self.medians
        return self.p_value < ALPHA and abs(forbidden - unknown) > self.tolerance_ms

    def describe(self) -> str:
        forbidden, unknown = self.medians
        return (
            f"median {self.labels[0]} {forbidden:.3f} ms, {self.labels[1]} {unknown:.3f} ms "
            f"(diff {forbidden - unknown:+.3f} ms, tolerance {self.tolerance_ms:.3f} ms), "
            f"Mann-Whitney U p={self.p_value:.3g} over {len(self.forbidden_ms)}+"
            f"{len(self.unknown_ms)} calls"
        )


async def compare(
    registry: ToolRegistry, ctx: ToolContext, probe: Probe, forbidden: str, unknown: str
) -> Comparison:
    rng = random.Random(f"{probe.tool}:{forbidden}:{unknown}")
    for _ in range(WARMUP):
        await dispatch(registry, ctx, probe, forbidden)
        await dispatch(registry, ctx, probe, unknown)
    times: dict[str, list[float]] = {forbidden: [], unknown: []}
    bodies: set[str] = set()
    gc.collect()
    gc.disable()
    try:
        for _ in range(TRIES):
            order = [forbidden, unknown]
            rng.shuffle(order)
            for entity_id in order:
                elapsed, outcome = await timed(registry, ctx, probe, entity_id)
                times[entity_id].append(elapsed)
                bodies.add(outcome.result_json)
    finally:
        gc.enable()
    assert bodies == {error_json(probe.error)}
    return Comparison(times[forbidden], times[unknown])


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.tool)
@pytest.mark.allow_sockets  # timing of the real round trips to the services
async def test_unknown_and_forbidden_ids_take_the_same_time(
    probe: Probe, registry: ToolRegistry, make_ctx: MakeCtx, twin: Service, sensor: Service
) -> None:
    comparison = await compare(registry, make_ctx(CALLER), probe, probe.forbidden, probe.unknown)
    print(f"\n[existence-oracle] {probe.tool}: {comparison.describe()}")
    assert not comparison.distinguishable(), f"{probe.tool}: {comparison.describe()}"


@pytest.mark.allow_sockets
async def test_the_timing_test_detects_a_real_oracle(
    registry: ToolRegistry, make_ctx: MakeCtx, twin: Service, sensor: Service
) -> None:
    """The statistic is not blind: a visible room against an unknown one (one successful
    lookup chain against a single 404) is told apart."""
    probe = PROBES[3]  # get_room: visible = room + building lookups; unknown = one 404
    ctx = make_ctx(CALLER)
    rng = random.Random(7)
    times: dict[str, list[float]] = {"room-harbor-dock-a": [], probe.unknown: []}
    for _ in range(WARMUP):
        for entity_id in times:
            await dispatch(registry, ctx, probe, entity_id)
    for _ in range(TRIES // 2):
        order = list(times)
        rng.shuffle(order)
        for entity_id in order:
            elapsed, _ = await timed(registry, ctx, probe, entity_id)
            times[entity_id].append(elapsed)
    comparison = Comparison(
        times["room-harbor-dock-a"], times[probe.unknown], ("visible", "unknown")
    )
    print(f"\n[existence-oracle] control (visible vs unknown room): {comparison.describe()}")
    assert comparison.distinguishable(), comparison.describe()


# --- through the agent -------------------------------------------------------------------------


def _comparable(answer: Any, entity_id: str) -> str:
    """The answer as JSON without what differs per run (durations, trace id) and with the
    probed id (which the caller sent) masked."""
    body = answer.model_dump(mode="json")
    body.pop("trace_id", None)
    for call in body["tool_calls"]:
        call["duration_ms"] = 0
    return json.dumps(body, sort_keys=True).replace(entity_id, "<id>")


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.tool)
async def test_the_agent_answer_and_the_model_input_are_identical(
    probe: Probe,
    make_local_agent: Callable[..., Agent],
) -> None:
    """End to end: the same ``/ask`` answer (tool trace, error, usage) and the same tool
    message to the model, for a forbidden and for an unknown id."""
    answers, tool_messages = [], []
    for entity_id in (probe.forbidden, probe.unknown):
        question = f"Tell me about {entity_id}"
        model = ScriptedModel(
            tool_calls_reply(
                tool_call(tool_name(probe), probe.arguments(entity_id), id="call_probe")
            ),
            text_reply("I cannot see that one."),
            model="local/scripted",
        )
        answer = await make_local_agent(model).answer(question, CALLER)
        assert answer.tool_calls[0].error == probe.error
        answers.append(_comparable(answer, entity_id))
        messages = model.requests[-1].messages
        tool_messages.append([m for m in messages if m.role == "tool"])
    assert answers[0] == answers[1]
    assert tool_messages[0] == tool_messages[1]
    assert tool_messages[0][0].content == error_json(probe.error)


def test_the_probed_users_are_what_the_docstring_says(world: World) -> None:
    assert CALLER.domains == ("northwind",) and not CALLER.is_admin
    assert {world.building(b).domain for b in forbidden_buildings(world)} == {
        "acme",
        "civic",
    }
    for probe in PROBES:
        assert probe.forbidden in (forbidden_buildings(world) + forbidden_rooms(world))
        assert world.building(probe.unknown) is None and world.room(probe.unknown) is None
    assert mesh_user("x", ("northwind", "admin")).is_admin
