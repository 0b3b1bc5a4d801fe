"""Helpers for the local-LLM tests (a uniquely named module, so it never clashes with another
directory's helpers): small fake part packages installed into a temporary site folder."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from serve_app.local_llm.model_files import GGUF_MAGIC, PartedModel


def part_payloads(count: int, size: int = 1000) -> list[bytes]:
    """``count`` distinct payloads; the first starts with the GGUF magic."""
    payloads = [bytes([(i * 7 + j) % 251 for j in range(size)]) for i in range(count)]
    payloads[0] = GGUF_MAGIC + payloads[0][len(GGUF_MAGIC) :]
    return payloads


def install_fake_part(
    site: Path,
    dist_name: str,
    number: int,
    data: bytes | None,
    *,
    record: bool = True,
) -> None:
    """A minimal installed distribution: ``<module>/data/partNN.bin`` plus its dist-info
    (``data=None``: the package holds no part file)."""
    module = dist_name.replace("-", "_")
    folder = site / module / "data"
    folder.mkdir(parents=True)
    (site / module / "__init__.py").write_text("")
    files = [f"{module}/__init__.py"]
    if data is not None:
        name = f"part{number:02d}.bin"
        (folder / name).write_bytes(data)
        files.append(f"{module}/data/{name}")
    info = site / f"{module}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1.0\n", encoding="utf-8"
    )
    (info / "top_level.txt").write_text(module + "\n")
    if record:
        rows = [*files, f"{module}-0.1.0.dist-info/METADATA"]
        (info / "RECORD").write_text("".join(f"{row},,\n" for row in rows))


@dataclass
class FakeModel:
    model: PartedModel
    payloads: list[bytes]
    site: Path

    @property
    def content(self) -> bytes:
        return b"".join(self.payloads)


def fake_model(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    count: int = 3,
    *,
    install: Sequence[int] | None = None,
    size: int = 1000,
    record: bool = True,
) -> FakeModel:
    """A ``PartedModel`` of ``count`` fake part packages (uniquely named, installed in reverse
    order into a site folder put on ``sys.path``); ``install`` picks which numbers exist."""
    prefix = f"fakellm-{uuid.uuid4().hex[:8]}-part"
    payloads = part_payloads(count, size)
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    numbers = list(install) if install is not None else list(range(1, count + 1))
    for number in reversed(numbers):
        install_fake_part(site, f"{prefix}{number}", number, payloads[number - 1], record=record)
    monkeypatch.syspath_prepend(str(site))  # also invalidates importlib's caches
    model = PartedModel(
        filename="fake-model.gguf",
        packages=tuple(f"{prefix}{n}" for n in range(1, count + 1)),
        expected_size=count * size,
    )
    return FakeModel(model, payloads, site)
