"""The chat page (``{API_PREFIX}/ui/``): static ES modules and CSS in ``static/``, served by
the Ingress itself (``serve_app.api.routes.ui``), calling the same API with the same auth.

No build step: ``static/`` holds the page's own modules and, under ``static/vendor/``, the
third-party ones copied byte for byte from npm (exact versions in ``npm/package.json`` and
``npm/package-lock.json``, licences beside each file, ``make ui-vendor`` re-copies them). The
page never fetches anything from another origin (its Content-Security-Policy forbids it).
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"

# Strict: only this origin's scripts, styles, images and fetches; no inline script or style,
# no eval, no plugins, no framing; forms post only here.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
}
