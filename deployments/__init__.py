"""Ray Serve deployments: thin shells, each holding one core object.

    Ingress (FastAPI) -> AgentLoop -> ToolProxy -> Retriever -> Reranker

Each is composed in ``deployments.graph.build_app``; its Serve options (replicas, autoscaling,
CPUs, concurrency) are defaults here and set for real in ``serve_config.yaml``."""
