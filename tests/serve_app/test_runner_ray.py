"""``agent-service stop`` stops the Ray head that ``serve`` started and nothing else: not a
test suite's cluster, not a colleague's (``ray stop`` would stop them all)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from foundation.settings import Settings
from serve_app.runner import (
    RunState,
    _bin,
    _free_port,
    load_state,
    ray_env,
    ray_processes,
    ray_running,
    ray_temp_dir,
    save_state,
    start_ray,
    stop,
    stop_ray_node,
)

SLEEPER = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"  # noqa: E501


def _spawn_node(temp_dir: Path) -> subprocess.Popen[bytes]:
    """A stand-in for a Ray daemon: its own process group, the temp dir in its arguments,
    and a child (as the raylet has workers)."""
    return subprocess.Popen(
        [sys.executable, "-c", SLEEPER, f"--temp-dir={temp_dir}"], start_new_session=True
    )


def _wait_children(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        children = parent.children(recursive=True)
        if children:
            return children
        time.sleep(0.05)
    raise AssertionError("the stand-in never started its child")


def test_stop_ray_node_stops_one_node_and_its_descendants_only(tmp_path: Path) -> None:
    ours = _spawn_node(tmp_path / "ours")
    other = _spawn_node(tmp_path / "other")
    try:
        our_child = _wait_children(ours)[0]
        other_child = _wait_children(other)[0]
        found = {p.pid for p in ray_processes(str(tmp_path / "ours"))}
        assert found == {ours.pid, our_child.pid}
        assert stop_ray_node(str(tmp_path / "ours"), grace_s=5) == 2
        ours.wait(timeout=10)
        assert not our_child.is_running() or our_child.status() == psutil.STATUS_ZOMBIE
        assert other.poll() is None and other_child.is_running()
        assert os.getpid() not in {p.pid for p in ray_processes(str(tmp_path))}
    finally:
        for proc in (ours, other):
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        stop_ray_node(str(tmp_path))


def test_a_state_file_from_an_older_version_still_loads(
    settings_factory: Callable[..., Settings],
) -> None:
    settings = settings_factory()
    path = settings.home / "run" / "services.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"started_ray": true, "simulator_pid": null, "gone_field": 1}')
    state = load_state(settings)
    assert state.started_ray and state.ray_address == "" and state.ray_temp_dir == ""


@pytest.fixture
def foreign_cluster(tmp_path: Path) -> Iterator[str]:
    """Someone else's Ray head on this machine, started the usual way."""
    temp_dir = Path("/tmp") / f"foreign-ray-{os.getpid()}"
    port = _free_port()
    proc = subprocess.run(
        [
            _bin("ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
            f"--temp-dir={temp_dir}", "--num-cpus=1", "--include-dashboard=false",
            f"--ray-client-server-port={_free_port()}", "--disable-usage-stats",
        ],
        capture_output=True, text=True, env=ray_env(), timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        # SIGKILL after 1 s: a throwaway head needs no graceful stop (10 s by default)
        stop_ray_node(str(temp_dir), grace_s=1)


@pytest.mark.slow
def test_serve_starts_its_own_head_and_stop_leaves_other_clusters_running(
    foreign_cluster: str,
    settings_factory: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    settings = settings_factory(ray_num_cpus=1, ray_dashboard_port=_free_port())
    state = RunState()
    try:
        start_ray(settings, state)
        # Not adopted: a cluster of our own, in our own temp dir, on loopback.
        assert state.started_ray and state.ray_address != foreign_cluster
        assert state.ray_temp_dir == str(ray_temp_dir(settings))
        assert ray_running(state.ray_address)
        assert ray_processes(state.ray_temp_dir)
        save_state(settings, state)

        done = stop(settings)

        assert any("Ray head stopped" in line for line in done), done
        assert not ray_processes(state.ray_temp_dir)
        assert ray_running(foreign_cluster)  # the other cluster still answers
        assert load_state(settings) == RunState()
    finally:
        if state.ray_temp_dir:
            stop_ray_node(state.ray_temp_dir)
