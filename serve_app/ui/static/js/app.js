// The chat page: ask (streamed over POST /ask's SSE contract), the live tool trace,
// citations opening their snippet, decisions as states, usage and cost, stop; threads,
// feedback, the model override and the admin ingestion panel where the caller may use them.
import { ApiError, call, setDevClaims, streamAsk } from "./api.js";
import { renderAnswer, trimPartialMarker } from "./markdown.js";

const $ = (id) => document.getElementById(id);

const state = {
  session: null, // GET /ui/session
  conversationId: null,
  controller: null, // the running ask's AbortController
  returnFocus: null, // where focus goes when the source pane closes
};

const DECISIONS = {
  answered: null,
  idk: {
    label: "I don't know",
    text: "The documentation and live data this account can see do not hold the answer.",
  },
  declined_out_of_scope: {
    label: "Out of scope",
    text: "This assistant answers questions about CrowdVision: buildings, rooms, occupancy, sensors and the product's documentation.",
  },
  tool_loop_exhausted: {
    label: "Tool limit reached",
    text: "The assistant used every tool call it may make for one question before finishing an answer. Try a narrower question.",
  },
  provider_error: {
    label: "Model provider error",
    text: "The model provider failed to answer.",
  },
};

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

function formatArgs(args) {
  const text = JSON.stringify(args ?? {});
  return text.length > 160 ? text.slice(0, 157) + "…" : text;
}

function usd(value) {
  if (value === 0) return "$0";
  return value < 0.0001 ? `$${value.toExponential(1)}` : `$${value.toFixed(4)}`;
}

// Who wrote the answer (`answered_by`): the model, named, or the service; nothing when the
// server does not say (a turn stored before it was recorded).
const AUTHORS = {
  model: {
    text: (answer) => `Written by ${answer.model || "the model"}`,
    title: "The model wrote this answer; the service checked its figures and citations.",
  },
  service: {
    text: () => "Written by the service",
    title: "The service wrote this answer itself, from its own tool results or in place of the model's reply.",
  },
};

function formatUsage(answer) {
  const usage = answer.usage || {};
  const cost = answer.cost || {};
  const parts = [`${usage.input_tokens ?? 0} in / ${usage.output_tokens ?? 0} out tokens`];
  if (cost.provider_usd !== null && cost.provider_usd !== undefined) {
    parts.push(usd(cost.provider_usd));
  } else if (cost.estimated_usd !== null && cost.estimated_usd !== undefined) {
    parts.push(`≈ ${usd(cost.estimated_usd)} (estimated)`);
  } else {
    parts.push("cost unknown");
  }
  if (answer.model) parts.push(answer.model);
  return parts.join(" · ");
}

// --- one turn on the page ------------------------------------------------------------------

class TurnView {
  constructor(question) {
    this.text = "";
    this.citations = [];
    this.order = [];
    this.pending = false;
    this.status = el("p", { class: "progress muted", role: "status" });
    this.trace = el("ol", { class: "trace", "aria-label": "Tools run" });
    this.answer = el("div", {
      class: "answer",
      "aria-live": "polite",
      "aria-busy": "true",
      "aria-atomic": "false",
    });
    this.author = el("p", { class: "author muted" });
    this.decision = el("div", { class: "decision", hidden: true });
    this.sources = el("ol", { class: "footnotes", "aria-label": "Sources" });
    this.meta = el("p", { class: "usage muted" });
    this.feedback = el("div", { class: "feedback" });
    this.node = el(
      "li",
      { class: "turn", "data-state": "streaming" },
      el("div", { class: "question" }, el("span", { class: "visually-hidden", text: "You asked: " }), question),
      this.status,
      this.trace,
      this.answer,
      this.author,
      this.decision,
      this.sources,
      this.meta,
      this.feedback,
    );
  }

  setStatus(text) {
    this.status.textContent = text;
  }

  toolStarted(name, args) {
    const row = el(
      "li",
      { class: "tool running", "data-tool": name },
      el("span", { class: "tool-name", text: name }),
      el("code", { class: "tool-args", text: formatArgs(args) }),
      el("span", { class: "tool-result", text: "running…" }),
    );
    this.trace.append(row);
  }

