// The API as the page uses it: same origin, same auth as any client. The page holds no
// secret: in production the mesh adds x-gateway-claims; with the development sign-in the
// server set an HttpOnly cookie, or (REQUIRE_AUTH=false only) gave us a claims value to send.
import { createParser } from "../vendor/eventsource-parser/index.js";

const CLAIMS_KEY = "agent-service.dev-claims";

export class ApiError extends Error {
  constructor(status, code, message, body) {
    super(message);
    this.status = status;
    this.code = code;
    this.body = body;
  }
}

export function apiBase() {
  // The page lives at {prefix}/ui/: the API is {prefix}.
  const path = window.location.pathname;
  return path.slice(0, path.lastIndexOf("/ui/"));
}

export function setDevClaims(value) {
  if (value) sessionStorage.setItem(CLAIMS_KEY, value);
  else sessionStorage.removeItem(CLAIMS_KEY);
}

function headers(extra = {}) {
  const out = { accept: "application/json", ...extra };
  const claims = sessionStorage.getItem(CLAIMS_KEY);
  if (claims) out["x-gateway-claims"] = claims;
  return out;
}

async function errorFrom(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  const error = body && body.error ? body.error : {};
  const message = error.message || `HTTP ${response.status}`;
  return new ApiError(response.status, error.code || "http_error", message, body);
}

export async function call(method, path, body) {
  const init = { method, headers: headers(), credentials: "same-origin" };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["content-type"] = "application/json";
  }
  const response = await fetch(apiBase() + path, init);
  if (!response.ok) throw await errorFrom(response);
  if (response.status === 204) return null;
  return response.json();
}

// POST /ask with stream=true, parsed by eventsource-parser. `onEvent(name, data)` per event;
// resolves when the stream ends; rejects with ApiError before the stream (4xx/5xx) or with
// the AbortError when `signal` aborts (which closes the connection: the server then cancels
// the model call and the tools).
export async function streamAsk(body, onEvent, signal) {
  const response = await fetch(apiBase() + "/ask", {
    method: "POST",
    headers: headers({ "content-type": "application/json", accept: "text/event-stream" }),
    credentials: "same-origin",
    body: JSON.stringify({ ...body, stream: true }),
    signal,
  });
  if (!response.ok) throw await errorFrom(response);
  const parser = createParser({
    onEvent(event) {
      let data = null;
      try {
        data = JSON.parse(event.data);
      } catch {
        return; // not JSON: not ours to show
      }
      onEvent(event.event || "message", data);
    },
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.feed(value);
    }
  } finally {
    reader.releaseLock();
  }
}
