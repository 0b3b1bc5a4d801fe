"""How ``agent-service ask`` shows a streamed answer: which model answers, a live line per
tool (``-> get_building {"building_id": "b1"} ... ok 120 ms``), a waiting indicator while the
model is queued or reading the prompt, the answer as it arrives, then its citations and the
decision and who wrote the answer (the model, or the service: ``answered_by``).

Plain text that reads well in a log: the waiting indicator rewrites one line only on a
terminal (elsewhere each heartbeat is a line of its own). Unknown events are skipped, so a
newer server never breaks an older CLI.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

__all__ = ["StreamPrinter", "parse_sse_lines", "print_summary"]

CLEAR_LINE = "\r\x1b[K"  # back to the line's start and erase it (a terminal's status line)


def parse_sse_lines(lines: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """``text/event-stream`` lines -> ``(event, data)`` pairs, ``data`` parsed as JSON."""
    name, data = "message", list[str]()
    for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].lstrip(" "))
    if data:  # a stream cut without its final blank line
        yield name, json.loads("\n".join(data))


def _arguments(arguments: Any) -> str:
    return json.dumps(arguments or {}, ensure_ascii=False)


def _outcome(call: dict[str, Any]) -> str:
    status = "ok" if call.get("ok") else f"error: {call.get('error')}"
    return f"{status} {call.get('duration_ms', 0):.0f} ms"


class StreamPrinter:
    """Turns the events of one streamed ``/ask`` into lines on ``out``; ``final`` is the
    ``done`` event's answer once it came."""

    def __init__(self, out: TextIO, *, tty: bool | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.final: dict[str, Any] = {}
        self._status = False  # a terminal status line (waiting) is showing
        self._open_tool: tuple[str, str] | None = None  # a tool line still waiting for its end
        self._mid_text = False  # answer text was written and the line is not finished

    def handle(self, event: str, data: Any) -> None:
        if event == "progress":
            self._progress(data)
        elif event == "tool":
            self._tool_finished(data)
        elif event == "token":
            self._clear_status()
            self._close_tool_line()
            self._write(str(data.get("text", "")))
            self._mid_text = True
        elif event == "done":
            self.final = data.get("response", data)
        # citation: shown from the done answer; error: the caller raises; others: skipped

    def finish(self) -> None:
        """End the last line (the answer text has no newline of its own)."""
        self._clear_status()
        self._close_tool_line()
        if self._mid_text:
            self._write("\n")
            self._mid_text = False

    # --- events ------------------------------------------------------------------------------

    def _progress(self, data: dict[str, Any]) -> None:
        stage = data.get("stage")
        if stage == "started":
            self._line(f"answering with {data.get('model')}")
        elif stage == "route":
            self._line(f"route: {data.get('route')}")
        elif stage == "waiting":
            self._waiting(float(data.get("elapsed_s") or 0.0))
        elif stage == "tool_started":
            self._line_break()
            name, arguments = str(data.get("tool")), _arguments(data.get("arguments"))
            self._write(f"-> {name} {arguments} ...")
            self._open_tool = (name, arguments)
        # model (a model call begins): nothing to show until it answers or keeps us waiting

    def _tool_finished(self, call: dict[str, Any]) -> None:
        key = (str(call.get("name")), _arguments(call.get("arguments")))
        if self._open_tool == key:  # the line of this very tool is still open: end it
            self._write(f" {_outcome(call)}\n")
            self._open_tool = None
            return
        self._line(f"-> {key[0]} {key[1]} ... {_outcome(call)}")

    def _waiting(self, elapsed: float) -> None:
        text = f"... waiting for the model ({elapsed:.0f} s)"
        if self.tty:
            self._line_break()
            self._write(CLEAR_LINE + text)
            self._status = True
        else:
            self._line(text)

    # --- output ------------------------------------------------------------------------------

    def _line(self, text: str) -> None:
        self._line_break()
        self._write(text + "\n")

    def _line_break(self) -> None:
        """Start on a fresh line: clear the status, end an open tool line or answer text."""
        self._clear_status()
        self._close_tool_line()
        if self._mid_text:
            self._write("\n")
            self._mid_text = False

    def _close_tool_line(self) -> None:
        if self._open_tool is not None:
            self._write("\n")  # its end is printed as a full line when it comes
            self._open_tool = None

    def _clear_status(self) -> None:
        if self._status:
            self._write(CLEAR_LINE)
            self._status = False

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def written_by(result: dict[str, Any]) -> str | None:
    """Who wrote the answer, as the summary says it (``answered_by``): "the model" or "the
    service"; None when the server does not say (an older one)."""
    by = result.get("answered_by")
    return f"the {by}" if by in ("model", "service") else None


def print_summary(result: dict[str, Any], out: TextIO, *, tools: bool) -> None:
    """The decision, who wrote the answer, citations, (``tools``: the tool trace) and usage
    of one answer."""
    author = written_by(result)
    by = f", written by {author}" if author else ""
    print(f"\n[decision: {result.get('decision')}, model: {result.get('model')}{by}]", file=out)
    for cite in result.get("citations", []):
        print(f"  [^{cite['chunk_id']}] {cite['source']} > {cite.get('section') or ''}", file=out)
    if tools:
        for call in result.get("tool_calls", []):
            print(
                f"  tool {call['name']}({json.dumps(call['arguments'])}) {_trace(call)}", file=out
            )
    usage = result.get("usage", {})
    print(
        f"  tokens in/out: {usage.get('input_tokens')}/{usage.get('output_tokens')}, "
        f"cost: {result.get('cost')}",
        file=out,
    )


def _trace(call: dict[str, Any]) -> str:
    """As the CLI always printed a traced call: duration, then the outcome."""
    status = "ok" if call["ok"] else f"error: {call['error']}"
    return f"{call['duration_ms']:.0f} ms {status}"
