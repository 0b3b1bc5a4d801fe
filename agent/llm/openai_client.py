"""``OpenAICompatibleClient``: the ``LLMClient`` port on the ``openai`` SDK.

Works against any OpenAI-compatible ``/chat/completions`` endpoint (OpenRouter, OpenAI, a
llama.cpp server, the scripted test server). Retries with backoff on 429/5xx/connection errors
are the SDK's own (``max_retries``; it honours ``retry-after``/``retry-after-ms``); what is left
afterwards is mapped onto the port's typed errors:

* connection failures, timeouts, 408/409/429/5xx -> ``ProviderUnavailable``
* other HTTP errors (401, 403, 404, 400, ...)    -> ``ProviderRejected``
* an unparseable body or stream, a bad JSON step -> ``MalformedReply``

Error messages are built from the provider's error text, scrubbed of the API key (and of
anything shaped like a bearer token), and raised ``from None`` so no SDK exception carrying
request details hangs off them.

The tool-calling mode (``tool_calling_mode``) is a :class:`~agent.llm.modes.ModeAdapter`
the client owns; this module is the transport both share:

* ``native`` (:mod:`agent.llm.native_mode`): OpenAI ``tools``/``tool_calls``.
* ``json_schema`` (:mod:`agent.llm.json_schema_mode`): no ``tools`` sent; a
  ``response_format`` JSON schema constrains each reply to one step.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any, NoReturn
from urllib.parse import urlparse

import openai
from openai import AsyncOpenAI
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from agent.llm import json_schema_mode
from agent.llm.base import (
    QUEUE_PRIORITY_HEADER,
    ChatRequest,
    ChatResult,
    LLMError,
    MalformedReply,
    ProviderRejected,
    ProviderUnavailable,
    StreamEvent,
    Usage,
)
from agent.llm.json_schema_mode import JsonSchemaMode
from agent.llm.modes import ModeAdapter, ReplyMeta, ToolCallingMode
from agent.llm.native_mode import NativeMode, native_tool, native_wire_messages

__all__ = [
    "API_KEY_VARIABLES",
    "LOCAL_PLACEHOLDER_KEY",
    "OpenAICompatibleClient",
    "ToolCallingMode",
    "mode_adapter",
    "native_tool",
    "native_wire_messages",
]

LOCAL_PLACEHOLDER_KEY = "local-no-key"
API_KEY_VARIABLES = ("OPENROUTER_API_KEY", "LLM_API_KEY", "DEEPSEEK_API_KEY", "GOOGLE_API_KEY")
_MAX_ERROR_CHARS = 300
_TOKEN_SHAPES = re.compile(
    r"(?i)(bearer\s+)\S+|\b(sk|pk|rk)-[A-Za-z0-9_\-]{6,}[A-Za-z0-9_\-*.]*|\bAIza[0-9A-Za-z_\-]{20,}"
)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's transport errors: raised raw (not wrapped by the SDK) when a stream
    breaks after its headers arrived. The SDK has used both ``httpx`` and ``httpx2``."""
    errors: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        error = getattr(module, "TransportError", None)
        if isinstance(error, type) and issubclass(error, BaseException):
            errors.append(error)
    return tuple(errors)


_TRANSPORT_ERRORS = _transport_errors()


def _redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    text = _TOKEN_SHAPES.sub(lambda m: (m.group(1) or "") + "***", text)
    text = " ".join(text.split())
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS - 1] + "…"
    return text


