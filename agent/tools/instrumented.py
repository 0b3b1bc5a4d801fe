"""The ``tool.<name>`` span around one tool call, opened where the tool runs (possibly in
another process) as the current span, so the spans the tool opens (retrieval's) are its
children; its parent is whatever context the caller attached (the loop's hop)."""

from __future__ import annotations

from opentelemetry.util.types import AttributeValue

from agent.llm.base import ToolCall
from agent.tools.base import ToolContext
from agent.tools.registry import ToolOutcome, ToolRegistry
from foundation.observability import attributes as attr
from foundation.observability.spans import Observer, tracer

__all__ = ["traced_dispatch"]


async def traced_dispatch(registry: ToolRegistry, call: ToolCall, ctx: ToolContext) -> ToolOutcome:
    """``registry.dispatch`` inside the call's ``tool.<name>`` span (``tool.unknown`` for a name
    that is not a tool: the name is model text, so it is not put in a span name)."""
    observer = Observer(payloads=ctx.observe_payloads)
    known = call.name in registry
    span_attributes: dict[str, AttributeValue] = {
        attr.GEN_AI_OPERATION: "execute_tool",
        attr.GEN_AI_TOOL_TYPE: "function",
        attr.GEN_AI_TOOL_CALL_ID: call.id,
    }
    if known:
        span_attributes[attr.GEN_AI_TOOL_NAME] = call.name
    with tracer().start_as_current_span(
        f"tool.{call.name if known else 'unknown'}",
        attributes={attr.LANGFUSE_TYPE: "tool", **span_attributes},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        observer.payload(span, attr.GEN_AI_TOOL_ARGUMENTS, call.arguments)
        observer.payload(span, attr.LANGFUSE_INPUT, call.arguments)
        outcome, failure = await registry.run(call, ctx)
        span.set_attribute(attr.TOOL_OK, outcome.ok)
        if failure is not None:
            kind, exc = failure
            span.set_attribute(attr.TOOL_ERROR_KIND, kind)
            observer.fail(span, kind, message=outcome.error, exception=exc)
        observer.payload(span, attr.GEN_AI_TOOL_RESULT, outcome.result_json)
        observer.payload(span, attr.LANGFUSE_OUTPUT, outcome.result_json)
        return outcome
