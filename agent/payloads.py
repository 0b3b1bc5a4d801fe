"""Plain-data views of prompts and replies for payload attributes (OBSERVE_PAYLOADS=true),
in the GenAI conventions' message shape: ``{"role", "parts": [...]}``."""

from __future__ import annotations

from typing import Any

from agent.llm.base import ChatResult, Message


def message_payload(message: Message) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if message.content:
        if message.role == "tool":
            parts.append(
                {
                    "type": "tool_call_response",
                    "id": message.tool_call_id,
                    "response": message.content,
                }
            )
        else:
            parts.append({"type": "text", "content": message.content})
    for call in message.tool_calls or ():
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    return {"role": message.role, "parts": parts}


def reply_payload(result: ChatResult) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if result.text:
        parts.append({"type": "text", "content": result.text})
    for call in result.tool_calls:
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    return {
        "role": "assistant",
        "parts": parts,
        "finish_reason": result.finish_reason or result.kind,
    }
