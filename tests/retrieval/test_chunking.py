"""Tests for retrieval.chunking: decoding, front matter and Markdown-aware chunking."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retrieval.chunking import (
    Chunk,
    FrontMatterError,
    ParsedSource,
    SourceDecodeError,
    chunk_markdown,
    decode_source,
    parse_source,
)


def words(text: str) -> int:
    return len(text.split())


def chunk(body: str, max_tokens: int = 50) -> list[Chunk]:
    return chunk_markdown(body, words, max_tokens)


def check_invariants(chunks: list[Chunk], count: object, max_tokens: int) -> None:
    assert callable(count)
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert c.text.strip(), c
        assert c.token_count == count(c.text)
        assert c.oversized == (c.token_count > max_tokens)


# --------------------------------------------------------------------------- decode_source


def test_decode_plain_utf8() -> None:
    assert decode_source("héllo ✓\n".encode(), "a.md") == "héllo ✓\n"


def test_decode_strips_bom() -> None:
    assert decode_source(b"\xef\xbb\xbf# Title\n", "a.md") == "# Title\n"


def test_decode_normalises_crlf_and_cr() -> None:
    assert decode_source(b"a\r\nb\rc\n\r\nd", "a.md") == "a\nb\nc\n\nd"


def test_decode_invalid_utf8_message() -> None:
    with pytest.raises(SourceDecodeError) as info:
        decode_source(b"good text\n\xff bad", "documentation/user/x.md")
    message = str(info.value)
    assert message == "documentation/user/x.md: not valid UTF-8 (byte 0xff at offset 10); skipped"
    assert isinstance(info.value, ValueError)


def test_decode_invalid_offset_counts_bom() -> None:
    with pytest.raises(SourceDecodeError, match=r"byte 0xe9 at offset 5\)"):
        decode_source(b"\xef\xbb\xbfab\xe9cd", "latin1.md")  # Latin-1 'é'


def test_decode_truncated_multibyte_sequence() -> None:
    with pytest.raises(SourceDecodeError, match=r"t\.md: .*byte 0xe2 at offset 1"):
        decode_source(b"a\xe2\x9c", "t.md")


def test_decode_utf16_is_rejected() -> None:
    with pytest.raises(SourceDecodeError, match=r"byte 0xff at offset 0"):
        decode_source("hi".encode("utf-16"), "u16.md")


# --------------------------------------------------------------------------- parse_source


FRONT = """---
title: Alert thresholds
permissions:
  - role:operator
  - domain:acme
owner: ops
updated: 2024-05-01
tags: [alerts, cooldown]
---
# Alerts

