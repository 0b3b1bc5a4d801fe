"""What every route of one server shares: its state, bearer auth, the request log, reply ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from local_world._service import redact_headers
from local_world.scripted_llm.state import ScriptedLLM
from local_world.scripted_llm.wire import openai_error


@dataclass
class ServerContext:
    state: ScriptedLLM
    # Reply ids count per server (app), from 1.
    _last_id: int = 0

    def next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def check_auth(self, request: Request) -> JSONResponse | None:
        """None when the request carries an accepted bearer token, else OpenAI's 401."""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return openai_error(
                401,
                "Missing bearer authentication in header",
                code="missing_api_key",
                headers={"x-should-retry": "false"},
            )
        if self.state.api_key is not None and token.strip() != self.state.api_key:
            return openai_error(
                401,
                "Incorrect API key provided",
                code="invalid_api_key",
                headers={"x-should-retry": "false"},
            )
        return None

    def record(
        self,
        endpoint: str,
        request: Request,
        body: Any,
        status: int,
        *,
        key: str | None = None,
        step_index: int | None = None,
        unscripted: bool = False,
        error: str | None = None,
    ) -> None:
        self.state._record(
            endpoint=endpoint,
            body=body,
            headers=redact_headers(request.headers),
            key=key,
            step_index=step_index,
            status=status,
            unscripted=unscripted,
            error=error,
        )
