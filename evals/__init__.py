"""Evaluation of the running agent service against golden datasets (see evals/README.md)."""