Body text.
"""


def test_front_matter_parsed_and_not_in_body() -> None:
    parsed = parse_source(FRONT, "alerts.md")
    assert parsed == ParsedSource(
        title="Alert thresholds",
        permissions=["role:operator", "domain:acme"],
        metadata={
            "owner": "ops",
            "updated": datetime.date(2024, 5, 1),
            "tags": ["alerts", "cooldown"],
        },
        body="# Alerts\n\nBody text.\n",
    )
    assert "permissions" not in parsed.body
    assert "---" not in parsed.body
    chunks = chunk(parsed.body)
    assert [(c.section, c.text) for c in chunks] == [("Alerts", "Body text.")]
    assert all("role:operator" not in c.text for c in chunks)


def test_front_matter_title_not_in_section_path() -> None:
    parsed = parse_source("---\ntitle: Doc title\n---\nIntro.\n\n## Part\n\nMore.\n", "d.md")
    assert parsed.title == "Doc title"
    assert [c.section for c in chunk(parsed.body)] == ["", "Part"]


def test_no_front_matter() -> None:
    parsed = parse_source("# Heading one\n\ntext\n", "d.md")
    assert parsed == ParsedSource(
        title="Heading one", permissions=None, metadata={}, body="# Heading one\n\ntext\n"
    )


def test_title_falls_back_to_first_h1_outside_fences() -> None:
    body = "Intro\n\n```\n# not the title\n```\n\n## Sub\n\n# Real title #\n\n# Second\n"
    assert parse_source(body, "d.md").title == "Real title"


def test_title_none_without_h1() -> None:
    assert parse_source("## Only h2\n\ntext", "d.md").title is None
    assert parse_source("", "d.md").title is None


def test_blank_front_matter_title_falls_back_to_h1() -> None:
    assert parse_source("---\ntitle: '  '\n---\n# H\n", "d.md").title == "H"
    assert parse_source("---\ntitle:\n---\n# H\n", "d.md").title == "H"


def test_empty_front_matter() -> None:
    parsed = parse_source("---\n---\nbody\n", "d.md")
    assert parsed == ParsedSource(title=None, permissions=None, metadata={}, body="body\n")


def test_empty_permissions_list_is_kept_distinct_from_absent() -> None:
    assert parse_source("---\npermissions: []\n---\n", "d.md").permissions == []
    assert parse_source("---\nowner: x\n---\n", "d.md").permissions is None


def test_front_matter_crlf_bom_via_decode() -> None:
    data = (
        b"\xef\xbb\xbf---\r\ntitle: T\r\npermissions: [role:admin]\r\n---\r\n"
        b"Line one\r\nline two\r\n"
    )
    parsed = parse_source(decode_source(data, "w.md"), "w.md")
    assert parsed.title == "T"
    assert parsed.permissions == ["role:admin"]
    assert parsed.body == "Line one\nline two\n"
    assert "\r" not in parsed.body


def test_parse_source_normalises_newlines_itself() -> None:
    parsed = parse_source("---\r\ntitle: T\r\n---\r\na\rb\r\n", "w.md")
    assert parsed.title == "T"
    assert parsed.body == "a\nb\n"


def test_front_matter_closing_line_may_have_trailing_spaces() -> None:
    parsed = parse_source("---  \ntitle: T\n---\t\nbody", "d.md")
    assert (parsed.title, parsed.body) == ("T", "body")


def test_thematic_break_later_is_not_front_matter() -> None:
    parsed = parse_source("text\n\n---\n\nmore\n", "d.md")
    assert parsed.metadata == {}
    assert parsed.body == "text\n\n---\n\nmore\n"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("---\ntitle: [unclosed\n---\nbody", "malformed YAML"),
        ("---\ntitle: a\n  bad: indent\n---\n", "malformed YAML"),
        ("---\n- just\n- a list\n---\n", "must be a YAML mapping, got list"),
        ("---\njust a string\n---\n", "must be a YAML mapping, got str"),
        ("---\ntitle: 42\n---\n", "'title' must be a string, got int"),
        ("---\ntitle: [a, b]\n---\n", "'title' must be a string, got list"),
        ("---\npermissions: role:admin\n---\n", "'permissions' must be a list of strings, got str"),
        ("---\npermissions:\n---\n", "'permissions' must be a list of strings, got null"),
        ("---\npermissions: {role: admin}\n---\n", "must be a list of strings, got dict"),
        ("---\npermissions: [role:admin, 3]\n---\n", "found 3 (int)"),
        ("---\npermissions: [[role:admin]]\n---\n", "must be a list of strings, found"),
        ("---\ntitle: T\npermissions: [role:admin]\n\nno closing line\n", "never closed"),
    ],
)
def test_malformed_front_matter(text: str, problem: str) -> None:
    with pytest.raises(FrontMatterError) as info:
        parse_source(text, "documentation/user/bad.md")
    message = str(info.value)
    assert message.startswith("documentation/user/bad.md: ")
    assert problem in message
    assert isinstance(info.value, ValueError)


def test_malformed_yaml_reports_file_line() -> None:
    with pytest.raises(FrontMatterError, match=r"line 3"):
        parse_source("---\nowner: ops\ntitle: [unclosed, \n---\n", "d.md")


# --------------------------------------------------------------------------- empty inputs


@pytest.mark.parametrize("body", ["", "\n", "   \n\t\n  ", "\r\n\r\n"])
def test_blank_body_gives_no_chunks(body: str) -> None:
    assert chunk(body) == []


def test_headings_only_give_no_chunks() -> None:
    assert chunk("# A\n\n## B\n\n### C\n") == []


def test_empty_section_produces_no_chunk() -> None:
    chunks = chunk("# A\n\n## Empty\n\n## Full\n\ntext\n")
    assert [(c.section, c.text) for c in chunks] == [("A > Full", "text")]


def test_max_tokens_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        chunk_markdown("text", words, 0)


# --------------------------------------------------------------------------- sections


def test_section_path_nesting_and_popping() -> None:
    body = """before any heading

