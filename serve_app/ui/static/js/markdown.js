// Markdown for answers, safely: marked renders (raw HTML in the text is shown as text, never
// parsed), DOMPurify sanitises the result, and the page's CSP forbids inline script anyway.
// Citation markers [^chunk_id] become numbered footnote links.
import { Marked } from "../vendor/marked/marked.esm.js";
import DOMPurify from "../vendor/dompurify/purify.es.mjs";

const CITE = /\[\^([A-Za-z0-9_.:\-]{1,200})\]/g;

function escapeHtml(text) {
  return text
    .replaceAll("&", "&amp;")
    .replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;")
    .replaceAll('"', "&quot;")
    .replaceAll("'", "&#39;");
}

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    // Raw HTML (block or inline) from a model or a document is text, not markup.
    html(token) {
      return escapeHtml(token.text ?? token.raw ?? "");
    },
  },
});

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.getAttribute("href")) {
    const href = node.getAttribute("href");
    if (!href.startsWith("#")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  }
});

// `text` with [^id] markers; `citations` the list the response carried (chunk_id, source,
// section, snippet). Returns {html, order}: order[i] is the chunk id of footnote i+1.
// A marker whose chunk is not (yet) among the citations is left out of the text.
export function renderAnswer(text, citations) {
  const known = new Set(citations.map((c) => c.chunk_id));
  const order = [];
  const marked_text = text.replace(CITE, (_, id) => {
    if (!known.has(id)) return "";
    let n = order.indexOf(id);
    if (n < 0) {
      order.push(id);
      n = order.length - 1;
    }
    return `[${n + 1}](#cite:${encodeURIComponent(id)})`;
  });
  const raw = marked.parse(marked_text, { async: false });
  const html = DOMPurify.sanitize(raw, {
    USE_PROFILES: { html: true },
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe"],
    FORBID_ATTR: ["style"],
  });
  return { html, order };
}

// A stray partial marker at the end of a streamed text ("[^ab") is hidden until complete.
export function trimPartialMarker(text) {
  const at = text.lastIndexOf("[^");
  if (at >= 0 && text.indexOf("]", at) < 0) return text.slice(0, at);
  return text;
}