def _provider_message(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    return exc.message


def mode_adapter(
    mode: ToolCallingMode,
    *,
    json_schema_strict: bool = False,
    tool_result_note: str | None = json_schema_mode.DEFAULT_TOOL_RESULT_NOTE,
) -> ModeAdapter:
    """The adapter for a ``tool_calling_mode`` name (the json_schema options are its own)."""
    if mode == "native":
        return NativeMode()
    if mode == "json_schema":
        return JsonSchemaMode(strict=json_schema_strict, tool_result_note=tool_result_note)
    raise ValueError(f"unknown tool_calling_mode {mode!r}")


class OpenAICompatibleClient:
    """``LLMClient`` over an OpenAI-compatible endpoint (see the module docstring)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        default_model: str,
        tool_calling_mode: ToolCallingMode = "native",
        timeout_seconds: float = 60.0,
        max_retries: int = 3,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        json_schema_strict: bool = False,
        tool_result_note: str | None = json_schema_mode.DEFAULT_TOOL_RESULT_NOTE,
        stream_usage: bool = True,
        request_provider_cost: bool | None = None,
    ) -> None:
        """``json_schema_strict`` sets ``strict`` in the response_format (llama.cpp ignores
        it; OpenAI's strict mode rejects a root ``oneOf``, hence off by default).
        ``tool_result_note`` ends each json_schema-mode tool-results message (None: nothing).
        ``request_provider_cost`` asks for OpenRouter's usage accounting (``usage.cost``);
        None: only when the base URL is openrouter.ai (other providers reject the field)."""
        self._mode = mode_adapter(
            tool_calling_mode,
            json_schema_strict=json_schema_strict,
            tool_result_note=tool_result_note,
        )
        self._base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._default_model = default_model
        self._max_output_tokens = max_output_tokens
        self._temperature = temperature
        self._stream_usage = stream_usage
        host = urlparse(self._base_url).hostname or ""
        self._provider_cost = (
            host == "openrouter.ai" or host.endswith(".openrouter.ai")
            if request_provider_cost is None
            else request_provider_cost
        )
        self._sdk = AsyncOpenAI(
            base_url=self._base_url,
            api_key=api_key,
            timeout=timeout_seconds,
            max_retries=max_retries,
        )

    # --- LLMClient ---------------------------------------------------------------------------

    @property
    def default_model(self) -> str:
        return self._default_model

    @property
    def tool_calling_mode(self) -> ToolCallingMode:
        return self._mode.name

    @property
    def base_url(self) -> str:
        return self._base_url

    async def chat(self, request: ChatRequest) -> ChatResult:
        kwargs = self._request_kwargs(request, stream=False)
        try:
            completion = await self._sdk.chat.completions.create(**kwargs)
        except Exception as exc:
            self._raise_mapped(exc)
        if not completion.choices:
            raise MalformedReply("the provider returned no choices")
        choice = completion.choices[0]
        meta = ReplyMeta(
            model=completion.model or kwargs["model"],
            usage=self._usage(completion.usage),
            finish_reason=choice.finish_reason,
        )
        return self._mode.parse_reply(choice.message, request, meta)

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        kwargs = self._request_kwargs(request, stream=True)
        try:
            response = await self._sdk.chat.completions.create(**kwargs)
        except Exception as exc:
            self._raise_mapped(exc)
        meta = ReplyMeta(model=kwargs["model"])
        events = self._mode.stream_events(self._deltas(response, meta), request, meta)
        try:
            async with aclosing(events):
                async for event in events:
                    yield event
        except LLMError:
            raise
        except Exception as exc:
            self._raise_mapped(exc)
        finally:
            await response.close()

    async def aclose(self) -> None:
        await self._sdk.close()

    # --- helpers -----------------------------------------------------------------------------

    def _request_kwargs(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": request.model or self._default_model,
            "messages": self._mode.wire_messages(request.messages),
            **self._mode.request_fields(request),
        }
        max_tokens = request.max_output_tokens or self._max_output_tokens
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        temperature = request.temperature if request.temperature is not None else self._temperature
        if temperature is not None:
            kwargs["temperature"] = temperature
        if stream:
            kwargs["stream"] = True
            if self._stream_usage:
                kwargs["stream_options"] = {"include_usage": True}
        if request.queue_priority is not None:
            kwargs["extra_headers"] = {QUEUE_PRIORITY_HEADER: f"{request.queue_priority:.6f}"}
        extra: dict[str, Any] = {}
        if self._provider_cost:
            extra["usage"] = {"include": True}
        extra.update(request.extra)
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    @staticmethod
    def _usage(raw: Any) -> Usage:
        if raw is None:
            return Usage()
        cost: Any = getattr(raw, "cost", None)
        if cost is None:
            cost = (getattr(raw, "model_extra", None) or {}).get("cost")
        provider_cost: float | None = None
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            provider_cost = float(cost)
        elif isinstance(cost, str):
            try:
                provider_cost = float(cost)
            except ValueError:
                provider_cost = None
        return Usage(
            input_tokens=int(getattr(raw, "prompt_tokens", 0) or 0),
            output_tokens=int(getattr(raw, "completion_tokens", 0) or 0),
            provider_cost_usd=provider_cost,
        )

    async def _deltas(self, response: Any, meta: ReplyMeta) -> AsyncIterator[ChoiceDelta]:
        """The first choice's deltas of an SDK stream; ``meta`` follows the chunks' model,
        usage and finish reason."""
        async for chunk in response:
            if chunk.model:
                meta.model = chunk.model
            if chunk.usage is not None:
                meta.usage = self._usage(chunk.usage)
            for choice in chunk.choices[:1]:
                meta.finish_reason = choice.finish_reason or meta.finish_reason
                yield choice.delta

    def _raise_mapped(self, exc: Exception) -> NoReturn:
        """Map an SDK/transport exception onto the port's typed errors (key scrubbed)."""
        secrets = [self._api_key]
        if isinstance(exc, LLMError):
            raise exc
        if isinstance(exc, openai.APITimeoutError):
            raise ProviderUnavailable("the model provider timed out") from None
        if isinstance(exc, openai.APIConnectionError):
            raise ProviderUnavailable("the connection to the model provider failed") from None
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = _redact(_provider_message(exc), secrets)
            if status in (408, 409, 429) or status >= 500:
                raise ProviderUnavailable(
                    f"the model provider is unavailable (HTTP {status}): {detail}",
                    status_code=status,
                ) from None
            raise ProviderRejected(
                f"the model provider rejected the request (HTTP {status}): {detail}",
                status_code=status,
            ) from None
        if isinstance(exc, openai.APIResponseValidationError):
            raise MalformedReply(
                "the model provider's reply did not match the expected shape",
                status_code=exc.status_code,
            ) from None
        if isinstance(exc, openai.APIError):  # e.g. an error event inside a stream
            detail = _redact(_provider_message(exc), secrets)
            raise ProviderUnavailable(f"the model provider failed mid-reply: {detail}") from None
        if isinstance(exc, _TRANSPORT_ERRORS):
            raise ProviderUnavailable(
                f"the connection to the model provider failed ({type(exc).__name__})"
            ) from None
        if isinstance(exc, ValueError):  # JSONDecodeError: a truncated body or SSE event
            raise MalformedReply("the model provider sent an unparseable reply") from None
        raise exc
