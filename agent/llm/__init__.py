"""The ``LLMClient`` port and its OpenAI-compatible adapter."""
