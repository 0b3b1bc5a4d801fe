"""The judge's prompt holds nothing copied from the agent (issue 42, build item 1).

A judge whose worked examples repeat the agent's own sentences learns to pass the agent's
wording rather than to read the rubric. This reads every file under agent/ as data (nobody
writing the judge reads them) and fails when a run of ``RUN`` words of the judge's prompt
(system prompt with its worked examples, the declined/answered rubrics, the user prompt's
frame) appears in one of them. A sentence of at least ``RUN`` words holds such a run, so no
such sentence of the prompt appears under agent/ either. Words are compared case-folded,
punctuation and line breaks ignored (a Python string split over two lines still matches).
"""

from __future__ import annotations

import re
from pathlib import Path

from evals import judge

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent"
RUN = 6
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    return _WORD.findall(text.casefold().replace("\u2019", "'"))


def judge_prompt() -> str:
    """Everything the judge sends but the row's own question, answer and rubric."""
    return "\n\n".join(
        (
            judge.SYSTEM_PROMPT + judge._calibration(),
            judge.DECLINED_RUBRIC,
            judge.ANSWERED_RUBRIC,
            judge._user_prompt("{question}", "{answer}", "{rubric}"),
        )
    )


def sentences(text: str) -> list[str]:
    """The prompt's sentences: split at sentence ends and at the worked examples' labels."""
    flat = " ".join(text.split())
    parts = re.split(r"(?<=[.!?])\s+|\b(?:Question|Answer|Rubric|Verdict|Examples):\s*", flat)
    return [part for part in parts if part.strip()]


def agent_texts() -> dict[str, str]:
    texts: dict[str, str] = {}
    for path in sorted(AGENT.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            body = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts[str(path.relative_to(ROOT))] = " " + " ".join(words(body)) + " "
    return texts


def shared_runs(text: str, corpus: dict[str, str], run: int = RUN) -> list[tuple[str, str]]:
    """(run of ``run`` words of ``text``, file of ``corpus`` holding it), each run once."""
    tokens = words(text)
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for start in range(len(tokens) - run + 1):
        phrase = " ".join(tokens[start : start + run])
        if phrase in seen:
            continue
        seen.add(phrase)
        found += [(phrase, name) for name, body in corpus.items() if f" {phrase} " in body]
    return found


def test_no_run_of_six_words_of_the_judge_prompt_is_in_agent() -> None:
    corpus = agent_texts()
    assert len(corpus) > 10  # the agent's files were read
    shared = shared_runs(judge_prompt(), corpus)
    where = [
        f"{name}: {phrase!r} (in the judge's {sentence!r})"
        for phrase, name in shared
        for sentence in sentences(judge_prompt())
        if f" {phrase} " in f" {' '.join(words(sentence))} "
    ] or [f"{name}: {phrase!r}" for phrase, name in shared]
    assert not shared, (
        "the judge's prompt repeats the agent's text; rewrite its examples from another "
        "domain in your own words (evals/judge.py CALIBRATION):\n" + "\n".join(where)
    )


def test_no_sentence_of_the_judge_prompt_is_in_agent() -> None:
    corpus = agent_texts()
    long_ones = [s for s in sentences(judge_prompt()) if len(words(s)) >= RUN]
    assert len(long_ones) >= 10  # the examples and the instructions are there
    copied = [
        (s, name)
        for s in long_ones
        for name, body in corpus.items()
        if f" {' '.join(words(s))} " in body
    ]
    assert not copied, copied


def test_the_check_finds_a_copied_sentence() -> None:
    corpus = {
        "agent/x.py": " "
        + " ".join(words('MSG = ("The gauge is not\n "\n "fitted, so no reading exists.")'))
        + " "
    }
    assert shared_runs("Answer: The gauge is NOT fitted, so no reading.", corpus) == [
        ("the gauge is not fitted so", "agent/x.py"),
        ("gauge is not fitted so no", "agent/x.py"),
        ("is not fitted so no reading", "agent/x.py"),
    ]
    assert shared_runs("The gauge is missing, so no reading exists.", corpus) == []
