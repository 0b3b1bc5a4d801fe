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

Two tool-calling modes (``tool_calling_mode``):

* ``native``: OpenAI ``tools``/``tool_calls``. Streaming yields ``TextDelta`` for content and
  ``ToolCallDelta`` for each tool-call fragment; ``Completed`` carries the reassembled calls.
* ``json_schema``: no ``tools`` sent; a ``response_format`` JSON schema (see
  :mod:`agent.llm.json_schema_mode`) constrains each reply to one step. Streaming
  yields the ``final_answer`` string's characters as ``TextDelta`` while they arrive (an
  incremental JSON string extractor); a tool step yields one ``ToolCallDelta`` at the end.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn
from urllib.parse import urlparse

import openai
from openai import AsyncOpenAI

from agent.llm import json_schema_mode
from agent.llm.base import (
    ChatRequest,
    ChatResult,
    Completed,
    LLMError,
    MalformedReply,
    Message,
    ProviderRejected,
    ProviderUnavailable,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)

ToolCallingMode = Literal["native", "json_schema"]

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


@dataclass
class _ToolCallBuffer:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


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
        if tool_calling_mode not in ("native", "json_schema"):
            raise ValueError(f"unknown tool_calling_mode {tool_calling_mode!r}")
        self._base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._default_model = default_model
        self._mode: ToolCallingMode = tool_calling_mode
        self._max_output_tokens = max_output_tokens
        self._temperature = temperature
        self._strict = json_schema_strict
        self._tool_result_note = tool_result_note
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
        return self._mode

    @property
    def base_url(self) -> str:
        return self._base_url

    async def chat(self, request: ChatRequest) -> ChatResult:
        kwargs = self._request_kwargs(request, stream=False)
        model = kwargs["model"]
        try:
            completion = await self._sdk.chat.completions.create(**kwargs)
        except Exception as exc:
            self._raise_mapped(exc)
        if not completion.choices:
            raise MalformedReply("the provider returned no choices")
        choice = completion.choices[0]
        message = choice.message
        usage = self._usage(completion.usage)
        answered_by = completion.model or model
        if self._mode == "json_schema":
            return json_schema_mode.parse_step(
                message.content,
                request.tools,
                usage=usage,
                model=answered_by,
                finish_reason=choice.finish_reason,
                call_number=json_schema_mode.prior_tool_calls(request.messages) + 1,
            )
        calls: list[ToolCall] = []
        first = json_schema_mode.prior_tool_calls(request.messages) + 1
        for index, call in enumerate(message.tool_calls or ()):
            function = getattr(call, "function", None)
            if function is None:  # a custom (non-function) tool call: not ours
                continue
            calls.append(
                ToolCall(
                    id=call.id or f"call_{first + index}",
                    name=function.name,
                    arguments=function.arguments or "",
                )
            )
        return self._native_result(
            message.content,
            getattr(message, "refusal", None),
            tuple(calls),
            usage,
            answered_by,
            choice.finish_reason,
        )

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        kwargs = self._request_kwargs(request, stream=True)
        model: str = kwargs["model"]
        try:
            response = await self._sdk.chat.completions.create(**kwargs)
        except Exception as exc:
            self._raise_mapped(exc)
        content: list[str] = []
        refusal: list[str] = []
        buffers: dict[int, _ToolCallBuffer] = {}  # by call slot, in order of appearance
        slots: dict[int, int] = {}  # the provider's tool-call index -> its current slot
        finish_reason: str | None = None
        usage = Usage()
        extractor = json_schema_mode.FinalAnswerExtractor() if self._mode == "json_schema" else None
        streamed: list[str] = []  # json_schema mode: the answer text already yielded
        try:
            async for chunk in response:
                if chunk.model:
                    model = chunk.model
                if chunk.usage is not None:
                    usage = self._usage(chunk.usage)
                for choice in chunk.choices[:1]:
                    delta = choice.delta
                    finish_reason = choice.finish_reason or finish_reason
                    if delta.content:
                        content.append(delta.content)
                        if extractor is None:
                            yield TextDelta(delta.content)
                        else:
                            text = extractor.feed(delta.content)
                            if text:
                                streamed.append(text)
                                yield TextDelta(text)
                    if getattr(delta, "refusal", None):
                        refusal.append(str(delta.refusal))
                    for tool_delta in delta.tool_calls or ():
                        # Some OpenAI-compatible providers send parallel calls under one
                        # index; a new id at a used index starts a new call.
                        slot = slots.get(tool_delta.index)
                        if slot is None or (
                            tool_delta.id and buffers[slot].id and tool_delta.id != buffers[slot].id
                        ):
                            slot = slots[tool_delta.index] = len(buffers)
                            buffers[slot] = _ToolCallBuffer()
                        buffer = buffers[slot]
                        name = tool_delta.function.name if tool_delta.function else None
                        arguments = (
                            (tool_delta.function.arguments or "") if tool_delta.function else ""
                        )
                        if tool_delta.id:
                            buffer.id = tool_delta.id
                        if name:
                            buffer.name += name
                        if arguments:
                            buffer.arguments.append(arguments)
                        if extractor is None:
                            yield ToolCallDelta(
                                index=slot,
                                id=tool_delta.id or None,
                                name=name or None,
                                arguments=arguments,
                            )
        except LLMError:
            raise
        except Exception as exc:
            self._raise_mapped(exc)
        finally:
            await response.close()

        text = "".join(content)
        if self._mode == "json_schema":
            result = json_schema_mode.parse_step(
                text,
                request.tools,
                usage=usage,
                model=model,
                finish_reason=finish_reason,
                call_number=json_schema_mode.prior_tool_calls(request.messages) + 1,
            )
            for index, call in enumerate(result.tool_calls):
                yield ToolCallDelta(
                    index=index, id=call.id, name=call.name, arguments=call.arguments
                )
            answered = "".join(streamed)
            if result.text and result.text.startswith(answered):
                # The citation markers made from "sources" come after the streamed answer.
                suffix = result.text[len(answered) :]
                if suffix:
                    yield TextDelta(suffix)
            yield Completed(result)
            return
        first = json_schema_mode.prior_tool_calls(request.messages) + 1
        calls = tuple(
            ToolCall(
                id=buffers[i].id or f"call_{first + n}",
                name=buffers[i].name,
                arguments="".join(buffers[i].arguments),
            )
            for n, i in enumerate(sorted(buffers))
        )
        yield Completed(
            self._native_result(
                text if content else None,
                "".join(refusal) or None,
                calls,
                usage,
                model,
                finish_reason,
            )
        )

    async def aclose(self) -> None:
        await self._sdk.close()

    # --- helpers -----------------------------------------------------------------------------

    def _request_kwargs(self, request: ChatRequest, *, stream: bool) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": request.model or self._default_model}
        if self._mode == "json_schema":
            kwargs["messages"] = json_schema_mode.to_wire_messages(
                request.messages, tool_result_note=self._tool_result_note
            )
            kwargs["response_format"] = json_schema_mode.response_format(
                request.tools, strict=self._strict
            )
        else:
            kwargs["messages"] = native_wire_messages(request.messages)
            if request.tools:
                kwargs["tools"] = [native_tool(tool) for tool in request.tools]
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

    @staticmethod
    def _native_result(
        content: str | None,
        refusal: str | None,
        calls: tuple[ToolCall, ...],
        usage: Usage,
        model: str,
        finish_reason: str | None,
    ) -> ChatResult:
        if calls:
            return ChatResult("tool_calls", content or None, calls, usage, model, finish_reason)
        if refusal and not content:
            # OpenAI's safety refusal: the service answers it like an out-of-scope question.
            return ChatResult("decline", None, (), usage, model, finish_reason, reason=refusal)
        return ChatResult("text", content or "", (), usage, model, finish_reason)

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


def native_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters or {"type": "object", "properties": {}},
        },
    }


def native_wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Port messages -> OpenAI chat messages (``tool`` results keep their ``tool_call_id``)."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            if not message.tool_call_id:
                raise ValueError("a tool message needs the tool_call_id it answers")
            wire.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id,
                    "content": message.content or "",
                }
            )
        elif message.role == "assistant" and message.tool_calls:
            wire.append(
                {
                    "role": "assistant",
                    "content": message.content or None,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments or "{}"},
                        }
                        for call in message.tool_calls
                    ],
                }
            )
        else:
            wire.append({"role": message.role, "content": message.content or ""})
    return wire
