"""``agent-service ask``: streams by default (the answering model, live tool lines, a waiting
indicator, the answer, then citations and the decision); ``--json`` and ``--no-stream`` ask
for the whole response object, ``--stream`` is still accepted."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_app.ask_output import CLEAR_LINE, StreamPrinter, parse_sse_lines
from serve_app.cli import EXIT_OK, EXIT_USAGE, main

DONE: dict[str, Any] = {
    "answer": "Harbor Warehouse has 4 rooms [^abc123abc123].",
    "citations": [
        {"chunk_id": "abc123abc123", "source": "twin.md", "section": "Rooms", "snippet": "..."}
    ],
    "tool_calls": [
        {
            "name": "get_building",
            "arguments": {"building_id": "b1"},
            "ok": True,
            "error": None,
            "duration_ms": 120.4,
        }
    ],
    "usage": {"input_tokens": 10, "output_tokens": 5, "hops": []},
    "cost": {"estimated_usd": None, "provider_usd": None},
    "idk": False,
    "decision": "answered",
    "model": "local/scripted",
    "conversation_id": "7d1f3a52-9c4e-4b1a-8f00-0000000000a1",
    "turn": 1,
}
THREAD = DONE["conversation_id"]
STREAM: list[tuple[str, dict[str, Any]]] = [
    ("progress", {"stage": "started", "model": "local/scripted"}),
    ("progress", {"stage": "model", "hop": 1, "model": "local/scripted"}),
    ("progress", {"stage": "waiting", "hop": 1, "elapsed_s": 2.5}),
    (
        "progress",
        {"stage": "tool_started", "tool": "get_building", "arguments": {"building_id": "b1"}},
    ),
    ("tool", DONE["tool_calls"][0]),
    ("progress", {"stage": "model", "hop": 2, "model": "local/scripted"}),
    ("token", {"text": "Harbor Warehouse has "}),
    ("token", {"text": "4 rooms [^abc123abc123]."}),
    ("citation", DONE["citations"][0]),
    ("teleport", {"future": "events are skipped"}),
    ("done", DONE),
]


def sse_body(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return "".join(
        f"event: {name}\r\ndata: {json.dumps(data)}\r\n\r\n" for name, data in events
    ).encode()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``httpx.Client`` answering ``/ask`` in-process: SSE for a stream, else the JSON; the
    request bodies it got are returned."""
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if body["stream"]:
            headers = {"content-type": "text/event-stream"}
            return httpx.Response(200, content=sse_body(STREAM), headers=headers)
        return httpx.Response(200, json=DONE)

    real: Callable[..., httpx.Client] = httpx.Client
    monkeypatch.setattr(
        httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handler), **kw)
    )
    return bodies


def ask(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["ask", "How many rooms has Harbor Warehouse?", "--url", "http://x", *args], out)
    return code, out.getvalue()


def test_ask_streams_by_default_with_model_tool_and_waiting_lines(
    served: list[dict[str, Any]],
) -> None:
    code, text = ask()
    assert code == EXIT_OK and served[0]["stream"] is True
    assert text.splitlines() == [
        "answering with local/scripted",
        "... waiting for the model (2 s)",  # not a terminal: a plain line per heartbeat
        '-> get_building {"building_id": "b1"} ... ok 120 ms',
        "Harbor Warehouse has 4 rooms [^abc123abc123].",
        "",
        "[decision: answered, model: local/scripted]",
        "  [^abc123abc123] twin.md > Rooms",
        "  tokens in/out: 10/5, cost: {'estimated_usd': None, 'provider_usd': None}",
        f"  conversation {THREAD}, turn 1 (follow up: --conversation {THREAD})",
    ]
    assert CLEAR_LINE not in text


def test_the_old_stream_flag_is_accepted(served: list[dict[str, Any]]) -> None:
    code, text = ask("--stream")
    assert code == EXIT_OK and served[0]["stream"] is True
    assert text.startswith("answering with local/scripted\n")


@pytest.mark.parametrize("flag", ["--json", "--no-stream"])
def test_json_and_no_stream_ask_for_the_whole_answer(
    flag: str, served: list[dict[str, Any]]
) -> None:
    code, text = ask(flag)
    assert code == EXIT_OK and served[0]["stream"] is False
    if flag == "--json":
        assert json.loads(text) == DONE and text == json.dumps(DONE, indent=2) + "\n"
    else:
        assert text.splitlines()[0] == DONE["answer"]
        assert "  tool get_building" in text  # no live lines: the trace in the summary


def test_stream_and_no_stream_together_are_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        ask("--stream", "--no-stream")
    assert exited.value.code == EXIT_USAGE


def test_an_error_event_is_a_clean_cli_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    envelope = {"error": {"code": "provider_unavailable", "message": "the model is down"}}
    body = sse_body([("progress", {"stage": "started", "model": "m"}), ("error", envelope)])
    real: Callable[..., httpx.Client] = httpx.Client
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=transport, **kw))
    code, text = ask()
    assert code == EXIT_USAGE and text == "answering with m\n"
    assert "the model is down" in capsys.readouterr().err


