"""The end-to-end modules' shared Ray head with Serve (``stack_helpers.serve_cluster``):
started by the first module that deploys on it, stopped when the session ends. The node
failure module, which stops nodes and kills the GCS, runs a cluster of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.stack_helpers import SharedServe, serve_cluster


@pytest.fixture(scope="session")
def shared_serve() -> Iterator[SharedServe]:
    with serve_cluster() as shared:
        yield shared
