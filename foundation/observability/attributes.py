"""Span attribute keys: OpenTelemetry GenAI semantic conventions plus Langfuse's own.

One place for every key, so a typo cannot split one attribute into two in a backend. The
GenAI keys follow the (development-status) conventions; the ``langfuse.*`` keys are what
Langfuse's OTLP endpoint maps onto its observation model.
"""

from __future__ import annotations

from urllib.parse import urlparse

# --- GenAI semantic conventions ---
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_COST = "gen_ai.usage.cost"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # payload
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"  # payload
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"  # payload
GEN_AI_TOOL_RESULT = "gen_ai.tool.call.result"  # payload
GEN_AI_EMBEDDING_DIM = "gen_ai.embeddings.dimension.count"
GEN_AI_RETRIEVAL_QUERY = "gen_ai.retrieval.query.text"  # payload
GEN_AI_RETRIEVAL_DOCUMENTS = "gen_ai.retrieval.documents"  # payload
GEN_AI_RETRIEVAL_TOP_K = "gen_ai.retrieval.top_k"
GEN_AI_RETRIEVAL_COUNT = "gen_ai.retrieval.documents.count"

# --- Langfuse ---
LANGFUSE_TYPE = "langfuse.observation.type"
LANGFUSE_INPUT = "langfuse.observation.input"  # payload
LANGFUSE_OUTPUT = "langfuse.observation.output"  # payload
LANGFUSE_COST_DETAILS = "langfuse.observation.cost_details"
LANGFUSE_MODEL = "langfuse.observation.model.name"
LANGFUSE_LEVEL = "langfuse.observation.level"
LANGFUSE_STATUS_MESSAGE = "langfuse.observation.status_message"
LANGFUSE_TRACE_NAME = "langfuse.trace.name"
LANGFUSE_TRACE_INPUT = "langfuse.trace.input"  # payload
LANGFUSE_TRACE_OUTPUT = "langfuse.trace.output"  # payload

# --- the request (on every span, from baggage) ---
USER_ID = "user.id"
SESSION_ID = "session.id"

# --- ours ---
AGENT_DECISION = "agent.decision"
AGENT_IDK = "agent.idk"
AGENT_HOP = "agent.hop"
AGENT_HOPS = "agent.hops"
AGENT_TOOL_CALLS = "agent.tool_calls"
AGENT_CITATIONS = "agent.citations"
AGENT_HALLUCINATED = "agent.hallucinated_citations"
AGENT_UNGROUNDED = "agent.ungrounded_claims"
AGENT_CANCELLED = "agent.cancelled"
AGENT_STREAMING = "agent.streaming"
AGENT_TOOL_CALLING_MODE = "agent.tool_calling_mode"
AGENT_TOOLS_OFFERED = "agent.tools_offered"
# A follow-up's standalone query (agent.small_model.followups): rewriter, rule, whether it changed
AGENT_QUERY_REWRITER = "agent.query.rewriter"
AGENT_QUERY_REWRITE_RULE = "agent.query.rewrite_rule"
AGENT_QUERY_REWRITTEN = "agent.query.rewritten"
AGENT_QUERY_STANDALONE = "agent.query.standalone"  # payload
GEN_AI_ERROR_STATUS = "gen_ai.response.http_status"
GEN_AI_REPLY_KIND = "gen_ai.response.kind"
TOOL_OK = "tool.ok"
TOOL_ERROR_KIND = "tool.error.kind"
RETRIEVE_SHARED_ROUND_TRIP = "retrieve.shared_round_trip"
RETRIEVE_RERANKER = "retrieve.reranker"
RETRIEVE_CANDIDATES = "retrieve.candidates"

AGENT_NAME = "crowdvision-assistant"

# Attributes whose values are request content; never set unless OBSERVE_PAYLOADS=true.
PAYLOAD_KEYS = frozenset(
    {
        GEN_AI_INPUT_MESSAGES,
        GEN_AI_OUTPUT_MESSAGES,
        GEN_AI_TOOL_ARGUMENTS,
        GEN_AI_TOOL_RESULT,
        GEN_AI_RETRIEVAL_QUERY,
        GEN_AI_RETRIEVAL_DOCUMENTS,
        LANGFUSE_INPUT,
        LANGFUSE_OUTPUT,
        LANGFUSE_TRACE_INPUT,
        LANGFUSE_TRACE_OUTPUT,
        AGENT_QUERY_STANDALONE,
    }
)

_PROVIDERS = (
    ("openrouter.ai", "openrouter"),
    ("api.openai.com", "openai"),
    ("openai.azure.com", "azure.ai.openai"),
    ("deepseek.com", "deepseek"),
    ("googleapis.com", "gcp.gemini"),
    ("anthropic.com", "anthropic"),
    ("mistral.ai", "mistral_ai"),
    ("groq.com", "groq"),
)


def provider_name(base_url: str) -> str:
    """``gen_ai.provider.name`` for an OpenAI-compatible base URL (its host otherwise;
    ``local`` for a loopback server such as the embedded model)."""
    host = (urlparse(base_url).hostname or "").lower()
    for suffix, name in _PROVIDERS:
        if host == suffix or host.endswith("." + suffix):
            return name
    if host in {"127.0.0.1", "localhost", "::1"} or host.startswith("127."):
        return "local"
    return host or "unknown"
