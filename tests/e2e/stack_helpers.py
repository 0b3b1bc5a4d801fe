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


@contextmanager
def ray_cluster(num_cpus: int = 4, object_store_mb: int = 150) -> Iterator[str]:
    """A Ray head node of its own (``ray start --head --block``) on free ports, dashboard and
    Jobs API included; yields its GCS address. Stopping it stops only this cluster. (An
    in-process ``ray.init`` always puts the dashboard agent on port 52365, which another
    process on the machine may hold: then the Jobs API has no agent.)"""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    gcs, dashboard, agent = free_port(), free_port(), free_port()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    proc = subprocess.Popen(
        [
            ray_bin,
            "start",
            "--head",
            "--block",
            f"--port={gcs}",
            f"--num-cpus={num_cpus}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--dashboard-agent-listen-port={agent}",
            f"--object-store-memory={object_store_mb * 1024 * 1024}",
            "--disable-usage-stats",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # A throwaway cluster on 127.0.0.1 for one test module; the driver here runs with
        # token auth off (this process imported Ray before any RAY_AUTH_MODE could apply).
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{dashboard}/", timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError("`ray start --head` exited")
            time.sleep(0.5)
        yield f"127.0.0.1:{gcs}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        # As `ray stop` would: forget this cluster, so a later `ray.init()` does not try it.
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip().endswith(f":{gcs}"):
            current.unlink()