def test_on_a_terminal_waiting_rewrites_one_status_line() -> None:
    out = io.StringIO()
    printer = StreamPrinter(out, tty=True)
    for name, data in [
        ("progress", {"stage": "started", "model": "m"}),
        ("progress", {"stage": "waiting", "hop": 1, "elapsed_s": 2.5}),
        ("progress", {"stage": "waiting", "hop": 1, "elapsed_s": 5.0}),
        ("token", {"text": "Hi."}),
    ]:
        printer.handle(name, data)
    printer.finish()
    assert out.getvalue() == (
        "answering with m\n"
        f"{CLEAR_LINE}... waiting for the model (2 s)"
        f"{CLEAR_LINE}{CLEAR_LINE}... waiting for the model (5 s)"
        f"{CLEAR_LINE}Hi.\n"
    )


def test_concurrent_tools_each_get_a_full_line() -> None:
    out = io.StringIO()
    printer = StreamPrinter(out, tty=False)
    call = {"ok": True, "error": None, "duration_ms": 5.0}
    for name, data in [
        ("progress", {"stage": "tool_started", "tool": "a", "arguments": {}}),
        ("progress", {"stage": "tool_started", "tool": "b", "arguments": {"x": 1}}),
        ("tool", {"name": "b", "arguments": {"x": 1}, **call}),
        ("tool", {"name": "a", "arguments": {}, **call, "ok": False, "error": "boom"}),
    ]:
        printer.handle(name, data)
    printer.finish()
    assert out.getvalue().splitlines() == [
        "-> a {} ...",
        '-> b {"x": 1} ... ok 5 ms',
        "-> a {} ... error: boom 5 ms",
    ]


def test_sse_lines_parse_into_events() -> None:
    lines = [*sse_body(STREAM[:2]).decode().split("\n"), ": ping", "event: x", "data: [1]"]
    parsed = list(parse_sse_lines(lines))
    assert parsed == [*STREAM[:2], ("x", [1])]


@pytest.fixture
def claims_sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The decoded ``x-gateway-claims`` of each ``/ask`` request (answered with ``DONE``)."""
    import base64

    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(base64.b64decode(request.headers["x-gateway-claims"])))
        return httpx.Response(200, json=DONE)

    real: Callable[..., httpx.Client] = httpx.Client
    monkeypatch.setattr(
        httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handler), **kw)
    )
    monkeypatch.delenv("LOCAL_WORLD_FILE", raising=False)
    return sent


def _memberships(claims: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    return claims["sub"], [(m["domain"], m["role"]) for m in claims["memberships"]]


def test_the_caller_defaults_to_the_worlds_and_flags_replace_its_parts(
    claims_sent: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ask("--json")[0] == EXIT_OK
    assert _memberships(claims_sent[-1]) == ("demo-user", [("northwind", "business_staff")])
    ask("--json", "--sub", "nina", "--domains", "acme,civic")
    assert _memberships(claims_sent[-1]) == (
        "nina",
        [("acme", "business_staff"), ("civic", "business_staff")],
    )
    ask("--json", "--as", "carla")
    assert _memberships(claims_sent[-1]) == ("carla", [("acme", "standard_customer")])

    monkeypatch.setenv("LOCAL_WORLD_FILE", "local_world/worlds/second.yaml")
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    ask("--json")
    assert _memberships(claims_sent[-1]) == ("ines", [("aurelia-health", "business_staff")])
    ask("--json", "--as", "ravi", "--roles", "business_staff")
    assert _memberships(claims_sent[-1]) == (
        "ravi",
        [("aurelia-health", "business_staff"), ("tidewater.edu", "business_staff")],
    )


def test_an_unknown_local_user_is_a_usage_error(
    claims_sent: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert ask("--json", "--as", "mallory")[0] == EXIT_USAGE
    assert claims_sent == []
    assert "the local world 'sample' has no such user (its users: nina, bram" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(("by", "said"), [("model", "the model"), ("service", "the service")])
@pytest.mark.parametrize("flag", [None, "--no-stream"])
def test_the_summary_says_who_wrote_the_answer(
    by: str,
    said: str,
    flag: str | None,
    served: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(DONE, "answered_by", by)  # the stream's done is this same object
    code, text = ask(*([flag] if flag else []))
    assert code == EXIT_OK
    assert f"[decision: answered, model: local/scripted, written by {said}]" in text.splitlines()


def test_an_answer_that_does_not_say_who_wrote_it_is_summarised_as_before() -> None:
    """An older server sends no ``answered_by``: nothing is made up."""
    from serve_app.ask_output import print_summary, written_by

    out = io.StringIO()
    print_summary({"decision": "idk", "model": "m", "answered_by": "judge"}, out, tools=False)
    assert out.getvalue().splitlines()[1] == "[decision: idk, model: m]"
    assert written_by({}) is None and written_by({"answered_by": "service"}) == "the service"
