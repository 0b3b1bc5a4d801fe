"""The HTTP API: FastAPI routes as thin shells over an ``ApiBackend``.

``create_app(backend, ...)`` builds the app; the Serve ``Ingress`` deployment returns it from
``__serve_build_asgi_app__`` with a backend holding deployment handles, and the single-process
server uses an in-process backend. No Ray import here."""
