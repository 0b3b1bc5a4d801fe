"""Shared pieces of the end-to-end stacks: a free port, a scoped environment for the local
Ray's workers (they inherit the driver's environment), and waiting for /readyz."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def scoped_environ(set_vars: Mapping[str, str], unset: tuple[str, ...] = ()) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in (*set_vars, *unset)}
    for key in unset:
        os.environ.pop(key, None)
    os.environ.update(set_vars)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def wait_ready(url: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
