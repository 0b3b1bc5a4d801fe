"""The ingestion job's config: what it takes of the service's settings (``IngestConfig``),
built by ``serve_app.wiring.ingest_config``. Picklable: the Ray pipeline's process gets it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from retrieval.embedders import EmbedderConfig

DeferIndex = Literal["auto", "always", "never"]


@dataclass(frozen=True)
class IngestConfig:
    """The embedder, the chunk budget, when to run on Ray (and which Ray) and the vector
    index's treatment: the EMBEDDING_*, CHUNK_MAX_TOKENS, INGEST_* and RAY_ADDRESS settings.
    What one run reads and how many actors it uses are its ``IngestOptions``."""

    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    chunk_max_tokens: int = 200  # CHUNK_MAX_TOKENS, kept under the embedder's window
    ray_min_chunks: int = 20_000  # INGEST_RAY_MIN_CHUNKS: ``auto`` goes to Ray from here
    defer_vector_index: DeferIndex = "auto"  # INGEST_DEFER_VECTOR_INDEX
    cpus: int = 2  # INGEST_CPUS: logical CPUs of a private Ray
    object_store_mb: int = 200  # INGEST_OBJECT_STORE_MB: a private Ray's object store
    ray_address: str | None = None  # RAY_ADDRESS: a running cluster, always used