  toolFinished(call) {
    let row = [...this.trace.querySelectorAll("li.tool.running")].find(
      (li) => li.dataset.tool === call.name,
    );
    if (!row) {
      this.toolStarted(call.name, call.arguments);
      row = this.trace.lastElementChild;
    }
    row.classList.remove("running");
    row.classList.add(call.ok ? "ok" : "failed");
    row.querySelector(".tool-args").textContent = formatArgs(call.arguments);
    const outcome = call.ok ? "ok" : `error: ${call.error ?? "failed"}`;
    row.querySelector(".tool-result").textContent = `${outcome} · ${Math.round(call.duration_ms)} ms`;
  }

  showTrace(calls) {
    this.trace.replaceChildren();
    for (const c of calls || []) {
      this.toolStarted(c.name, c.arguments);
      this.toolFinished(c);
    }
  }

  addToken(text) {
    this.text += text;
    if (!this.pending) {
      this.pending = true;
      requestAnimationFrame(() => {
        this.pending = false;
        this.render(trimPartialMarker(this.text));
      });
    }
  }

  render(text) {
    const { html, order } = renderAnswer(text, this.citations);
    this.answer.innerHTML = html; // sanitised by DOMPurify (markdown.js)
    this.order = order;
    for (const link of this.answer.querySelectorAll('a[href^="#cite:"]')) {
      const id = decodeURIComponent(link.getAttribute("href").slice("#cite:".length));
      link.classList.add("cite");
      link.setAttribute("aria-label", `source ${link.textContent}`);
      link.addEventListener("click", (event) => {
        event.preventDefault();
        openSource(this.citations.find((c) => c.chunk_id === id), link);
      });
      const sup = el("sup");
      link.replaceWith(sup);
      sup.append(link);
    }
  }

  renderFootnotes() {
    this.sources.replaceChildren();
    this.order.forEach((id, i) => {
      const citation = this.citations.find((c) => c.chunk_id === id);
      const file = citation.source.split("/").pop() || citation.source;
      const label = [file, citation.section].filter(Boolean).join(" › ");
      const button = el("button", {
        type: "button",
        class: "linkish",
        text: `[${i + 1}] ${label}`,
        onclick: (event) => openSource(citation, event.currentTarget),
      });
      this.sources.append(el("li", {}, button));
    });
  }

  // The authoritative end: `done` (or a provider_error answer).
  finish(answer) {
    this.citations = answer.citations || [];
    this.text = answer.answer || "";
    this.render(this.text);
    this.renderFootnotes();
    if (answer.tool_calls && answer.tool_calls.length !== this.trace.children.length) {
      this.showTrace(answer.tool_calls);
    }
    this.setDecision(answer.decision, answer.error ? answer.error.message : null);
    this.setAuthor(answer);
    this.meta.textContent = formatUsage(answer);
    this.end(answer.decision === "provider_error" ? "error" : "done");
    this.node.dataset.decision = answer.decision;
    this.setStatus("");
  }

  setAuthor(answer) {
    const author = Object.hasOwn(AUTHORS, answer.answered_by ?? "") ? AUTHORS[answer.answered_by] : null;
    this.author.textContent = author ? author.text(answer) : "";
    if (author) {
      this.author.title = author.title;
      this.node.dataset.answeredBy = answer.answered_by;
    }
  }

  setDecision(decision, detail) {
    const info = DECISIONS[decision];
    if (!info) return;
    this.decision.hidden = false;
    this.decision.className = `decision decision-${decision}`;
    this.decision.replaceChildren(
      el("strong", { text: info.label }),
      el("span", { text: ` ${detail ? `${info.text} ${detail}` : info.text}` }),
    );
  }

  fail(code, message) {
    this.decision.hidden = false;
    this.decision.className = "decision decision-error";
    this.decision.replaceChildren(
      el("strong", { text: code === "timeout" ? "Timed out" : "Error" }),
      el("span", { text: ` ${message}` }),
    );
    this.node.dataset.errorCode = code;
    this.end("error");
  }

