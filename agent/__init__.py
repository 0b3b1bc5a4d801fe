"""The agent core: plain async Python, no Ray and no FastAPI imports (ports and adapters)."""
