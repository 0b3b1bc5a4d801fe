"""Settings of the local LLM (xllamacpp behind a Ray Serve application).

``LocalLLMSettings`` is the local LLM's own frozen config. Its ``LOCAL_LLM_*`` variables are
declared once, in ``foundation.settings.LocalLLMSection`` (``settings.local_llm``): the
service builds this config from there (``from_section``), and ``from_env`` reads a mapping
(the environment by default) through those same declarations. A bad value fails with a
message that names the variable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundation.settings import (
    LocalLLMSection,
    SettingsError,
    Variable,
    settings_from_variables,
    variables,
)
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

    ``home`` is ``AGENT_SERVICE_HOME`` (the joined model lands in ``<home>/models/``); every
    other field is the ``LOCAL_LLM_*`` variable of the same name, described and range-checked
    where it is declared (``foundation.settings.LocalLLMSection``, `agent-service config`).
    Here: ``models`` is checked against the packaged models and stored lower case without a
    ``local/`` prefix, and ``threads`` defaults to the machine's cores, at most 2.
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
        # The variables' ranges are checked where they are read (LocalLLMSection); what
        # needs the catalog of packaged models is checked here.
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
    def from_section(cls, section: LocalLLMSection, *, home: Path) -> LocalLLMSettings:
        """The config from ``settings.local_llm`` and the service's home (unset values keep
        this class's defaults: ``threads`` is the machine's cores, at most 2)."""
        values = {
            name: getattr(section, name)
            for name in type(section).model_fields
            if getattr(section, name) is not None
        }
        return cls(home=home, **values)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> LocalLLMSettings:
        """Defaults, then the ``LOCAL_LLM_*`` variables and ``AGENT_SERVICE_HOME`` of ``env``
        (the environment by default; empty values count as unset), then ``overrides`` (keyword
        names are the field names; ``None`` overrides are ignored), all read through
        ``foundation.settings``' declarations."""
        env = os.environ if env is None else env
        names = _variables()
        values: dict[str, Any] = {}
        for variable in names.values():
            raw = env.get(variable.name, "")
            if isinstance(raw, str) and raw.strip():
                values[variable.name] = raw.strip()
        for name, value in overrides.items():
            if name not in names:
                raise LocalLLMConfigError(f"unknown local LLM setting {name!r}")
            if value is not None:
                values[names[name].name] = value
        try:
            settings = settings_from_variables(values)
        except SettingsError as exc:
            raise LocalLLMConfigError("; ".join(exc.problems)) from None
        return cls.from_section(settings.local_llm, home=settings.agent_service_home)

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


def _variables() -> dict[str, Variable]:
    """The config's fields that are variables (``home``: AGENT_SERVICE_HOME), by field."""
    found = {v.field: v for v in variables() if v.section == "local_llm"}
    found["home"] = next(v for v in variables() if v.name == "AGENT_SERVICE_HOME")
    return found


def _check(ok: bool, variable: str, message: str) -> None:
    if not ok:
        raise LocalLLMConfigError(f"{variable}: {message}")