  stopped() {
    this.render(trimPartialMarker(this.text));
    this.decision.hidden = false;
    this.decision.className = "decision decision-stopped";
    this.decision.replaceChildren(el("strong", { text: "Stopped" }), el("span", { text: " You stopped this answer; nothing was stored." }));
    this.end("stopped");
  }

  end(stateName) {
    this.node.dataset.state = stateName;
    this.answer.setAttribute("aria-busy", "false");
    this.setStatus("");
  }

  enableFeedback(conversationId, turn) {
    if (!conversationId || !turn) return;
    this.feedback.replaceChildren(feedbackControls(conversationId, turn));
  }
}

// --- feedback ------------------------------------------------------------------------------

function feedbackControls(conversationId, turn) {
  let rating = null;
  const note = el("span", { class: "muted", role: "status" });
  const comment = el("textarea", {
    rows: 2,
    maxlength: 2000,
    class: "feedback-comment",
    "aria-label": "Comment on this answer (optional)",
    placeholder: "What was good or wrong? (optional)",
  });
  const send = el("button", { type: "button", text: "Send feedback" });
  const extra = el("div", { class: "feedback-extra", hidden: true }, comment, send);
  const up = el("button", { type: "button", class: "thumb", "aria-pressed": "false", text: "Helpful" });
  const down = el("button", { type: "button", class: "thumb", "aria-pressed": "false", text: "Not helpful" });
  const choose = (value) => {
    rating = value;
    up.setAttribute("aria-pressed", String(value === "up"));
    down.setAttribute("aria-pressed", String(value === "down"));
    extra.hidden = false;
    comment.focus();
  };
  up.addEventListener("click", () => choose("up"));
  down.addEventListener("click", () => choose("down"));
  send.addEventListener("click", async () => {
    if (!rating) return;
    send.disabled = true;
    try {
      const body = { conversation_id: conversationId, turn, rating };
      if (comment.value.trim()) body.comment = comment.value.trim();
      const receipt = await call("POST", "/feedback", body);
      note.textContent = receipt && receipt.replaced ? "Feedback updated." : "Thanks: feedback recorded.";
    } catch (error) {
      note.textContent = `Feedback not sent: ${error.message}`;
    } finally {
      send.disabled = false;
    }
  });
  return el("div", { class: "feedback-row" }, el("span", { class: "muted", text: "Was this helpful?" }), up, down, extra, note);
}

// --- the source pane -----------------------------------------------------------------------

function openSource(citation, opener) {
  if (!citation) return;
  state.returnFocus = opener;
  $("source-title").textContent = citation.section || citation.source;
  $("source-meta").textContent = `${citation.source} · chunk ${citation.chunk_id}`;
  $("source-snippet").textContent = citation.snippet; // text, never markup
  const pane = $("source-pane");
  pane.hidden = false;
  pane.focus();
}

function closeSource() {
  $("source-pane").hidden = true;
  if (state.returnFocus) state.returnFocus.focus();
  state.returnFocus = null;
}

// --- asking --------------------------------------------------------------------------------

function progressText(data) {
  switch (data.stage) {
    case "started":
      return `Answering with ${data.model ?? "the model"}…`;
    case "route":
      return `Route: ${data.route}`;
    case "model":
      return `Calling the model (step ${data.hop ?? 1})…`;
    case "waiting":
      return `Waiting for the model (${Math.round(data.elapsed_s ?? 0)} s)…`;
    case "tool_started":
      return `Running ${data.tool}…`;
    default:
      return null;
  }
}

function setBusy(busy) {
  $("ask-button").disabled = busy;
  $("stop-button").disabled = !busy;
}

