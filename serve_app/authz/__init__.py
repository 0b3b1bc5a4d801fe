"""Authorization: Cedar policies (``policies/*.cedar``) decided by cedarpy."""

from serve_app.authz.cedar import (
    POLICY_DIR,
    AuthzConfigError,
    CedarAuthorizer,
    load_authorizer,
)

__all__ = ["POLICY_DIR", "AuthzConfigError", "CedarAuthorizer", "load_authorizer"]
