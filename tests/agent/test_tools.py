"""The eight tools against the real twin and sensor simulators, in process (over ASGI, no
sockets), through the registry (so argument validation and error mapping are exercised too).
The downstream timeout test stays on HTTP: ASGITransport does not enforce httpx timeouts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from agent_helpers import (
    ACME_STAFF,
    ADMIN,
    FLAT_HEADER,
    NORTHWIND_STAFF,
    FakeRetriever,
    Service,
    eval_user,
    hit,
)

from agent.llm.base import ToolCall
from agent.tools import ToolContext, ToolOutcome, ToolRegistry
from agent.tools.twin import BUILDING_NOT_FOUND, ROOM_NOT_FOUND
from foundation.identity import AuthUser
from local_world.claims import HEADER, parse_claims
from local_world.world import World, epoch_minute

HARBOR = "bld-northwind-harbor"
HARBOR_ROOMS = {
    "room-harbor-dock-a",
    "room-harbor-dock-b",
    "room-harbor-cold-store",
    "room-harbor-dispatch",
}

MakeCtx = Callable[..., ToolContext]


async def call(
    registry: ToolRegistry, ctx: ToolContext, name: str, arguments: dict[str, Any] | str
) -> ToolOutcome:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return await registry.dispatch(ToolCall(id="call_1", name=name, arguments=raw), ctx)


def result(outcome: ToolOutcome) -> Any:
    assert outcome.ok, outcome.error
    return json.loads(outcome.result_json)


# --- list_sensors (the spec's list) ------------------------------------------------------------


async def test_list_sensors_building_inventory(
    registry: ToolRegistry,
    make_local_ctx: MakeCtx,
    world: World,
    local_twin: Service,
    local_sensor: Service,
) -> None:
    out = result(
        await call(
            registry, make_local_ctx(NORTHWIND_STAFF), "list_sensors", {"building_id": HARBOR}
        )
    )
    expected = {(s.id, s.type, s.room_id) for s in world.sensors_in_building(HARBOR)}
    assert {(s["sensor_id"], s["sensor_type"], s["room_id"]) for s in out["sensors"]} == expected
    assert out["count"] == len(expected) == 14
    names = {s["room_id"]: s["room_name"] for s in out["sensors"]}
    assert names["room-harbor-dock-a"] == "Loading Dock A"
    assert set(out["sensors"][0]) == {"sensor_id", "sensor_type", "room_id", "room_name"}
    # the twin was asked first, then the sensor registry, both as the caller
    assert local_twin.paths() == [f"/buildings/{HARBOR}", f"/buildings/{HARBOR}/rooms"]
    assert local_sensor.paths() == [f"/sensors/buildings/{HARBOR}"]
    header = NORTHWIND_STAFF.claims_header
    for entry in local_twin.control.requests() + local_sensor.control.requests():
        assert entry.headers[HEADER] == header


async def test_list_sensors_room_tells_no_sensor_apart(
    registry: ToolRegistry, make_local_ctx: MakeCtx, local_sensor: Service
) -> None:
    ctx = make_local_ctx(ACME_STAFF)
    quiet = result(
        await call(
            registry,
            ctx,
            "list_sensors",
            {"building_id": "bld-acme-labs", "room_id": "room-acme-labs-quiet"},
        )
    )
    assert quiet["sensors"] == [] and "No sensors are installed" in quiet["note"]
    assert quiet["room_name"] == "Quiet Room"
    lab = result(
        await call(
            registry,
            ctx,
            "list_sensors",
            {"building_id": "bld-acme-labs", "room_id": "room-acme-labs-wet-lab"},
        )
    )
    assert sorted(s["sensor_type"] for s in lab["sensors"]) == ["co2", "humidity", "temperature"]
    assert (
        local_sensor.paths()[-1] == "/sensors/buildings/bld-acme-labs/rooms/room-acme-labs-wet-lab"
    )


async def test_list_sensors_inaccessible_and_unknown_building_are_identical(
    registry: ToolRegistry, make_local_ctx: MakeCtx, local_sensor: Service
) -> None:
    ctx = make_local_ctx(NORTHWIND_STAFF)
    forbidden = await call(registry, ctx, "list_sensors", {"building_id": "bld-acme-tower"})
    unknown = await call(registry, ctx, "list_sensors", {"building_id": "bld-nowhere"})
    assert not forbidden.ok and not unknown.ok
    assert forbidden.error == unknown.error == BUILDING_NOT_FOUND
    assert forbidden.result_json.encode() == unknown.result_json.encode()
    assert local_sensor.paths() == []  # the registry is never asked


async def test_list_sensors_unknown_room_makes_no_sensor_request(
    registry: ToolRegistry, make_local_ctx: MakeCtx, local_sensor: Service
) -> None:
    ctx = make_local_ctx(NORTHWIND_STAFF)
    unknown = await call(
        registry, ctx, "list_sensors", {"building_id": HARBOR, "room_id": "room-nowhere"}
    )
    # a real room, but of another (here also inaccessible) building
    foreign = await call(
        registry, ctx, "list_sensors", {"building_id": HARBOR, "room_id": "room-acme-labs-quiet"}
    )
    assert unknown.error == foreign.error == ROOM_NOT_FOUND
    assert unknown.result_json == foreign.result_json
    assert local_sensor.control.requests() == []


async def test_list_sensors_drops_devices_of_other_rooms(
    registry: ToolRegistry, make_local_ctx: MakeCtx, world: World, local_sensor: Service
) -> None:
    local_sensor.control.set_faults(leak_foreign_rooms=True)
    ctx = make_local_ctx(NORTHWIND_STAFF)
    building = result(await call(registry, ctx, "list_sensors", {"building_id": HARBOR}))
    assert {s["room_id"] for s in building["sensors"]} == HARBOR_ROOMS
    assert building["count"] == len(world.sensors_in_building(HARBOR))
    room = result(
        await call(
            registry,
            ctx,
            "list_sensors",
            {"building_id": HARBOR, "room_id": "room-harbor-cold-store"},
        )
    )
    assert {s["room_id"] for s in room["sensors"]} == {"room-harbor-cold-store"}
    assert sorted(s["sensor_type"] for s in room["sensors"]) == ["humidity", "temperature"]
    # the leak was real: the simulator did send foreign devices
    assert local_sensor.control.faults.leak_foreign_rooms


async def test_list_sensors_admin_sees_any_domain(
    registry: ToolRegistry, make_local_ctx: MakeCtx
) -> None:
    out = result(
        await call(registry, make_local_ctx(ADMIN), "list_sensors", {"building_id": HARBOR})
    )
    assert out["count"] == 14


async def test_eval_token_user_acts_as_itself_downstream(
    registry: ToolRegistry, make_local_ctx: MakeCtx, local_twin: Service
) -> None:
    user = eval_user("eve", ["business_staff"], ["acme"])
    out = result(await call(registry, make_local_ctx(user), "list_buildings", {}))
    assert {b["domain"] for b in out["buildings"]} == {"acme"}
    sent = local_twin.control.requests()[0].headers[HEADER]
    claims = parse_claims(sent)
    assert (claims.sub, claims.roles, claims.domains) == ("eve", ("business_staff",), ("acme",))
    assert parse_claims(FLAT_HEADER) == claims


@pytest.mark.parametrize("spelling", ["NorthWind", " NORTHWIND ", "northwind"])
async def test_a_membership_in_any_case_is_one_tenant_end_to_end(
    registry: ToolRegistry, make_local_ctx: MakeCtx, local_twin: Service, spelling: str
) -> None:
    """One rule for domain names (``normalize_domain``), through the tools: the mesh's header
    reaches the twin simulator verbatim ("NorthWind"), which folds case as the service does,
    and Cedar's check of the answer agrees: the caller sees Northwind's buildings, and only
    those, even when the twin overshares."""
    from local_world.claims import encode_claims

    user = AuthUser.from_claims_header(encode_claims("nina", [(spelling, "business_staff")]))
    local_twin.control.set_faults(leak_foreign_buildings=True)
    out = result(await call(registry, make_local_ctx(user), "list_buildings", {}))
    assert {b["building_id"] for b in out["buildings"]} == {HARBOR, "bld-northwind-hq"}
    harbor = result(
        await call(registry, make_local_ctx(user), "get_building", {"building_id": HARBOR})
    )
    assert harbor["building"]["name"] == "Harbor Warehouse"
    forbidden = await call(
        registry, make_local_ctx(user), "get_building", {"building_id": "bld-acme-tower"}
    )
    assert not forbidden.ok and forbidden.error == BUILDING_NOT_FOUND


# --- buildings, rooms, occupancy --------------------------------------------------------------


async def test_list_buildings_filters_by_cedar_even_when_twin_leaks(
    registry: ToolRegistry, make_local_ctx: MakeCtx, local_twin: Service
) -> None:
    local_twin.control.set_faults(leak_foreign_buildings=True)
    out = result(await call(registry, make_local_ctx(NORTHWIND_STAFF), "list_buildings", {}))
    assert {b["building_id"] for b in out["buildings"]} == {HARBOR, "bld-northwind-hq"}
    named = result(
        await call(registry, make_local_ctx(NORTHWIND_STAFF), "list_buildings", {"name": "harbor"})
    )
    assert [b["name"] for b in named["buildings"]] == ["Harbor Warehouse"]
    none = result(
        await call(registry, make_local_ctx(NORTHWIND_STAFF), "list_buildings", {"name": "Acme"})
    )
    assert none["buildings"] == [] and "No accessible building" in none["note"]


async def test_get_building_lists_its_rooms(
    registry: ToolRegistry, make_local_ctx: MakeCtx
) -> None:
    out = result(
        await call(
            registry, make_local_ctx(NORTHWIND_STAFF), "get_building", {"building_id": HARBOR}
        )
    )
    assert out["building"]["name"] == "Harbor Warehouse"
    assert {r["room_id"] for r in out["rooms"]} == HARBOR_ROOMS


async def test_get_building_drops_leaked_rooms(
    registry: ToolRegistry, make_local_ctx: MakeCtx, local_twin: Service
) -> None:
    local_twin.control.set_faults(leak_foreign_rooms=True)
    out = result(
        await call(
            registry, make_local_ctx(NORTHWIND_STAFF), "get_building", {"building_id": HARBOR}
        )
    )
    assert {r["room_id"] for r in out["rooms"]} == HARBOR_ROOMS


async def test_get_room_and_not_found(registry: ToolRegistry, make_local_ctx: MakeCtx) -> None:
    ctx = make_local_ctx(ACME_STAFF)
    out = result(await call(registry, ctx, "get_room", {"room_id": "room-acme-tower-conf-12a"}))
    assert out["room"]["name"] == "Conference Room 12A"
    assert out["building"] == {"building_id": "bld-acme-tower", "name": "Acme Tower"}
    forbidden = await call(registry, ctx, "get_room", {"room_id": "room-harbor-dock-a"})
    unknown = await call(registry, ctx, "get_room", {"room_id": "room-nowhere"})
    assert forbidden.result_json == unknown.result_json
    assert forbidden.error == ROOM_NOT_FOUND


async def test_get_room_occupancy_matches_the_world(
    registry: ToolRegistry, make_local_ctx: MakeCtx, world: World, clock: Any
) -> None:
    rooms = sorted(HARBOR_ROOMS)
    out = result(
        await call(
            registry, make_local_ctx(NORTHWIND_STAFF), "get_room_occupancy", {"room_ids": rooms}
        )
    )
    by_id = {r["room_id"]: r for r in out["rooms"]}
    minute = epoch_minute(clock())
    for room_id in rooms:
        room = world.room(room_id)
        assert room is not None
        if world.occupancy_sensor(room_id) is None:
            assert by_id[room_id]["occupancy"] is None and "note" in by_id[room_id]
        else:
            assert by_id[room_id]["occupancy"] == world.occupancy_at(room, minute)
            assert by_id[room_id]["capacity"] == room.capacity


async def test_get_room_occupancy_mixed_and_all_failing(
    registry: ToolRegistry, make_local_ctx: MakeCtx
) -> None:
    ctx = make_local_ctx(NORTHWIND_STAFF)
    mixed = result(
        await call(
            registry,
            ctx,
            "get_room_occupancy",
            {"room_ids": ["room-harbor-dock-a", "room-acme-tower-lobby"]},
        )
    )
    assert mixed["rooms"][1] == {"room_id": "room-acme-tower-lobby", "error": ROOM_NOT_FOUND}
    failing = await call(
        registry, ctx, "get_room_occupancy", {"room_ids": ["room-acme-tower-lobby"]}
    )
    assert not failing.ok and failing.error == ROOM_NOT_FOUND


# --- sensor readings ---------------------------------------------------------------------------


async def test_latest_sensor_data(
    registry: ToolRegistry, make_local_ctx: MakeCtx, world: World, clock: Any
) -> None:
    ctx = make_local_ctx(NORTHWIND_STAFF)
    out = result(
        await call(registry, ctx, "get_latest_sensor_data", {"room_id": "room-harbor-dock-b"})
    )
    by_type = {r["sensor_type"]: r for r in out["readings"]}
    assert set(by_type) == {"occupancy", "temperature", "door_counter"}
    assert by_type["temperature"]["status"] == "offline"
    assert by_type["temperature"]["value"] is None
    assert "not reporting" in by_type["temperature"]["note"]  # said in words, not just a code
    assert "note" not in by_type["occupancy"]
    occupancy_sensor = world.sensor("sen-harbor-dock-b-occupancy")
    assert occupancy_sensor is not None
    reading = world.reading_at(occupancy_sensor, clock())
    assert reading is not None and by_type["occupancy"]["value"] == reading.value
    missing = result(
        await call(
            registry,
            ctx,
            "get_latest_sensor_data",
            {"room_id": "room-harbor-cold-store", "sensor_type": "occupancy"},
        )
    )
    assert missing["readings"] == [] and "No occupancy sensor is installed" in missing["note"]


async def test_sensor_history_is_bounded_and_downsampled(
    registry: ToolRegistry, make_local_ctx: MakeCtx, local_sensor: Service
) -> None:
    ctx = make_local_ctx(NORTHWIND_STAFF)
    out = result(
        await call(
            registry,
            ctx,
            "get_sensor_history",
            {"room_id": "room-harbor-dispatch", "sensor_type": "co2", "hours": 24},
        )
    )
    (series,) = out["series"]
    assert series["unit"] == "ppm"
    assert 0 < len(series["points"]) <= 24
    summary = series["summary"]
    assert summary["min"] <= summary["mean"] <= summary["max"]
    assert out["to"] == "2025-03-04T10:30:00Z" and out["from"] == "2025-03-03T10:30:00Z"
    history = [r for r in local_sensor.control.requests() if r.path.endswith("/history")]
    assert "interval=15m" in history[0].query
    week = await call(
        registry,
        ctx,
        "get_sensor_history",
        {"room_id": "room-harbor-dispatch", "sensor_type": "co2", "hours": 500},
    )
    assert not week.ok and "hours" in (week.error or "")


async def test_sensor_history_offline_sensor(
    registry: ToolRegistry, make_local_ctx: MakeCtx
) -> None:
    out = result(
        await call(
            registry,
            make_local_ctx(NORTHWIND_STAFF),
            "get_sensor_history",
            {"room_id": "room-harbor-dock-b", "sensor_type": "temperature", "hours": 2},
        )
    )
    assert out["series"][0]["points"] == []
    assert "offline" in out["series"][0]["note"]


# --- search_docs --------------------------------------------------------------------------------


async def test_search_docs_uses_the_callers_acl_and_top_k(
    registry: ToolRegistry, make_local_ctx: MakeCtx, retriever: FakeRetriever
) -> None:
    retriever.hits = [hit("aaaaaaaaaaaa", "Cooldown is 15 minutes."), hit("bbbbbbbbbbbb", "More.")]
    ctx = make_local_ctx(ACME_STAFF, top_k=1)
    out = result(await call(registry, ctx, "search_docs", {"query": "alert cooldown"}))
    assert [r["chunk_id"] for r in out["results"]] == ["aaaaaaaaaaaa"]
    assert "[^aaaaaaaaaaaa]" in out["cite"]
    assert retriever.calls == [
        {"query": "alert cooldown", "acl": ACME_STAFF.acl_entries, "top_k": 1}
    ]
    assert "aaaaaaaaaaaa" in ctx.seen_chunks and "bbbbbbbbbbbb" not in ctx.seen_chunks


async def test_search_docs_without_retriever_is_a_tool_error(
    registry: ToolRegistry, make_local_ctx: MakeCtx
) -> None:
    out = await call(
        registry, make_local_ctx(ACME_STAFF, retriever=None), "search_docs", {"query": "x"}
    )
    assert not out.ok and "unavailable" in (out.error or "")


# --- the registry's error mapping -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("get_room", {}, "room_id: Field required"),
        ("get_room", {"room_id": "../buildings"}, "an ID is letters"),
        ("get_room", {"room_id": "r", "extra": 1}, "extra: Extra inputs are not permitted"),
        ("get_room", "{not json", "arguments are not valid JSON"),
        ("get_room", "[1, 2]", "arguments must be a JSON object"),
        ("teleport", {}, "unknown tool 'teleport'"),
        ("get_sensor_history", {"room_id": "r", "sensor_type": "noise"}, "sensor_type"),
    ],
)
async def test_bad_calls_become_tool_errors(
    registry: ToolRegistry,
    make_local_ctx: MakeCtx,
    local_twin: Service,
    name: str,
    arguments: dict[str, Any] | str,
    expected: str,
) -> None:
    out = await call(registry, make_local_ctx(ACME_STAFF), name, arguments)
    assert not out.ok
    assert expected in (out.error or "")
    assert json.loads(out.result_json) == {"error": out.error}
    assert local_twin.paths() == []


async def test_downstream_failures_become_tool_errors(
    registry: ToolRegistry, make_local_ctx: MakeCtx, local_twin: Service
) -> None:
    ctx = make_local_ctx(ACME_STAFF)
    local_twin.control.set_faults(fail_rate=1.0)
    failed = await call(registry, ctx, "list_buildings", {})
    assert not failed.ok and "twin-service is unavailable (HTTP 500)" in (failed.error or "")
    local_twin.control.set_faults(fail_rate=0.0, garbage=True)
    garbage = await call(registry, ctx, "list_buildings", {})
    assert not garbage.ok and "unreadable" in (garbage.error or "")


@pytest.mark.allow_sockets  # a transport fault: the timeout lives in the HTTP transport
async def test_downstream_timeout_becomes_a_tool_error(
    registry: ToolRegistry, make_ctx: MakeCtx, twin: Service, settings: Any
) -> None:
    from agent.tools import Downstream

    slow = Downstream(twin_url=twin.url, sensor_url=twin.url, timeout_seconds=0.2)
    twin.control.set_faults(latency_ms=1000)
    try:
        out = await call(registry, make_ctx(ACME_STAFF, downstream=slow), "list_buildings", {})
    finally:
        await slow.aclose()
    assert not out.ok and "timed out" in (out.error or "")


async def test_anonymous_user_sees_no_buildings(
    registry: ToolRegistry, make_local_ctx: MakeCtx
) -> None:
    out = result(
        await call(registry, make_local_ctx(AuthUser.anonymous_user()), "list_buildings", {})
    )
    assert out["buildings"] == []
