"""A small synthetic documentation tree for ingestion tests, and a cheap embedder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from local_world.scripted_llm import embed_text


class HashedEmbedder:
    """The ``Embedder`` port over the scripted model server's deterministic hashed bag of
    words (``embed_text``: words + trigrams, L2-normalised), in-process: for tests where the
    store, not the vectors, is under test. Over HTTP the scripted server's ``/v1/embeddings``
    returns the same vectors."""

    name = "hashed-bow-384"
    dim = 384
    max_tokens = 8191

    def count_tokens(self, text: str) -> int:
        return max(1, (len(text) + 3) // 4)

    def encode(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
        rows = [embed_text(t, self.dim) for t in texts]
        return np.asarray(rows, dtype=np.float32).reshape(len(rows), self.dim)

    async def aencode(self, texts: Sequence[str]) -> np.ndarray[Any, np.dtype[np.float32]]:
        return self.encode(texts)


PAGES: dict[str, str] = {
    "public/overview.md": """---
title: Overview
---
# Overview

CrowdVision counts people in rooms. The live count refreshes every few seconds.

## Capacity

Each room has a capacity. Utilisation is the live count divided by capacity.
""",
    "public/sensors.markdown": """# Sensors

## Types

| type | measures |
|------|----------|
| co2 | carbon dioxide in ppm |
| occupancy | people |

```bash
curl https://api.example/sensors/buildings/bld-1
```
""",
    "public/tour.qd": """# Quick tour

Open the dashboard, pick a building, and read the heat map of utilisation per floor.
""",
    "acme/acme-rules.md": """---
title: Acme rules
permissions: [domain:acme]
---
# Acme capacity rules

The Acme tower lobby uses the zebrafish evacuation code ZX-7781 during drills.
""",
    "restricted/admin-runbook.md": """---
title: Admin runbook
permissions: [role:admin]
---
# Admin runbook

Rotate the gateway signing keys with the quasar rotation procedure every 45 days.
""",
    "restricted/staff-notes.md": """---
title: Staff notes
permissions: [role:business_staff]
---
# Staff notes

Staff reset a stuck door counter with the marmalade recalibration button.
""",
    "restricted/domain-named-admin.md": """---
title: Domain called admin
permissions: [domain:admin]
---
# The admin tenant

The tenant literally named admin keeps its pelican parking roster here.
""",
}


def write_corpus(root: Path, pages: dict[str, str] | None = None) -> Path:
    for rel, text in (pages or PAGES).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root
