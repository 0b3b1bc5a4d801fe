"""Alembic migrations for the knowledge base (run them with `agent-service db up`)."""
