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
    real, from ``serve_config.yaml``. ``args["deployment_options"]`` (Serve ``.options()``
    keywords) applies to all five: benchmarks use it to compare settings.
    ``args["per_deployment"]`` (deployment name, e.g. ``"AgentLoop"``, -> ``.options()``
    keywords) applies to that deployment only, over ``deployment_options`` (key by key: an
    ``autoscaling_config`` given here replaces the whole one); an unknown name is a
    ``ValueError``. ``args["env"]`` (variable -> value) is added to every replica's
    environment, over the process's own, so two applications with different settings can run
    side by side in one Ray cluster."""
    options: dict[str, Any] = dict((args or {}).get("deployment_options") or {})
    per_deployment: dict[str, dict[str, Any]] = {
        str(name): dict(opts) for name, opts in ((args or {}).get("per_deployment") or {}).items()
    }
    env: dict[str, str] = {str(k): str(v) for k, v in ((args or {}).get("env") or {}).items()}
    names: list[str] = []

    def deployment(decorated: object) -> Deployment:
        d = _deployment(decorated)
        names.append(d.name)
        opts = {**options, **per_deployment.get(d.name, {})}
        if env:  # settings for this application's replicas only (e.g. two variants side by side)
            actor = dict(opts.get("ray_actor_options") or d.ray_actor_options or {})
            runtime_env = dict(actor.get("runtime_env") or {})
            runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **env}
            actor["runtime_env"] = runtime_env
            return d.options(**{**opts, "ray_actor_options": actor})
        return d.options(**opts) if opts else d

    reranker = deployment(RerankerDeployment).bind()
    retriever = deployment(RetrieverDeployment).bind(reranker)
    tool_proxy = deployment(ToolProxyDeployment).bind(retriever)
    agent_loop = deployment(AgentLoopDeployment).bind(tool_proxy)
    app = deployment(IngressDeployment).bind(agent_loop)
    unknown = sorted(set(per_deployment) - set(names))
    if unknown:
        raise ValueError(
            f"per_deployment names unknown deployment(s) {', '.join(unknown)}; "
            f"the deployments are {', '.join(names)}"
        )
    return app


def _deployment(decorated: object) -> Deployment:
    # @serve.deployment returns a Deployment; type checkers still see the class.
    return cast(Deployment, decorated)
