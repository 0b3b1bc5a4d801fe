"""The Reranker deployment with a real ``CrossEncoder``: concurrent searches share one batched
cross-encoder call (``@serve.batch``), and each gets exactly the scores it would get alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from retrieval.embedders import resolve_local_model
from retrieval.rerankers import CrossEncoderReranker

QUERIES = [
    "How long is the alert cooldown?",
    "Which sensors measure carbon dioxide?",
    "What does error CV-E1033 mean?",
    "How do I rotate an API key?",
    "Where is the occupancy of a room shown?",
    "What is the default ingestion executor?",
]
PASSAGES = [
    "The alert cooldown is 15 minutes by default.",
    "CO2 sensors report carbon dioxide in ppm every minute.",
    "CV-E1033 means the sensor gateway lost its uplink.",
    "Rotate API keys from the admin console under Security.",
    "Each room page shows its live occupancy and capacity.",
    "Small corpora are embedded in-process; large ones on Ray Data.",
    "Utilisation is the live count divided by the capacity.",
]


def small_cross_encoder(folder: Path) -> Path:
    """A real ``CrossEncoder`` folder built offline: the packaged MiniLM's encoder with a
    one-label head, seeded (untrained: the batching, not the ranking, is under test)."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(16)
    model = CrossEncoder(resolve_local_model("all-MiniLM-L6-v2"), num_labels=1, device="cpu")
    model.save(str(folder))
    return folder


@pytest.mark.slow
@pytest.mark.integration
def test_concurrent_searches_share_a_batch_and_score_as_if_alone(
    tmp_path: Path, shared_serve: Any
) -> None:
    from ray import serve

    from deployments.reranker import RerankerDeployment

    folder = small_cross_encoder(tmp_path / "cross-encoder")
    alone = CrossEncoderReranker(str(folder))
    expected = [alone.score(q, PASSAGES) for q in QUERIES]
    assert len({round(s, 4) for row in expected for s in row}) > len(PASSAGES)  # a real model

    env = {"RERANKER": "cross-encoder", "RERANKER_MODEL": str(folder), "HF_HUB_OFFLINE": "1"}
    shared_serve.connect()  # the session's Ray head with Serve (tests/conftest.py)
    try:
        app = RerankerDeployment.options(
            ray_actor_options={"num_cpus": 0.25, "runtime_env": {"env_vars": env}},
            autoscaling_config=None,
            num_replicas=1,
        ).bind()
        handle: Any = serve.run(app, name="reranker-test", route_prefix=None)
        assert handle.name.remote().result(timeout_s=120) == str(folder)

        async def all_at_once() -> list[list[float]]:
            calls = [handle.score.remote(q, PASSAGES) for q in QUERIES]
            return list(await asyncio.gather(*calls))

        got = asyncio.run(all_at_once())
        sizes: list[int] = handle.batch_sizes.remote().result(timeout_s=30)
    finally:
        shared_serve.delete("reranker-test")
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, abs=1e-5)
    assert sum(sizes) == len(QUERIES) and max(sizes) > 1, sizes  # batched, nothing lost
