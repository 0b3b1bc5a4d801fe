"""Helpers for the agent tests (a uniquely named module, so it never clashes with another
test directory's helpers): users, a fake retriever, and scripts written once for both
tool-calling modes (for the HTTP scripted server: ``script_steps``; for the in-process
``agent.testing.ScriptedModel``: ``script_replies``/``scripted``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.llm.base import ChatResult, LLMError, ToolCall, Usage
from agent.prompts import IDK_MARKER
from agent.testing import ScriptedModel, text_reply, tool_call, tool_calls_reply
from foundation.identity import AuthUser
from local_world._service import ServiceControl
from local_world.claims import encode_claims, encode_flat_claims
from retrieval.search import SearchHit


class Service:
    """A running simulator: its base URL and its control (faults, request log)."""

    def __init__(self, url: str, control: ServiceControl) -> None:
        self.url = url
        self.control = control

    def paths(self) -> list[str]:
        return self.control.paths()


PINNED = "2025-03-04T10:30:00Z"  # a Tuesday, mid-morning (UTC)
Mode = Literal["native", "json_schema"]
MODES: tuple[Mode, ...] = ("native", "json_schema")


def mesh_user(sub: str, *memberships: tuple[str, str]) -> AuthUser:
    """A user as the mesh sends it (claims-gateway shape in x-gateway-claims)."""
    return AuthUser.from_claims_header(encode_claims(sub, memberships))


def eval_user(sub: str, roles: Sequence[str], domains: Sequence[str]) -> AuthUser:
    """A user from the eval HS256 token path: flat claims, no header to forward."""
    return AuthUser.from_claims({"sub": sub, "roles": list(roles), "domains": list(domains)})


NORTHWIND_STAFF = mesh_user("nina", ("northwind", "business_staff"))
ACME_STAFF = mesh_user("alice", ("acme", "business_staff"))
ADMIN = mesh_user("root", ("acme", "admin"))
NORTHWIND_ADMIN = mesh_user("nora", ("northwind", "business_admin"))
CUSTOMER = mesh_user("carl", ("civic", "standard_customer"))
FLAT_HEADER = encode_flat_claims("eve", ["business_staff"], ["acme"])


def hit(chunk_id: str, text: str, source: str = "user/occupancy-alerts.md") -> SearchHit:
    return SearchHit(
        chunk_id=chunk_id,
        source=source,
        title="Occupancy alerts",
        section="Occupancy alerts > Cooldown",
        kind="text",
        text=text,
        fused_score=0.03,
        rerank_score=None,
        vector_rank=1,
        keyword_rank=1,
    )


@dataclass
class FakeRetriever:
    """Stands in for HybridRetriever: fixed hits, and a record of every call."""

    hits: list[SearchHit] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def search(
        self, query: str, *, acl: Sequence[str], top_k: int | None = None
    ) -> list[SearchHit]:
        self.calls.append({"query": query, "acl": list(acl), "top_k": top_k})
        return self.hits[: top_k or len(self.hits)]


# --- scripts for both modes ------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)


@dataclass(frozen=True)
class Calls:
    """Several tool calls in one reply (native); one step per call in json_schema mode."""

    calls: tuple[Call, ...]


@dataclass(frozen=True)
class Say:
    text: str


@dataclass(frozen=True)
class Decline:
    """Native: the model's refusal sentence; json_schema: the decline branch."""

    text: str = "I can only help with CrowdVision: buildings, rooms, occupancy and sensors."


@dataclass(frozen=True)
class Idk:
    pass


Step = Call | Calls | Say | Decline | Idk | dict[str, Any]


def _json_step(step: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"json": step, **extra}


def script_steps(mode: Mode, *steps: Step, chunk_chars: int = 12) -> list[dict[str, Any]]:
    """Scripted-server steps for ``mode`` (a raw dict passes through unchanged)."""
    out: list[dict[str, Any]] = []
    for step in steps:
        if isinstance(step, dict):
            out.append(step)
        elif isinstance(step, Call | Calls):
            calls = step.calls if isinstance(step, Calls) else (step,)
            if mode == "native":
                out.append(
                    {"tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls]}
                )
            else:
                for c in calls:
                    arguments = (
                        json.loads(c.arguments) if isinstance(c.arguments, str) else c.arguments
                    )
                    out.append(
                        _json_step({"reason": "need data", "tool": c.name, "arguments": arguments})
                    )
        elif isinstance(step, Say):
            if mode == "native":
                out.append({"text": step.text, "chunk_chars": chunk_chars})
            else:
                out.append(
                    _json_step(
                        {"reason": "answer", "final_answer": step.text}, chunk_chars=chunk_chars
                    )
                )
        elif isinstance(step, Decline):
            if mode == "native":
                out.append({"text": step.text})
            else:
                out.append(_json_step({"reason": "off-topic", "decline": True}))
        elif isinstance(step, Idk):
            if mode == "native":
                out.append({"text": IDK_MARKER})
            else:
                out.append(_json_step({"reason": "nothing found", "idk": True}))
    return out


# --- the same scripts for the in-process fake (agent.testing) ----------------------------------

Reply = ChatResult | LLMError
FakeStep = Call | Calls | Say | Decline | Idk | Reply


def _fake_call(call: Call) -> ToolCall:
    return tool_call(call.name, call.arguments)


def script_replies(mode: Mode, *steps: FakeStep) -> list[Reply]:
    """``ScriptedModel`` replies for ``mode``: what the HTTP adapter would have returned for
    ``script_steps(mode, ...)`` (json_schema: one call per step, a decline is a refusal).
    A ``ChatResult`` or an ``LLMError`` passes through unchanged."""
    out: list[Reply] = []
    for step in steps:
        if isinstance(step, ChatResult | LLMError):
            out.append(step)
        elif isinstance(step, Call | Calls):
            calls = tuple(
                _fake_call(c) for c in (step.calls if isinstance(step, Calls) else (step,))
            )
            if mode == "native":
                out.append(tool_calls_reply(*calls))
            else:
                out.extend(tool_calls_reply(c) for c in calls)
        elif isinstance(step, Say):
            out.append(text_reply(step.text))
        elif isinstance(step, Decline):
            if mode == "native":
                out.append(text_reply(step.text))
            else:
                out.append(ChatResult("refusal", None, (), Usage(), "", "stop", reason="off-topic"))
        else:
            out.append(text_reply(IDK_MARKER))
    return out


def scripted(mode: Mode, *steps: FakeStep, chunk_chars: int | None = None) -> ScriptedModel:
    """A ``ScriptedModel`` in ``mode`` playing ``steps`` (the same defaults as the HTTP
    server's: model ``local/scripted``)."""
    return ScriptedModel(
        *script_replies(mode, *steps),
        model="local/scripted",
        tool_calling_mode=mode,
        chunk_chars=chunk_chars,
    )