async function ask(question) {
  const view = new TurnView(question);
  $("turns").append(view.node);
  view.node.scrollIntoView({ block: "end" });
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  const body = { question };
  if (state.conversationId) body.conversation_id = state.conversationId;
  const model = $("model-picker").hidden ? "" : $("model").value;
  if (model && state.session && model !== state.session.answer_model) body.model = model;
  let finished = false;
  try {
    await streamAsk(
      body,
      (name, data) => {
        if (name === "progress") {
          if (data.stage === "tool_started") view.toolStarted(data.tool, data.arguments);
          const text = progressText(data);
          if (text) view.setStatus(text);
        } else if (name === "tool") {
          view.toolFinished(data);
        } else if (name === "token") {
          view.addToken(data.text ?? "");
        } else if (name === "citation") {
          view.citations.push(data);
        } else if (name === "done" || (name === "error" && data.decision)) {
          finished = true;
          view.finish(data);
          if (data.conversation_id) {
            state.conversationId = data.conversation_id;
            view.enableFeedback(data.conversation_id, data.turn);
            loadThreads();
          }
        } else if (name === "error") {
          finished = true;
          const error = data.error || {};
          view.fail(error.code || "error", error.message || "The answer failed.");
        }
      },
      controller.signal,
    );
    if (!finished) view.fail("stream_ended", "The answer stream ended early.");
  } catch (error) {
    if (error.name === "AbortError") view.stopped();
    else if (error instanceof ApiError) view.fail(error.code, error.message);
    else view.fail("network", `Could not reach the service (${error.message}).`);
  } finally {
    state.controller = null;
    setBusy(false);
  }
}

function stop() {
  if (state.controller) state.controller.abort();
}

// --- threads -------------------------------------------------------------------------------

async function loadThreads() {
  const list = $("thread-list");
  if (!state.session || !state.session.user) {
    list.replaceChildren();
    return;
  }
  try {
    const page = await call("GET", "/conversations?limit=50");
    list.replaceChildren(...page.conversations.map(threadItem));
    $("threads-note").textContent = page.conversations.length ? "" : "No conversations yet.";
  } catch (error) {
    $("threads-note").textContent = `Conversations unavailable: ${error.message}`;
  }
}

function threadItem(summary) {
  const open = el("button", {
    type: "button",
    class: "thread-open",
    "aria-current": summary.id === state.conversationId ? "true" : null,
    text: summary.title || "(untitled)",
    title: `${summary.turn_count} turn(s), updated ${new Date(summary.updated_at).toLocaleString()}`,
    onclick: () => openThread(summary.id),
  });
  const remove = el("button", {
    type: "button",
    class: "thread-delete",
    "aria-label": `Delete conversation: ${summary.title}`,
    text: "Delete",
  });
  remove.addEventListener("click", async () => {
    if (remove.dataset.confirm !== "yes") {
      remove.dataset.confirm = "yes";
      remove.textContent = "Confirm delete";
      return;
    }
    try {
      await call("DELETE", `/conversations/${summary.id}`);
      if (state.conversationId === summary.id) newChat();
      await loadThreads();
      $("new-chat").focus();
    } catch (error) {
      $("threads-note").textContent = `Not deleted: ${error.message}`;
    }
  });
  remove.addEventListener("blur", () => {
    remove.dataset.confirm = "";
    remove.textContent = "Delete";
  });
  return el("li", { class: "thread" }, open, remove);
}

async function openThread(id) {
  try {
    const thread = await call("GET", `/conversations/${id}`);
    state.conversationId = thread.id;
    const turns = $("turns");
    turns.replaceChildren();
    for (const turn of thread.turns) {
      const view = new TurnView(turn.question);
      turns.append(view.node);
      view.showTrace(turn.tool_calls);
      view.finish({ ...turn, answer: turn.answer });
      if (turn.answer_withheld) view.fail("withheld", "This answer cited documentation you can no longer see.");
      view.enableFeedback(thread.id, turn.turn);
    }
    await loadThreads();
    $("question").focus();
  } catch (error) {
    $("threads-note").textContent = `Could not open it: ${error.message}`;
  }
}

function newChat() {
  state.conversationId = null;
  $("turns").replaceChildren();
  for (const b of document.querySelectorAll(".thread-open[aria-current]")) b.removeAttribute("aria-current");
  $("question").focus();
}

// --- who is asking -------------------------------------------------------------------------

