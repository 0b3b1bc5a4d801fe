"""A small documentation tree and dataset writer for the labelled-retrieval tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

PAGES = {
    "user/a.md": """\
        ---
        title: Page A
        ---
        # Page A

        Intro text.

        ## Alpha

        alpha text

        ### Steps

        steps of alpha

        ## Beta

        beta text

        ### Steps

        steps of beta

        ## Empty
        """,
    "developer/b.md": "# Page B\n\n## Gamma\n\ngamma text\n",
    "user/secret.md": "---\npermissions: [role:admin]\n---\n# Secret\n\n## Keys\n\nrotate\n",
}
HEAD = """\
version: 1
docs: documentation
callers:
  std: {roles: [standard_customer], domains: [acme]}
  staff: {roles: [business_staff], domains: [acme]}
  admin: {roles: [admin], domains: [ops]}
rows:
"""


def make_repo(root: Path) -> Path:
    """``root`` as a repository whose default DOC_ROOTS folders hold PAGES."""
    for key, text in PAGES.items():
        path = root / "documentation" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def write_rows(repo: Path, rows: str) -> Path:
    """A dataset of HEAD and ``rows`` (YAML list items, dedented) in ``repo``."""
    path = repo / "evals/datasets/labels.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEAD + textwrap.indent(textwrap.dedent(rows), "  "), encoding="utf-8")
    return path
