"""The KubeRay manifest's serveConfigV2 stays identical to serve_config.yaml, and the config
is one Serve accepts."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_rayservice_serve_config_is_serve_config_yaml() -> None:
    manifest = yaml.safe_load((ROOT / "deploy/rayservice.yaml").read_text())
    embedded = manifest["spec"]["serveConfigV2"]
    assert embedded.strip() == (ROOT / "serve_config.yaml").read_text().strip()


def test_serve_config_validates_with_serve_schema() -> None:
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(
        yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    )
    app = config.applications[0]
    names = {d.name for d in app.deployments}
    assert names == {"Ingress", "AgentLoop", "ToolProxy", "Retriever", "Reranker"}
    for deployment in app.deployments:
        assert deployment.ray_actor_options.num_cpus < 1
        assert deployment.autoscaling_config
        assert deployment.max_ongoing_requests >= 32


def test_import_paths_old_and_new_resolve_to_the_serve_graph() -> None:
    """``serve_config.yaml`` names ``deployments.graph:build_app``; a config written before the
    renovation (``serve_app.app:build_app``) still deploys the same graph."""
    from ray._common.utils import import_attr

    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    new = import_attr(config["applications"][0]["import_path"])
    old = import_attr("serve_app.app:build_app")
    assert new is old
    assert new.__module__ == "deployments.graph"