async function loadSession() {
  const session = await call("GET", "/ui/session");
  state.session = session;
  const user = session.user;
  const who = $("who");
  const note = $("auth-note");
  if (user) {
    const roles = user.roles.join(", ") || "no role";
    const domains = user.domains.join(", ") || "no domain";
    who.textContent = user.anonymous ? "Anonymous (REQUIRE_AUTH=false)" : `${user.sub} · ${roles} · ${domains}`;
    note.hidden = true;
  } else {
    who.textContent = "Not signed in";
    note.hidden = false;
    note.textContent = session.dev_sign_in
      ? "Choose a development user above and sign in."
      : `Not signed in: ${session.unauthenticated_reason ?? "no credentials"}. This page expects the mesh to sign its requests.`;
  }
  $("ask-button").disabled = !user;
  // Model override: only for callers whose role passes the gate.
  const models = user ? user.models : [];
  $("model-picker").hidden = !(user && user.can_override_model && models.length > 1);
  $("model").replaceChildren(...models.map((m) => el("option", { value: m, text: m })));
  $("admin-panel").hidden = !(user && user.can_ingest);
  if (session.dev_sign_in) await loadDevUsers(user);
  else $("dev-sign-in").hidden = true;
  await loadThreads();
}

async function loadDevUsers(user) {
  const select = $("dev-user");
  // Filled once: refilling it after every sign-in would reset a choice made meanwhile.
  if (select.options.length === 0) {
    const { users } = await call("GET", "/ui/dev/users");
    select.replaceChildren(...users.map((u) => el("option", { value: u.id, text: u.label })));
    if (user && users.some((u) => u.id === user.sub)) select.value = user.sub;
  }
  $("dev-sign-in").hidden = false;
}

async function devSignIn() {
  const result = await call("POST", "/ui/dev/sign-in", { user: $("dev-user").value });
  setDevClaims(result.mode === "header" ? result.claims : null);
  newChat();
  await loadSession();
}

async function devSignOut() {
  setDevClaims(null);
  await call("POST", "/ui/dev/sign-out");
  newChat();
  await loadSession();
}

// --- admin: ingestion ----------------------------------------------------------------------

const TERMINAL = new Set(["succeeded", "failed", "stopped"]);

function showRun(run) {
  const progress = run.progress && run.progress.total ? ` · ${run.progress.done}/${run.progress.total} documents` : "";
  const counts = run.counts && Object.keys(run.counts).length ? ` · ${JSON.stringify(run.counts)}` : "";
  const message = run.message ? ` · ${run.message}` : "";
  $("ingest-status").textContent = `${run.run_id}: ${run.status}${progress}${counts}${message}`;
}

async function startIngest() {
  const button = $("ingest-start");
  button.disabled = true;
  try {
    let run = await call("POST", "/ingest", { prune: $("ingest-prune").checked });
    showRun(run);
    while (!TERMINAL.has(run.status)) {
      await new Promise((resolve) => setTimeout(resolve, 2000));
      run = await call("GET", `/ingest/${encodeURIComponent(run.run_id)}`);
      showRun(run);
    }
  } catch (error) {
    $("ingest-status").textContent = `Ingestion: ${error.message}`;
  } finally {
    button.disabled = false;
  }
}

// --- wiring --------------------------------------------------------------------------------

function init() {
  const question = $("question");
  $("ask-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = question.value.trim();
    if (!text || state.controller || !(state.session && state.session.user)) return;
    question.value = "";
    ask(text);
  });
  question.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("ask-form").requestSubmit();
    }
  });
  $("stop-button").addEventListener("click", stop);
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    if (!$("source-pane").hidden) closeSource();
    else stop();
  });
  $("source-close").addEventListener("click", closeSource);
  $("new-chat").addEventListener("click", newChat);
  $("dev-sign-in-button").addEventListener("click", () => devSignIn().catch(showAuthError));
  $("dev-sign-out-button").addEventListener("click", () => devSignOut().catch(showAuthError));
  $("ingest-start").addEventListener("click", startIngest);
  setBusy(false);
  loadSession().catch(showAuthError);
}

function showAuthError(error) {
  const note = $("auth-note");
  note.hidden = false;
  note.textContent = `Could not load the session: ${error.message}`;
}

init();
