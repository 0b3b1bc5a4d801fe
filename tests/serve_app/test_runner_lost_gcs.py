"""``agent-service serve``/``stop`` after the Ray head's GCS died (issue 19, item 5): a GCS
port nothing listens on is "not running" at once, without ``ray status`` (which retries
for ~45 s against a dead GCS before it gives up)."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from serve_app import runner


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_gcs_port_nothing_listens_on_is_not_running_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_ray_status(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("`ray status` was run for a port nothing listens on")

    monkeypatch.setattr(runner.subprocess, "run", no_ray_status)
    started = time.monotonic()
    assert runner.ray_running(f"127.0.0.1:{_closed_port()}") is False
    assert time.monotonic() - started < 5


def test_a_listening_port_or_another_address_form_asks_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[list[str]] = []

    class Done:
        returncode = 0

    def ray_status(cmd: list[str], **kwargs: Any) -> Done:
        asked.append(cmd)
        return Done()

    monkeypatch.setattr(runner.subprocess, "run", ray_status)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert runner.ray_running(f"127.0.0.1:{port}") is True
    assert runner.ray_running("auto") is True
    assert [cmd[-1] for cmd in asked] == [f"--address=127.0.0.1:{port}", "--address=auto"]
