"""The local world as data: ``local_world/worlds/sample.yaml`` is exactly the estate that was
built in code (ids, names, capacities, sensors, installation dates, and every value at the
same instants), the same world reads from JSON, and a bad file is refused with the file and
the field named."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_world.sensor_service import device_json
from local_world.twin_service import building_json, room_json
from local_world.world import DEFAULT_SEED, World, build_world, load_world
from local_world.world_file import (
    SAMPLE_WORLD_FILE,
    WORLDS_DIR,
    WorldFileError,
    load_world_file,
    parse_world,
)

# sha256 of ``_fingerprint`` for seeds 42 and 7, computed from the estate as local_world/world.py
# built it in code before it became data (commit 6c0c1d8): the file must serve that world.
BUILT_IN_CODE = "62f5ce9d2b11e855c35278955a3a54f8e70b657bc633ec679c6ccc9250dad093"


def _fingerprint(make: Any) -> str:
    out: dict[str, Any] = {}
    for seed in (42, 7):
        w: World = make(seed)
        snapshot: dict[str, Any] = {
            "domains": [[d.id, d.name] for d in w.domains],
            "buildings": [building_json(w, b) for b in w.buildings],
            "rooms": [room_json(r) for r in w.rooms],
            "devices": [device_json(s) | {"online": s.online, "unit": s.unit} for s in w.sensors],
        }
        t0 = datetime(2025, 3, 1, 0, 0, tzinfo=UTC)  # a Saturday: weekend and weekdays
        values = []
        for minute in range(0, 9 * 24 * 60, 97):  # every 97 minutes over 9 days
            when = t0 + timedelta(minutes=minute)
            readings = [w.reading_at(s, when) for s in w.sensors]
            values.append([None if r is None else r.value for r in readings])
        snapshot["values"] = values
        start, end = t0 + timedelta(days=3), t0 + timedelta(days=3, hours=6)
        snapshot["history"] = [
            [(p.timestamp.isoformat(), p.value) for p in w.history(s, start, end, 900)]
            for s in w.sensors
        ]
        out[str(seed)] = snapshot
    text = json.dumps(out, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_sample_file_is_the_world_that_was_built_in_code() -> None:
    assert _fingerprint(build_world) == BUILT_IN_CODE
    assert build_world().seed == DEFAULT_SEED == load_world_file().seed
    assert build_world().name == "sample"


def test_the_same_world_reads_from_json(tmp_path: Path) -> None:
    data = yaml.safe_load(SAMPLE_WORLD_FILE.read_text(encoding="utf-8"))
    as_json = tmp_path / "sample.json"
    as_json.write_text(json.dumps(data, default=str), encoding="utf-8")
    assert _fingerprint(lambda seed: load_world(as_json, seed)) == BUILT_IN_CODE


def test_build_world_takes_a_path_and_a_seed() -> None:
    second = WORLDS_DIR / "second.yaml"
    world = build_world(path=second)
    assert world.name == "second" and world.seed == load_world_file(second).seed
    assert build_world(3, path=second).seed == 3
    assert [r.id for r in build_world(3, path=second).rooms] == [r.id for r in world.rooms]


def test_every_shipped_world_loads() -> None:
    shipped = sorted(WORLDS_DIR.glob("*.yaml"))
    assert {p.name for p in shipped} >= {"sample.yaml", "second.yaml"}
    for path in shipped:
        world = load_world(path)
        assert world.buildings and world.rooms and world.sensors, path


# --- bad files ------------------------------------------------------------------------------------


def _sample() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(SAMPLE_WORLD_FILE.read_text(encoding="utf-8"))
    return data


def _first_room(data: dict[str, Any]) -> dict[str, Any]:
    room: dict[str, Any] = data["domains"][0]["buildings"][0]["rooms"][0]
    return room


def _refused(tmp_path: Path, data: Any, name: str = "bad.yaml") -> WorldFileError:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    with pytest.raises(WorldFileError) as caught:
        load_world(path)
    assert str(path) in str(caught.value)  # the file is named
    return caught.value


def test_a_bad_field_is_named_with_the_ids_on_its_way(tmp_path: Path) -> None:
    data = _sample()
    _first_room(data)["capacity"] = 0
    error = _refused(tmp_path, data)
    assert error.problems == [
        "domains[0] (northwind).buildings[0] (bld-northwind-harbor).rooms[0] "
        "(room-harbor-dock-a).capacity: Input should be greater than 0"
    ]


def test_a_missing_field_and_an_unknown_one(tmp_path: Path) -> None:
    data = _sample()
    del data["domains"][1]["buildings"][0]["address"]
    _first_room(data)["capacty"] = 40
    problems = "\n".join(_refused(tmp_path, data).problems)
    assert "domains[1] (acme).buildings[0] (bld-acme-tower).address: Field required" in problems
    assert "rooms[0] (room-harbor-dock-a).capacty: Extra inputs are not permitted" in problems


def test_an_unquoted_numeric_id_is_refused_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "numeric.yaml"
    text = SAMPLE_WORLD_FILE.read_text(encoding="utf-8")
    path.write_text(text.replace("id: room-harbor-dock-a", "id: 4711"), encoding="utf-8")
    with pytest.raises(WorldFileError) as caught:
        load_world(path)
    [problem] = caught.value.problems
    assert problem.startswith("domains[0] (northwind).buildings[0] (bld-northwind-harbor)")
    assert "rooms[0] (4711).id: Input should be a valid string" in problem
    assert "quote it" in problem


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: _first_room(d).update(type="ballroom"),
            "room 'room-harbor-dock-a': type 'ballroom' has no profile",
        ),
        (
            lambda d: _first_room(d)["sensors"].append({"id": "s-x", "type": "radon"}),
            "sensor 's-x' has type 'radon', which sensor_types does not declare",
        ),
        (
            lambda d: _first_room(d)["sensors"].append(
                {"id": "sen-harbor-dock-a-co2", "type": "co2"}
            ),
            "sensor ids must be unique; repeated: ['sen-harbor-dock-a-co2']",
        ),
        (
            lambda d: _first_room(d).update(floor=2),
            "room 'room-harbor-dock-a' is on floor 2, but the building has 2 floors",
        ),
        (
            lambda d: d["sensor_types"]["co2"].update(base=400),
            "sensor_types.co2: base: only a 'level' model takes parameters",
        ),
        (
            lambda d: d["profiles"]["office"].update(anchors=[[0, 0], [12, 1.5], [24, 0]]),
            "profiles.office.anchors: anchor levels must be between 0 and 1",
        ),
        (
            lambda d: d["users"][0].update(roles=["superuser"]),
            "users[0] (nina).roles: unknown role(s) ['superuser']",
        ),
    ],
)
def test_inconsistent_worlds_are_refused(tmp_path: Path, change: Any, expected: str) -> None:
    data = _sample()
    change(data)
    assert expected in "\n".join(_refused(tmp_path, data).problems)


def test_files_that_are_not_worlds(tmp_path: Path) -> None:
    with pytest.raises(WorldFileError, match=r"missing\.yaml: not a valid local world"):
        load_world(tmp_path / "missing.yaml")
    with pytest.raises(WorldFileError, match=r"a world file ends in \.yaml, \.yml, \.json"):
        load_world(tmp_path / "world.toml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(WorldFileError, match="not YAML"):
        load_world(broken)
    broken_json = tmp_path / "broken.json"
    broken_json.write_text("{", encoding="utf-8")
    with pytest.raises(WorldFileError, match="line 1: not JSON"):
        load_world(broken_json)
    listed = tmp_path / "list.yaml"
    listed.write_text("- just\n- a list\n", encoding="utf-8")
    with pytest.raises(WorldFileError, match="must be a mapping"):
        load_world(listed)
    with pytest.raises(WorldFileError, match=r"<data>:.*\n  name: Field required"):
        parse_world({k: v for k, v in _sample().items() if k != "name"})


def test_an_edited_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "world.yaml"
    data = _sample()
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    assert load_world(path).room("room-harbor-dock-a").capacity == 40  # type: ignore[union-attr]
    _first_room(data)["capacity"] = 41
    _first_room(data)["name"] = "Loading Dock A (extended)"  # another size, another mtime
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    assert load_world(path).room("room-harbor-dock-a").capacity == 41  # type: ignore[union-attr]
