"""What a run leaves behind: JUnit XML for CI, a Markdown report for people, and the summary
table printed at the end of a run.

JUnit mapping: FAIL is a ``failure``, ERROR an ``error``, XFAIL ``skipped`` (with the xfail
reason), PARTIAL ``skipped`` too (it is not a pass: the expectations not checked are in the
message and a ``not_checked`` property), XPASS a passing case carrying an ``xpass``
property, or a ``failure`` under ``--strict``.

The pass rate everywhere is fully passed rows (PASS + XPASS) over all rows; the Markdown
report says so, and breaks it down per split and world, and per route (the kind of row, from
its tags), and gives the rows the model wrote apart from those the service wrote
(``answered_by``), per route. Its header says which split ran (dev, test: the run of record,
or all), from which files, and how many rows.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evals.runner import EvalRun, RowResult, Status, loud_warning

ANSWER_EXCERPT_CHARS = 500

# A row's route is the first of these tags it carries: one route per row, so the per-route
# rows add up to the whole run (a permission row about a hidden page is "permission", not
# "documentation").
ROUTES: tuple[tuple[str, str], ...] = (
    ("off-topic", "off-topic / scope"),
    ("greeting", "greeting"),
    ("permission", "permission"),
    ("idk", "idk"),
    ("multi-hop", "multi-hop live data"),
    ("unknown-building", "unknown building"),
    ("live-data", "live data, one tool"),
    ("doc", "documentation"),
)
OTHER_ROUTE = "other"
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """XML 1.0 cannot carry control characters, whatever the escaping."""
    return _XML_ILLEGAL.sub("\ufffd", text)


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def fmt_usd(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"${value:.4f}" if value >= 0.01 or value == 0 else f"${value:.6f}"


def fmt_rate(value: float) -> str:
    return f"{value * 100:.1f}%"


def pass_rate_rule(run: EvalRun) -> str:
    """What the pass rate counts, said exactly."""
    return (
        f"{fmt_rate(run.pass_rate)} = {run.fully_passed} fully passed (PASS + XPASS: every "
        f"declared expectation checked and held) / all {run.total} rows (FAIL, ERROR, XFAIL "
        "and PARTIAL rows count in the denominator only)"
    )


SPLIT_MEANINGS = {
    "dev": "dev: rules, thresholds and prompts may be fitted on these rows; not a run of record",
    "test": "test: frozen rows, not read while changing the agent; the run of record",
    "all": "all: dev and test together; quote the test rows' figures (per split, below) apart",
}


def split_line(run: EvalRun) -> str:
    """Which split ran and how many rows, from which files: ``split test: 115 rows
    (golden.yaml 26, test.yaml 89) of 156 in the files``."""
    per_file = Counter(Path(r.file).name for r in run.results)
    files = [Path(f).name for f in run.files] or list(per_file)
    counts = ", ".join(f"{name} {per_file.get(name, 0)}" for name in files)
    held = f" of {run.rows_in_files} in the files" if run.rows_in_files is not None else ""
    worlds = f"; worlds {', '.join(run.worlds)}" if run.worlds else ""
    rows = f"{run.total} row" + ("" if run.total == 1 else "s")
    return f"split {run.split or 'not recorded'}: {rows} ({counts}){held}{worlds}"


def row_route(tags: Sequence[str]) -> str:
    for tag, route in ROUTES:
        if tag in tags:
            return route
    return OTHER_ROUTE


def _row_failure_text(result: RowResult) -> str:
    if result.error:
        return result.error
    return "\n".join(f"{a.name}: {a.evidence}" for a in result.failed_assertions)


# --- JUnit ------------------------------------------------------------------------------------


def junit_xml(run: EvalRun, *, strict: bool | None = None) -> str:
    """The run as a JUnit XML document (one testsuite, one testcase per row)."""
    strict = run.strict if strict is None else strict
    counts = run.counts
    failures = counts[Status.FAIL] + (counts[Status.XPASS] if strict else 0)
    suites = ET.Element("testsuites", name="agent-service evals")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"evals.{run.dataset}" + (f"[{run.model}]" if run.model else ""),
        tests=str(run.total),
        failures=str(failures),
        errors=str(counts[Status.ERROR]),
        skipped=str(counts[Status.XFAIL] + counts[Status.PARTIAL]),
        time=f"{run.duration_s:.3f}",
        timestamp=run.started_at.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("base_url", run.base_url),
        ("model", run.label),
        ("judge_model", run.judge_model or "none"),
        ("split", run.split or "not recorded"),
        ("pass_rate", f"{run.pass_rate:.4f}"),
    ):
        ET.SubElement(props, "property", name=name, value=_xml_text(value))
    for result in run.results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"evals.{Path(result.file).stem}",
            name=result.id,
            time=f"{(result.latency_ms or 0) / 1000:.3f}",
        )
        properties = ET.SubElement(case, "properties")
        ET.SubElement(properties, "property", name="status", value=result.status.value)
        not_checked = ", ".join(a.name for a in result.skipped_assertions)
        if not_checked:
            ET.SubElement(properties, "property", name="not_checked", value=not_checked)
        text = _xml_text(_row_failure_text(result))
        if result.status is Status.FAIL:
            count = len(result.failed_assertions)
            failure = ET.SubElement(
                case,
                "failure",
                message=_xml_text(f"{count} expectation(s) failed"),
                type="AssertionError",
            )
            failure.text = text
        elif result.status is Status.ERROR:
            error = ET.SubElement(
                case, "error", message=_xml_text((result.error or "error")[:200]), type="Error"
            )
            error.text = text
        elif result.status is Status.PARTIAL:
            ET.SubElement(
                case, "skipped", message=_xml_text(f"partially checked: not checked {not_checked}")
            )
        elif result.status is Status.XFAIL:
            skipped = ET.SubElement(
                case, "skipped", message=_xml_text(f"xfail: {result.xfail or ''}")
            )
            skipped.text = text
        elif result.status is Status.XPASS:
            note = f"XPASS: stale xfail marker ({result.xfail}); remove it"
            if strict:
                failure = ET.SubElement(case, "failure", message=_xml_text(note), type="XPASS")
                failure.text = note
            else:
                ET.SubElement(properties, "property", name="xpass", value=_xml_text(note))
        out = ET.SubElement(case, "system-out")
        out.text = _xml_text(
            f"question: {result.question}\nanswer: {result.answer or '(none)'}\n"
            f"decision: {result.decision}  model: {result.model}  trace: {result.trace_id}"
        )
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(run: EvalRun, path: Path, *, strict: bool | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(junit_xml(run, strict=strict), encoding="utf-8")
    return path


# --- Markdown ---------------------------------------------------------------------------------


def md_cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _excerpt(text: str | None, limit: int = ANSWER_EXCERPT_CHARS) -> str:
    if not text:
        return "(no answer)"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tokens(result: RowResult) -> str:
    if result.answer is None:
        return "-"
    return f"{result.input_tokens:,}/{result.output_tokens:,}"


def markdown_report(run: EvalRun, *, strict: bool | None = None) -> str:
    """The run for people: header and totals (the pass rate defined), a biased-judge warning
    up top, per-route rates and latency, one table row per dataset row, then the failing,
    XPASS and partially checked rows with evidence, and the XFAIL rows with reasons."""
    strict = run.strict if strict is None else strict
    lines = (
        _header(run, strict)
        + _warnings(run)
        + _totals(run)
        + _splits(run)
        + _routes(run)
        + _authors(run)
        + _router(run)
        + _rows(run)
    )
    flagged = [r for r in run.results if r.status in (Status.FAIL, Status.ERROR, Status.XPASS)]
    if flagged:
        lines += ["## Failures, errors and XPASS", ""]
        for r in flagged:
            lines += _row_details(r)
    lines += _partial(run) + _xfailed(run)
    return "\n".join(lines).rstrip() + "\n"


def _header(run: EvalRun, strict: bool) -> list[str]:
    lines = [f"# Eval report: {run.dataset} ({run.started_at:%Y-%m-%d})", ""]
    if run.rescored_from:
        lines += [
            f"**Re-scored** from saved answers ({md_cell(run.rescored_from)}), not a fresh "
            "run: no question was asked again and saved judge verdicts were reused.",
            "",
        ]
    return [
        *lines,
        f"- Date: {run.started_at:%Y-%m-%d %H:%M:%S} UTC ({run.duration_s:.1f} s)",
        f"- Base URL: `{run.base_url}`",
        f"- Answer model: {run.label}" + (" (per-request override)" if run.model else ""),
        f"- Judge model: {run.judge_model or 'none (rubric expectations not checked)'}",
        f"- Split: {SPLIT_MEANINGS.get(run.split or '', run.split or 'not recorded')}",
        f"- Ran: {md_cell(split_line(run))}",
        "- Files: " + (", ".join(f"`{f}`" for f in run.files) or "not recorded"),
        f"- Rows: {run.total}; pass rate {pass_rate_rule(run)}"
        + ("; strict: XPASS fails the run" if strict else ""),
        f"- Partially checked (PARTIAL, not passes): {run.counts[Status.PARTIAL]} rows whose "
        "every checked expectation held but some could not be checked (listed below)",
        "",
    ]


def _warnings(run: EvalRun) -> list[str]:
    stale = [r for r in run.results if r.status is Status.XPASS]
    if not run.warnings and not stale:
        return []
    lines = ["## Warnings", ""]
    lines += [f"> **WARNING: {md_cell(w)}**" for w in run.warnings]
    if run.warnings:
        lines.append("")
    lines += [
        f"- **XPASS** `{r.id}`: passes although marked xfail for "
        f"{md_cell(', '.join(r.xfail_models))} ({md_cell(r.xfail)}); the marker is stale, "
        "remove it"
        for r in stale
    ]
    return lines + ([""] if stale else [])


def _totals(run: EvalRun) -> list[str]:
    c = run.counts
    lines = [
        "| PASS | PARTIAL | FAIL | ERROR | XFAIL | XPASS | pass rate | p50 | p95 "
        "| tokens in/out | cost |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {c[Status.PASS]} | {c[Status.PARTIAL]} | {c[Status.FAIL]} | {c[Status.ERROR]} "
        f"| {c[Status.XFAIL]} | {c[Status.XPASS]} | {fmt_rate(run.pass_rate)} "
        f"| {fmt_ms(run.p50_ms)} | {fmt_ms(run.p95_ms)} "
        f"| {run.input_tokens:,}/{run.output_tokens:,} | {fmt_usd(run.cost_usd)}"
        + ("" if run.cost_complete else " (partial)")
        + " |",
        "",
    ]
    if run.judge is not None:
        judge = run.judge
        lines += [
            f"Judge: {judge.calls} calls, {judge.input_tokens:,}/{judge.output_tokens:,} tokens, "
            f"cost {fmt_usd(judge.cost_usd)}, {judge.failures} without a usable verdict.",
            "",
        ]
    return lines


def _part(run: EvalRun, rows: list[RowResult]) -> EvalRun:
    return EvalRun(
        run.base_url, run.dataset, run.model, None, run.started_at, run.finished_at, rows
    )


def _splits(run: EvalRun) -> list[str]:
    """Rows and pass rates per split and world: the test rows' figure stands apart."""
    groups: dict[tuple[str, str], list[RowResult]] = {}
    order = {"dev": 0, "test": 1}
    for r in run.results:
        groups.setdefault((r.split or "-", r.world or "-"), []).append(r)
    lines = [
        "## Per split and world",
        "",
        "| split | world | rows | fully passed | pass rate | PARTIAL | FAIL | ERROR | XFAIL |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for split, world in sorted(groups, key=lambda key: (order.get(key[0], 2), key)):
        part = _part(run, groups[(split, world)])
        c = part.counts
        lines.append(
            f"| {split} | {world} | {part.total} | {part.fully_passed} "
            f"| {fmt_rate(part.pass_rate)} | {c[Status.PARTIAL]} | {c[Status.FAIL]} "
            f"| {c[Status.ERROR]} | {c[Status.XFAIL]} |"
        )
    return [*lines, ""]


def route_groups(results: Sequence[RowResult]) -> dict[str, list[RowResult]]:
    """Rows by route, in ``ROUTES`` order (routes with no row left out)."""
    groups: dict[str, list[RowResult]] = {route: [] for _, route in ROUTES}
    groups[OTHER_ROUTE] = []
    for r in results:
        groups[row_route(r.tags)].append(r)
    return {route: rows for route, rows in groups.items() if rows}


def _routes(run: EvalRun) -> list[str]:
    lines = [
        "## Per route",
        "",
        "A row's route is the first of its tags in "
        + ", ".join(f"`{tag}`" for tag, _ in ROUTES)
        + f" (else {OTHER_ROUTE}). Pass rate = fully passed / the route's rows; latency over "
        "every row with one, errors included.",
        "",
        "| route | rows | fully passed | pass rate | PARTIAL | FAIL | ERROR | XFAIL | p50 | p95 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for route, rows in route_groups(run.results).items():
        part = _part(run, rows)
        c = part.counts
        lines.append(
            f"| {route} | {part.total} | {part.fully_passed} | {fmt_rate(part.pass_rate)} "
            f"| {c[Status.PARTIAL]} | {c[Status.FAIL]} | {c[Status.ERROR]} | {c[Status.XFAIL]} "
            f"| {fmt_ms(part.p50_ms)} | {fmt_ms(part.p95_ms)} |"
        )
    return [*lines, ""]


AUTHORS = ("model", "service")  # AgentAnswer.answered_by


def _author_cells(run: EvalRun, rows: Sequence[RowResult]) -> str:
    """Rows, fully passed and pass rate of the model-written rows, then the service-written
    rows, then how many have no answer to attribute."""
    cells: list[str] = []
    for author in AUTHORS:
        part = _part(run, [r for r in rows if r.answered_by == author])
        rate = fmt_rate(part.pass_rate) if part.total else "-"
        cells += [str(part.total), str(part.fully_passed), rate]
    cells.append(str(sum(r.answered_by not in AUTHORS for r in rows)))
    return " | ".join(cells)


def _authors(run: EvalRun) -> list[str]:
    """The rows the model wrote and the rows the service wrote, apart: their pass rates in
    all and per route (the kind of row, as in Per route), per route the service's planner
    took, and their latency."""
    if not any(r.answered_by in AUTHORS for r in run.results):
        return []
    header = (
        "| model-written | passed | pass rate | service-written | passed | pass rate | no answer |"
    )
    rule = "---:|" * 7
    lines = [
        "## Who wrote the answer",
        "",
        "Each row by its answer's `answered_by`: `model` (the model's own reply, after the "
        "service's checks; an IDK or decline the model chose included) or `service` (written "
        "by the service without the model, from its own tool results, or its own text in "
        "place of the model's reply: see docs/agent-loop.md). Pass rate = fully passed / that "
        "group's rows; no answer: ERROR rows without a response.",
        "",
        "| route " + header,
        "|---|" + rule,
    ]
    groups: dict[str, Sequence[RowResult]] = {"all rows": run.results}
    groups.update(route_groups(run.results))
    lines += [f"| {route} | {_author_cells(run, rows)} |" for route, rows in groups.items()]
    lines.append("")
    taken = [(service_route(r), r) for r in run.results]
    if any(route for route, _ in taken):
        lines += [
            "By the route the service's planner took (its `route:` note; `-`: no plan):",
            "",
            "| planner route " + header,
            "|---|" + rule,
        ]
        for planned in (*SERVICE_ROUTES, None):
            rows = [r for route, r in taken if route == planned]
            if rows:
                lines.append(f"| {planned or '-'} | {_author_cells(run, rows)} |")
        lines.append("")
    for author in AUTHORS:
        part = _part(run, [r for r in run.results if r.answered_by == author])
        if part.total:
            lines.append(
                f"- {author}-written rows: latency p50 {fmt_ms(part.p50_ms)}, "
                f"p95 {fmt_ms(part.p95_ms)}; tokens {part.input_tokens:,}/"
                f"{part.output_tokens:,}"
            )
    return [*lines, ""]


SERVICE_ROUTES = ("greeting", "documentation", "live_data", "both", "open")
_ROUTE_NOTE = re.compile(r"^route: (\w+)")


def service_route(result: RowResult) -> str | None:
    """The route the service's planner took for this row (its ``route: ...`` note), or None
    (no plan: native mode, or no response)."""
    notes = (result.response or {}).get("notes") or []
    for note in notes if isinstance(notes, list) else []:
        match = _ROUTE_NOTE.match(str(note))
        if match:
            return match.group(1)
    return None


def _router(run: EvalRun) -> list[str]:
    """The router on its own: each kind of row against the route the planner chose."""
    taken = [(row_route(r.tags), service_route(r)) for r in run.results]
    if not any(route for _, route in taken):
        return []
    lines = [
        "## Router",
        "",
        "Each kind of row (as in Per route) against the route the service's planner chose "
        "(its `route:` note; `-`: no plan, e.g. an error). Off-topic rows belong in `open` "
        "(the model may decline there), documentation rows in `documentation` or `both`.",
        "",
        "| kind | " + " | ".join(SERVICE_ROUTES) + " | - |",
        "|---|" + "---:|" * (len(SERVICE_ROUTES) + 1),
    ]
    for kind in route_groups(run.results):
        routes = [route for k, route in taken if k == kind]
        cells = [str(routes.count(route)) for route in SERVICE_ROUTES]
        lines.append(f"| {kind} | " + " | ".join([*cells, str(routes.count(None))]) + " |")
    return [*lines, ""]


def _rows(run: EvalRun) -> list[str]:
    lines = [
        "## Rows",
        "",
        "| id | status | latency | tokens in/out | cost | decision | tags |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in run.results:
        status = f"**{r.status.value}**" if r.status in (Status.FAIL, Status.ERROR) else r.status
        lines.append(
            f"| `{r.id}` | {status} | {fmt_ms(r.latency_ms)} | {_tokens(r)} "
            f"| {fmt_usd(r.cost_usd) if r.answer is not None else '-'} | {r.decision or '-'} "
            f"| {md_cell(', '.join(r.tags))} |"
        )
    return [*lines, ""]


def _partial(run: EvalRun) -> list[str]:
    partial = [r for r in run.results if r.status is Status.PARTIAL]
    if not partial:
        return []
    lines = ["## Partially checked (PARTIAL)", ""]
    for r in partial:
        names = ", ".join(a.name for a in r.skipped_assertions)
        held = len(r.assertions) - len(r.skipped_assertions)
        lines.append(f"- `{r.id}`: {held} checked and held; not checked: {names}")
    return [*lines, ""]


def _xfailed(run: EvalRun) -> list[str]:
    expected = [r for r in run.results if r.status is Status.XFAIL]
    if not expected:
        return []
    lines = ["## Expected failures (XFAIL)", ""]
    for r in expected:
        failed = ", ".join(a.name for a in r.failed_assertions) or "-"
        models = ", ".join(r.xfail_models)
        lines.append(
            f"- `{r.id}` (xfail for {md_cell(models)}): {md_cell(r.xfail)} (failed: {failed})"
        )
    return [*lines, ""]


def _row_details(r: RowResult) -> list[str]:
    lines = [f"### `{r.id}`: {r.status.value}", "", f"Question: {md_cell(r.question)}", ""]
    if r.xfail:
        models = ", ".join(r.xfail_models)
        lines += [f"xfail for {md_cell(models)}: {md_cell(r.xfail)}", ""]
    if r.error:
        lines += [f"- **error**: {md_cell(r.error)}"]
    for a in r.failed_assertions:
        lines.append(f"- **{a.name}**: {md_cell(a.evidence)}")
    if r.status is Status.XPASS:
        lines.append("- every expectation held: remove the xfail marker")
    for a in r.skipped_assertions:
        lines.append(f"- {a.name}: {md_cell(a.evidence)}")
    lines += [
        "",
        f"Answer ({r.decision or 'no decision'}, {r.model or 'unknown model'}"
        + (f", written by the {r.answered_by}" if r.answered_by else "")
        + (f", trace {r.trace_id}" if r.trace_id else "")
        + "):",
        "",
        f"> {md_cell(_excerpt(r.answer))}",
        "",
    ]
    return lines


def write_markdown(run: EvalRun, path: Path, *, strict: bool | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown_report(run, strict=strict), encoding="utf-8")
    return path


# --- the terminal summary ---------------------------------------------------------------------

_STYLES = {
    Status.PASS: "green",
    Status.PARTIAL: "cyan",
    Status.FAIL: "bold red",
    Status.ERROR: "bold red",
    Status.XFAIL: "yellow",
    Status.XPASS: "bold magenta",
}


def print_summary(run: EvalRun, console: Console, *, strict: bool | None = None) -> None:
    """Rows that need attention, totals, and a loud line per stale xfail marker."""
    strict = run.strict if strict is None else strict
    table = Table(title=f"eval {run.dataset} ({run.split or '-'}): {run.label}", show_lines=False)
    for column, justify in (
        ("id", "left"),
        ("status", "left"),
        ("latency", "right"),
        ("tokens in/out", "right"),
        ("cost", "right"),
        ("failed expectations", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for r in run.results:
        failed = r.error or ", ".join(a.name for a in r.failed_assertions)
        style = _STYLES[r.status]
        table.add_row(
            r.id,
            f"[{style}]{r.status.value}[/{style}]",
            fmt_ms(r.latency_ms),
            _tokens(r),
            fmt_usd(r.cost_usd) if r.answer is not None else "-",
            failed[:100],
        )
    console.print(table)
    counts = run.counts
    parts = [f"{counts[s]} {s.value}" for s in Status if counts[s]]
    console.print(split_line(run), highlight=False)
    console.print(
        f"{run.total} rows: {', '.join(parts)}; pass rate {pass_rate_rule(run)}; "
        f"p50 {fmt_ms(run.p50_ms)}, p95 {fmt_ms(run.p95_ms)}; "
        f"tokens {run.input_tokens:,}/{run.output_tokens:,}; cost {fmt_usd(run.cost_usd)}"
    )
    authored = [_part(run, [r for r in run.results if r.answered_by == a]) for a in AUTHORS]
    if any(part.total for part in authored):
        console.print(
            "written by "
            + "; by ".join(
                f"the {author}: {part.fully_passed}/{part.total} fully passed"
                + (f" ({fmt_rate(part.pass_rate)})" if part.total else "")
                for author, part in zip(AUTHORS, authored, strict=True)
            )
        )
    if run.judge is not None:
        console.print(
            f"judge {run.judge.model}: {run.judge.calls} calls, "
            f"{run.judge.input_tokens:,}/{run.judge.output_tokens:,} tokens, "
            f"cost {fmt_usd(run.judge.cost_usd)}"
        )
    for r in run.results:
        if r.status is Status.XPASS:
            effect = "fails the run (--strict)" if strict else "remove the marker"
            console.print(
                f"[bold magenta]XPASS {r.id}: marked xfail ({r.xfail}) but passes; "
                f"the marker is stale: {effect}[/bold magenta]"
            )
    for warning in run.warnings:
        loud_warning(console, warning)