# Alerts

a

## Thresholds

b

### Cooldown

c

#### Deep

d

## Channels

e

### Email

f

# Other

g

### Skipped level

h

## Back up

i
"""
    chunks = chunk(body)
    assert [(c.section, c.text) for c in chunks] == [
        ("", "before any heading"),
        ("Alerts", "a"),
        ("Alerts > Thresholds", "b"),
        ("Alerts > Thresholds > Cooldown", "c"),
        ("Alerts > Thresholds > Cooldown > Deep", "d"),
        ("Alerts > Channels", "e"),
        ("Alerts > Channels > Email", "f"),
        ("Other", "g"),
        ("Other > Skipped level", "h"),
        ("Other > Back up", "i"),
    ]


def test_heading_variants() -> None:
    body = (
        "   ## Indented three ##\n\nx\n\n"
        "## Trailing hashes ###   \n\ny\n\n"
        "## C#\n\nz\n\n"
        "##\tTabbed\n\nw\n"
    )
    assert [(c.section, c.text) for c in chunk(body)] == [
        ("Indented three", "x"),
        ("Trailing hashes", "y"),
        ("C#", "z"),
        ("Tabbed", "w"),
    ]


def test_not_headings() -> None:
    body = "#hashtag is prose\n####### seven is prose\n    # four-space indent is prose\n"
    chunks = chunk(body)
    assert len(chunks) == 1
    assert chunks[0].section == ""
    assert chunks[0].text == body.rstrip("\n")


def test_empty_heading_text_is_left_out_of_path() -> None:
    chunks = chunk("# A\n\n## \n\ntext\n")
    assert [(c.section, c.text) for c in chunks] == [("A", "text")]


def test_chunk_never_spans_sections() -> None:
    body = "# A\n\none two\n\n# B\n\nthree four\n"
    chunks = chunk(body, max_tokens=100)
    assert [(c.section, c.text) for c in chunks] == [("A", "one two"), ("B", "three four")]


def test_heading_lines_not_in_chunk_text() -> None:
    chunks = chunk("# Title\nline right after heading\n## Sub\nmore\n")
    assert [c.text for c in chunks] == ["line right after heading", "more"]
    assert all("#" not in c.text for c in chunks)


def test_heading_interrupts_paragraph() -> None:
    chunks = chunk("para line\n## Section\nnext line\n")
    assert [(c.section, c.text) for c in chunks] == [("", "para line"), ("Section", "next line")]


# --------------------------------------------------------------------------- fenced code


def test_code_fence_with_headings_inside_is_not_split_into_sections() -> None:
    fence = "```python\n# comment\n## Not a heading\nx = 1  # trailing\n\n### Also not\n```"
    body = f"# Real\n\nIntro.\n\n{fence}\n\nAfter.\n"
    chunks = chunk(body)
    assert [(c.section, c.kind, c.text) for c in chunks] == [
        ("Real", "prose", "Intro."),
        ("Real", "code", fence),
        ("Real", "prose", "After."),
    ]
    assert parse_source(body, "d.md").title == "Real"


def test_tilde_fence_and_info_string() -> None:
    fence = "~~~ yaml title=config.yaml\n# comment\nkey: value\n~~~"
    chunks = chunk(f"{fence}\n")
    assert [(c.kind, c.text) for c in chunks] == [("code", fence)]


def test_longer_fence_contains_shorter_fences() -> None:
    fence = "`````markdown\n# Inside\n```bash\n## nope\n```\n~~~\n`````"
    chunks = chunk(f"# S\n\n{fence}\n\n## T\n\ntext\n")
    assert [(c.section, c.kind, c.text) for c in chunks] == [
        ("S", "code", fence),
        ("S > T", "prose", "text"),
    ]


def test_fence_closed_only_by_same_character() -> None:
    fence = "```\n~~~\n# inside\n```"
    assert [c.text for c in chunk(fence)] == [fence]


def test_closing_fence_cannot_have_info_string() -> None:
    fence = "```\n```python\n# inside\n```"
    assert [c.text for c in chunk(fence + "\n\n# H\n\nx")] == [fence, "x"]


def test_inline_triple_backticks_are_not_a_fence() -> None:
    chunks = chunk("```inline``` code span\n\n# Heading\n\ntext\n")
    assert [(c.section, c.kind, c.text) for c in chunks] == [
        ("", "prose", "```inline``` code span"),
        ("Heading", "prose", "text"),
    ]


def test_unclosed_fence_runs_to_end_of_document() -> None:
    body = (
        "# Setup\n\nRun:\n\n```bash\nmake install\n# Not a section\n## Nor this\n\nmore code\n\n\n"
    )
    chunks = chunk(body)
    assert [(c.section, c.kind, c.text) for c in chunks] == [
        ("Setup", "prose", "Run:"),
        ("Setup", "code", "```bash\nmake install\n# Not a section\n## Nor this\n\nmore code"),
    ]


def test_fence_nested_in_list_item_stays_whole() -> None:
    body = "1. Install:\n\n    ```bash\n    pip install x\n\n    # done\n    ```\n\n2. Run it.\n"
    chunks = chunk(body)
    assert [(c.kind, c.text) for c in chunks] == [
        ("prose", "1. Install:"),
        ("code", "    ```bash\n    pip install x\n\n    # done\n    ```"),
        ("prose", "2. Run it."),
    ]


def test_fence_interrupts_paragraph() -> None:
    chunks = chunk("Run this:\n```\nls\n```\nthen this.\n")
    assert [(c.kind, c.text) for c in chunks] == [
        ("prose", "Run this:"),
        ("code", "```\nls\n```"),
        ("prose", "then this."),
    ]


def test_empty_fence_is_still_a_chunk() -> None:
    assert [(c.kind, c.text) for c in chunk("```\n```\n")] == [("code", "```\n```")]


def test_huge_code_block_is_own_oversized_chunk() -> None:
    code = "```python\n" + "\n".join(f"value_{i} = {i}" for i in range(200)) + "\n```"
    body = f"# Big\n\nSmall intro.\n\n{code}\n\nSmall outro.\n"
    chunks = chunk(body, max_tokens=20)
    assert [(c.kind, c.oversized) for c in chunks] == [
        ("prose", False),
        ("code", True),
        ("prose", False),
    ]
    big = chunks[1]
    assert big.text == code
    assert big.token_count == words(code) > 20
    check_invariants(chunks, words, 20)


def test_small_code_block_is_own_chunk_not_packed_with_prose() -> None:
    chunks = chunk("Before.\n\n```\nx\n```\n\nAfter.\n", max_tokens=1000)
    assert [c.kind for c in chunks] == ["prose", "code", "prose"]


# --------------------------------------------------------------------------- tables


TABLE = "| Metric | Threshold | Cooldown |\n|:--|--:|:-:|\n| cpu | 90% | 5m |\n| mem | 80% | 10m |"


def test_table_kept_whole() -> None:
    body = f"# Limits\n\nIntro sentence.\n\n{TABLE}\n\nClosing words.\n"
    chunks = chunk(body)
    assert [(c.section, c.kind, c.text) for c in chunks] == [
        ("Limits", "prose", "Intro sentence."),
        ("Limits", "table", TABLE),
        ("Limits", "prose", "Closing words."),
    ]


def test_big_table_is_own_oversized_chunk_never_split() -> None:
    table = "| k | v |\n|---|---|\n" + "\n".join(f"| key{i} | value {i} |" for i in range(100))
    chunks = chunk(f"x\n\n{table}\n\ny\n", max_tokens=10)
    assert [(c.kind, c.oversized) for c in chunks] == [
        ("prose", False),
        ("table", True),
        ("prose", False),
    ]
    assert chunks[1].text == table
    check_invariants(chunks, words, 10)


def test_pipe_lines_without_delimiter_row_are_a_table() -> None:
    table = "| a | b |\n| c | d |"
    assert [(c.kind, c.text) for c in chunk(f"{table}\nnot a row\n")] == [
        ("table", table),
        ("prose", "not a row"),
    ]


def test_gfm_table_without_outer_pipes() -> None:
    table = "Metric | Threshold\n--- | ---\ncpu | 90%\nmem | 80%"
    chunks = chunk(f"Text before\n{table}\nText after, no pipe.\n")
    assert [(c.kind, c.text) for c in chunks] == [
        ("prose", "Text before"),
        ("table", table),
        ("prose", "Text after, no pipe."),
    ]


def test_gfm_table_rows_after_delimiter_need_not_start_with_pipe() -> None:
    table = "| a | b |\n|---|---|\nc | d\n| e | f |"
    assert [(c.kind, c.text) for c in chunk(table)] == [("table", table)]


def test_pipe_in_prose_with_mismatched_delimiter_is_not_a_table() -> None:
    body = "this a | b sentence\n--- | --- | ---\n"
    assert [c.kind for c in chunk(body)] == ["prose"]


def test_table_ends_at_heading() -> None:
    chunks = chunk("| a |\n| b |\n# H\n| c |\n")
    assert [(c.section, c.kind, c.text) for c in chunks] == [
        ("", "table", "| a |\n| b |"),
        ("H", "table", "| c |"),
    ]


def test_pipe_lines_inside_fence_are_code() -> None:
    fence = "```\n| a | b |\n|---|---|\n```"
    assert [(c.kind, c.text) for c in chunk(fence)] == [("code", fence)]


# --------------------------------------------------------------------------- prose packing


def test_paragraphs_packed_greedily() -> None:
    body = "one two three four\n\nfive six seven eight\n\nnine ten eleven twelve\n"
    chunks = chunk(body, max_tokens=9)
    assert [c.text for c in chunks] == [
        "one two three four\n\nfive six seven eight",
        "nine ten eleven twelve",
    ]
    assert [c.token_count for c in chunks] == [8, 4]


def test_multiple_blank_lines_between_paragraphs_collapse() -> None:
    chunks = chunk("a b\n\n\n  \n\nc d\n", max_tokens=10)
    assert [c.text for c in chunks] == ["a b\n\nc d"]


def test_prose_not_packed_across_atomic_block() -> None:
    chunks = chunk("a\n\n| t |\n\nb\n", max_tokens=100)
    assert [c.text for c in chunks] == ["a", "| t |", "b"]


def test_long_paragraph_split_at_sentence_boundaries() -> None:
    sentences = [
        "The first sentence has six words.",
        "Second one is short!",
        "Is the third a question?",
        'Fourth ends with a quote."',
        "Fifth sentence closes it.",
    ]
    paragraph = " ".join(sentences)
    chunks = chunk(f"# P\n\n{paragraph}\n", max_tokens=10)
    assert [c.text for c in chunks] == [
        "The first sentence has six words. Second one is short!",
        'Is the third a question? Fourth ends with a quote."',
        "Fifth sentence closes it.",
    ]
    assert all(c.section == "P" and not c.oversized for c in chunks)
    assert " ".join(c.text for c in chunks) == paragraph


def test_hard_wrapped_paragraph_keeps_original_line_breaks() -> None:
    paragraph = "alpha beta.\ngamma delta epsilon.\nzeta eta."
    chunks = chunk(paragraph, max_tokens=5)
    assert [c.text for c in chunks] == ["alpha beta.\ngamma delta epsilon.", "zeta eta."]


def test_long_list_split_between_items() -> None:
    items = [f"- item {i} has five" for i in range(6)]
    chunks = chunk("\n".join(items), max_tokens=10)
    assert [c.text for c in chunks] == ["\n".join(items[k : k + 2]) for k in (0, 2, 4)]


def test_sentence_longer_than_budget_split_at_words() -> None:
    long = " ".join(f"w{i}" for i in range(23)) + "."
    chunks = chunk(f"Short one. {long} Tail here.", max_tokens=10)
    # The piece being cut starts a new chunk; its last piece packs with what follows.
    assert [c.text for c in chunks] == [
        "Short one.",
        " ".join(f"w{i}" for i in range(10)),
        " ".join(f"w{i}" for i in range(10, 20)),
        "w20 w21 w22. Tail here.",
    ]
    check_invariants(chunks, words, 10)


def test_word_longer_than_budget_split_at_characters() -> None:
    blob = "QUJD" * 50  # 200 characters, e.g. a base64 blob
    chunks = chunk_markdown(f"see {blob} end", len, 64)
    assert all(c.token_count <= 64 and not c.oversized for c in chunks)
    assert "".join(c.text for c in chunks).replace(" ", "") == f"see{blob}end"
    check_invariants(chunks, len, 64)


def test_single_character_over_budget_is_oversized_prose() -> None:
    def cost(text: str) -> int:
        return 2 + len(text)  # like a tokenizer adding [CLS]/[SEP]

    chunks = chunk_markdown("ab", cost, 2)
    assert [(c.text, c.kind, c.oversized) for c in chunks] == [
        ("a", "prose", True),
        ("b", "prose", True),
    ]


def test_counter_with_overhead_respected() -> None:
    def cost(text: str) -> int:
        return 2 + len(text.split())

    body = "\n\n".join(" ".join(f"p{p}w{i}" for i in range(7)) for p in range(5))
    chunks = chunk_markdown(body, cost, 12)
    assert all(c.token_count <= 12 for c in chunks)
    assert " ".join(c.text for c in chunks).split() == body.split()
    check_invariants(chunks, cost, 12)


def test_count_tokens_calls_are_logarithmic_not_per_word() -> None:
    calls = 0

    def counting(text: str) -> int:
        nonlocal calls
        calls += 1
        return len(text.split())

    paragraph = " ".join(f"w{i}" for i in range(20_000))  # no sentence boundaries at all
    chunks = chunk_markdown(paragraph, counting, 500)
    assert len(chunks) == 40
    assert all(c.token_count == 500 for c in chunks)
    assert calls < 40 * 30


def test_deterministic() -> None:
    body = f"# A\n\n{'word ' * 120}\n\n{TABLE}\n\n## B\n\n```\ncode\n```\n"
    assert chunk(body, 17) == chunk(body, 17)


def test_chunk_is_frozen() -> None:
    c = chunk("text")[0]
    with pytest.raises(AttributeError):
        c.text = "other"  # type: ignore[misc]


def test_crlf_body_handled_by_chunker() -> None:
    chunks = chunk("# A\r\n\r\n```\r\n# x\r\n```\r\n\r\ntext\r\n")
    assert [(c.section, c.kind, c.text) for c in chunks] == [
        ("A", "code", "```\n# x\n```"),
        ("A", "prose", "text"),
    ]


def test_end_to_end_realistic_document() -> None:
    data = (
        b"---\r\ntitle: Alerting guide\r\npermissions: [role:operator]\r\n---\r\n"
        b"# Alerts\r\n\r\nAlerts fire when a metric crosses a threshold.\r\n\r\n"
        b"## Thresholds\r\n\r\n| metric | value |\r\n|---|---|\r\n| cpu | 90 |\r\n\r\n"
        b"### Cooldown\r\n\r\nAfter firing, an alert waits.\r\n\r\n"
        b"```yaml\r\n# cooldown in seconds\r\ncooldown: 300\r\n```\r\n\r\n"
        b"## Channels\r\n\r\nEmail and SMS are supported.\r\n"
    )
    parsed = parse_source(decode_source(data, "alerts.md"), "alerts.md")
    assert parsed.title == "Alerting guide"
    assert parsed.permissions == ["role:operator"]
    chunks = chunk_markdown(parsed.body, words, 64)
    assert [(c.ordinal, c.section, c.kind) for c in chunks] == [
        (0, "Alerts", "prose"),
        (1, "Alerts > Thresholds", "table"),
        (2, "Alerts > Thresholds > Cooldown", "prose"),
        (3, "Alerts > Thresholds > Cooldown", "code"),
        (4, "Alerts > Channels", "prose"),
    ]
    assert chunks[3].text == "```yaml\n# cooldown in seconds\ncooldown: 300\n```"


# --------------------------------------------------------------------------- property test


@dataclass(frozen=True)
class Element:
    kind: str  # "heading", "prose", "code", "table", "blank"
    text: str
    level: int = 0
    heading: str = ""


WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123", min_size=1, max_size=7)


@st.composite
def sentences(draw: st.DrawFn) -> str:
    ws = draw(st.lists(WORD, min_size=1, max_size=14))
    return " ".join(ws) + draw(st.sampled_from([".", "!", "?", "", ","]))


@st.composite
def paragraphs(draw: st.DrawFn) -> Element:
    parts = draw(st.lists(sentences(), min_size=1, max_size=8))
    style = draw(st.sampled_from(["flow", "wrapped", "list", "numbered"]))
    if style == "flow":
        text = " ".join(parts)
    elif style == "wrapped":
        text = "\n".join(parts)
    elif style == "list":
        text = "\n".join(f"- {p}" for p in parts)
    else:
        text = "\n".join(f"{i + 1}. {p}" for i, p in enumerate(parts))
    return Element("prose", text)


@st.composite
def headings(draw: st.DrawFn) -> Element:
    level = draw(st.integers(min_value=1, max_value=6))
    name = " ".join(draw(st.lists(WORD, min_size=1, max_size=3)))
    closing = draw(st.sampled_from(["", " #", " " + "#" * level]))
    return Element("heading", "#" * level + " " + name + closing, level=level, heading=name)


FENCE_LINES = st.one_of(
    st.sampled_from(
        [
            "# comment",
            "## Not a heading",
            "###### nor this",
            "| a | b |",
            "|---|---|",
            "- item",
            "",
            "   ",
            "x = 1  # trailing",
            "---",
        ]
    ),
    st.lists(WORD, min_size=1, max_size=6).map(" ".join),
)


@st.composite
def fences(draw: st.DrawFn, closed: bool = True) -> Element:
    marker = draw(st.sampled_from(["```", "~~~", "````", "~~~~~"]))
    info = draw(st.sampled_from(["", "python", " bash", "yaml title=x.yaml"]))
    lines = draw(st.lists(FENCE_LINES, max_size=12))
    if len(marker) > 3:
        lines.append(marker[0] * 3)  # a shorter fence line does not close it
    lines.append("~~~" if marker[0] == "`" else "```")  # other character does not close it
    body = [marker + info, *lines]
    if closed:
        body.append(marker)
    else:
        while body and not body[-1].strip():
            body.pop()
    return Element("code", "\n".join(body))


@st.composite
def tables(draw: st.DrawFn) -> Element:
    ncols = draw(st.integers(min_value=1, max_value=4))
    nrows = draw(st.integers(min_value=1, max_value=6))
    rows = [draw(st.lists(WORD, min_size=ncols, max_size=ncols)) for _ in range(nrows)]
    style = draw(st.sampled_from(["piped", "piped-no-delimiter", "bare"]))
    if style == "bare" and ncols == 1:
        style = "piped"
    delimiter = ["---"] * ncols
    if style == "piped":
        lines = ["| " + " | ".join(r) + " |" for r in [rows[0], delimiter, *rows[1:]]]
    elif style == "piped-no-delimiter":
        lines = ["| " + " | ".join(r) + " |" for r in rows]
    else:
        lines = [" | ".join(r) for r in [rows[0], delimiter, *rows[1:]]]
    return Element("table", "\n".join(lines))


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, list[Element]]:
    elements = draw(
        st.lists(
            st.one_of(paragraphs(), headings(), fences(), tables(), st.just(Element("blank", ""))),
            max_size=25,
        )
    )
    if draw(st.booleans()):
        elements.append(draw(fences(closed=False)))
    pieces: list[str] = []
    for element in elements:
        if pieces:
            # A single newline is enough before headings, fences and tables (they interrupt
            # a paragraph). Adjacent paragraphs, or adjacent tables, may then merge; the
            # checks below hold either way.
            pieces.append(draw(st.sampled_from(["\n", "\n\n", "\n  \n", "\n\n\n"])))
        pieces.append(element.text)
    return "".join(pieces), elements


def expected_words(elements: list[Element]) -> list[tuple[str, str]]:
    stack: list[tuple[int, str]] = []
    section = ""
    out: list[tuple[str, str]] = []
    for element in elements:
        if element.kind == "heading":
            while stack and stack[-1][0] >= element.level:
                stack.pop()
            stack.append((element.level, element.heading))
            section = " > ".join(name for _, name in stack)
        else:
            out.extend((word, section) for word in element.text.split())
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents(), max_tokens=st.integers(min_value=1, max_value=40))
def test_property_nothing_lost_sections_right_blocks_whole(
    doc: tuple[str, list[Element]], max_tokens: int
) -> None:
    body, elements = doc
    chunks = chunk_markdown(body, words, max_tokens)

    # Every word of every non-heading line, in order, in a chunk of the right section.
    actual = [(word, c.section) for c in chunks for word in c.text.split()]
    assert actual == expected_words(elements)

    check_invariants(chunks, words, max_tokens)
    for c in chunks:
        if c.kind == "prose":
            assert not c.oversized  # whitespace tokens: every single word fits
        else:
            assert c.token_count <= max_tokens or c.oversized

    # Fences are whole chunks of kind "code"; tables are whole within one table chunk.
    for element in elements:
        if element.kind == "code":
            assert any(c.kind == "code" and c.text == element.text for c in chunks)
        elif element.kind == "table":
            assert any(c.kind == "table" and element.text in c.text for c in chunks)

    # Same input, same output.
    assert chunk_markdown(body, words, max_tokens) == chunks


@settings(max_examples=100, deadline=None)
@given(doc=documents(), max_tokens=st.integers(min_value=4, max_value=30))
def test_property_front_matter_round_trip(doc: tuple[str, list[Element]], max_tokens: int) -> None:
    body, _ = doc
    text = "---\ntitle: Doc\npermissions: [role:admin]\n---\n" + body
    data = text.replace("\n", "\r\n").encode()
    parsed = parse_source(decode_source(data, "p.md"), "p.md")
    assert parsed.title == "Doc"
    assert parsed.permissions == ["role:admin"]
    assert parsed.body == body
    assert chunk_markdown(parsed.body, words, max_tokens) == chunk_markdown(body, words, max_tokens)
