"""The composition root of the Serve application (``import_path`` of ``serve_config.yaml``).

Ingress -> AgentLoop -> ToolProxy -> Retriever -> Reranker
"""

from __future__ import annotations

from typing import Any, cast

from ray.serve import Application, Deployment

from deployments.agent_loop import AgentLoopDeployment
from deployments.ingress import IngressDeployment
from deployments.reranker import RerankerDeployment
from deployments.retriever import RetrieverDeployment
from deployments.tool_proxy import ToolProxyDeployment


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Bind the five deployments. Serve options come from the deployments' defaults and, for
    real, from ``serve_config.yaml``; ``args`` is accepted for ``serve run`` builders."""
    reranker = _deployment(RerankerDeployment).bind()
    retriever = _deployment(RetrieverDeployment).bind(reranker)
    tool_proxy = _deployment(ToolProxyDeployment).bind(retriever)
    agent_loop = _deployment(AgentLoopDeployment).bind(tool_proxy)
    return _deployment(IngressDeployment).bind(agent_loop)


def _deployment(decorated: object) -> Deployment:
    # @serve.deployment returns a Deployment; type checkers still see the class.
    return cast(Deployment, decorated)
