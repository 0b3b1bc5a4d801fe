"""Per-user and per-domain request rate limits and token/cost budgets (``usage_limits.core``: the
window arithmetic and the decision; ``usage_limits.store``: the ``UsageStore`` port and its
PostgreSQL adapter; ``usage_limits.memory``: an in-memory store for tests)."""
