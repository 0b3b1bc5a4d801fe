"""Grounding: every figure, id and room designator in an answer must come from this run's
evidence (issue 14 item 4, "no invented figures").

Plain Python, no I/O. :func:`extract_claims` finds the checkable claims in an answer;
:func:`build_evidence` indexes what the run saw (tool results as JSON text, cited/retrieved
chunk text, tool-call arguments, the user's own question); :func:`ungrounded` lists the claims
the evidence does not support, as the answer wrote them (``"23.5 °C"``).

What is a claim (both sides are normalised the same way: NFKC, typographic dashes and minus
signs to ``-``):

* **numbers**, with an optional unit. ``1,200`` = ``1200``; ``21.0`` = ``21``; a range
  ``20-25`` is two numbers; the sign is ignored (``-1`` floor = ``1``). A number is grounded
  when some evidence number rounds to it at the precision written (``21`` from ``21.37``,
  ``21.4`` from ``21.37``, but not ``21.5`` from ``21``). A **reading** (a number with a
  measurement unit: ``°C``, ``%RH``, ``ppm``, ``lux``, ``dB``, energy, or ``people``) needs a
  number the evidence states as a value: a JSON number, or a number in plain text, but not
  the digits of a timestamp, an id or a list's length ("0.00 ppm" is not grounded by
  ``10:00:00``, by an empty sensor list, or "80 people" by "80% of capacity"). A
  percentage may also come from a fraction (``85%`` from ``0.85``); a duration may come in
  another time unit (``15 minutes`` from ``900``). Units are otherwise not compared: the
  check catches invented numbers, not a real number under the wrong unit.
* **times and dates**: ``14:05``, ``2 pm``, ``2025-03-04`` must be an instant or clock time in
  the evidence (ISO timestamps in tool results count as their date, ``HH:MM`` and
  ``HH:MM:SS``); a whole hour (``3 am``) is also grounded by the bare number.
* **versions**: ``version 1.0``, ``firmware 2.3.1`` must appear as that string.
* **ids**: entity ids (opaque, so by shape: lower-case words joined by two or more hyphens, or
  with a digit, no part a word of prose) and upper-case codes and keys (``E-1033``,
  ``PL-10``, ``STALE_AFTER_SECONDS``), matched as whole tokens,
  case-insensitively. Their digits are never read as numbers; nor are those of words such as
  ``CO2`` or ``v1``.
* **room designators**: ``Dock C``, ``Ward 12B``, ``12A`` (any capitalised noun and a
  designator with a letter) must
  appear in the evidence; so must any of ``known_names`` (names the caller may see, when the
  service knows them) that the answer mentions.

Deliberately not claims (false positives would turn correct answers into IDK): citation
markers (``[^id]``, ``[1]``, ``[chunk:...]``), list numbering (``1.``, ``2)``), URLs, number
words (``four rooms``), ordinary hyphenated or snake_case words (``door-counter``,
``sensor_type``) and free-form names (an invented "Harbor Annex" is not caught). Evidence is
read generously: every digit run in it counts (so a number inside an id or a date counts),
list lengths count (a model may count the rooms it was given), and the question's own
figures count (the user may quote them back; they are the user's, not readings). Figures the
model derives (a sum, a difference) are flagged unless the evidence holds them.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
import unicodedata
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from agent.words import content_words

__all__ = [
    "Claim",
    "Evidence",
    "build_evidence",
    "extract_claims",
    "normalize",
    "ungrounded",
    "unsupported_states",
]

ClaimKind = Literal["number", "time", "id", "name"]

_DASHES = dict.fromkeys(map(ord, "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe63\uff0d"), "-")
_HALF = Decimal("0.5")

# Units after a number (optional space or hyphen between): canonical name per spelling.
_UNIT_SPELLINGS: dict[str, str] = {
    "°c": "°C", "° c": "°C", "degrees celsius": "°C", "degrees": "°C", "celsius": "°C",
    "%rh": "%RH", "% rh": "%RH", "rh": "%RH", "%": "%", "percent": "%", "per cent": "%",
    "ppm": "ppm", "people": "people", "persons": "people", "person": "people",
    "occupants": "people", "visitors": "people", "entries": "entries", "seats": "seats",
    "ms": "ms", "milliseconds": "ms", "millisecond": "ms",
    "seconds": "s", "second": "s", "secs": "s", "sec": "s", "s": "s",
    "minutes": "min", "minute": "min", "mins": "min", "min": "min", "m": "min",
    "hours": "h", "hour": "h", "hrs": "h", "hr": "h", "h": "h",
    "days": "d", "day": "d", "d": "d", "weeks": "week", "week": "week",
    "kwh": "kWh", "kw": "kW", "w": "W", "lux": "lux", "db": "dB", "dba": "dB",
    "m2": "m²", "sq m": "m²", "sqm": "m²", "square metres": "m²", "square meters": "m²",
    "square metre": "m²", "square meter": "m²", "ft2": "ft²", "sq ft": "ft²",
    "square feet": "ft²", "square foot": "ft²",
}  # fmt: skip
_SECONDS: dict[str, Decimal] = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "min": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
    "week": Decimal(604800),
}
_UNIT = "|".join(
    re.escape(s).replace(r"\ ", r"\s?") for s in sorted(_UNIT_SPELLINGS, key=len, reverse=True)
)
_ORDINAL = re.compile(r"(?:st|nd|rd|th)", re.I)
# Units of what sensors and counters measure: such a figure is a reading, never a digit run.
_MEASURED = frozenset({"°C", "%RH", "ppm", "lux", "dB", "kWh", "kW", "W", "people"})

_MARKERS = re.compile(
    r"\[\^[^\]\s]*\]|\[\d{1,3}(?:\s*,\s*\d{1,3})*\]|\[(?:chunk|source|doc)[:\s][^\]]*\]"
    r"|【[^】]*】|https?://\S+",
    re.I,
)
_LIST_NUMBER = re.compile(r"^[ \t>]*(?:#+[ \t]*)?\(?\d{1,2}[.)](?=\s)", re.M)
_INLINE_ENUM = re.compile(r"(?<![\w.,])\(?\d{1,2}\)(?=\s)")
_DATETIME = re.compile(
    r"(?<![\w-])(\d{4}-\d{2}-\d{2})"
    r"(?:[T ](\d{2}:\d{2}(?::\d{2})?)(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)?(?![\w-])"
)
_CLOCK = re.compile(
    r"(?<![\w:.])(\d{1,2}):(\d{2})(?::(\d{2}))?(?:\s?([ap])\.?m\b\.?)?(?![\w:])", re.I
)
_HOUR_AMPM = re.compile(r"(?<![\w:.])(\d{1,2})\s?([ap])\.?m\b\.?", re.I)
# A token with a letter first and - or _ inside: an id, a code, a key, or a plain word.
_DASHED = re.compile(r"(?<![\w/.-])[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+)+(?![\w-])")
# CO2, E1033, v1; not an area unit after a number ("40 m2": NFKC of m²)
_ALNUM = re.compile(r"(?<![\w.])(?!(?:m2|ft2)(?![\w]))[A-Za-z]+\d[A-Za-z0-9]*(?![\w])")
# A place's designator: a capitalised noun and a letter, or digits with a letter ("Dock C",
# "Room 12B", "Ward 4a", "Bay C3"): any noun, not an estate's room words.
_DESIGNATOR = re.compile(
    r"\b[A-Z][a-z]{1,20}\s+((?!I\b)[A-Z]|\d{1,4}[A-Za-z]|[A-Z]\d{1,4})(?![\w-])"
)
# Words that make a dashed token prose ("up-to-date", "state-of-the-art"), not an id.
_PROSE_PARTS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "of",
        "to",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "from",
        "up",
        "out",
        "off",
        "over",
        "down",
        "into",
        "per",
        "via",
        "as",
        "is",
        "be",
        "end",
    ]
)
_GLUED = re.compile(r"(?<![\w.,-])(\d+(?:\.\d+)?)([A-Za-z°%]+)(?![\w])")
_NUMBER = re.compile(
    r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?![\w])"
    rf"(?:(?:\s|-)?({_UNIT})(?![A-Za-z]))?",
    re.I,
)
# Evidence side: generous readings of every string.
_EV_DIGITS = re.compile(r"\d+(?:\.\d+)?")
_EV_GROUPED = re.compile(r"(?<!\d)\d{1,3}(?:[, ]\d{3})+(?!\d)")
_EV_DATE = re.compile(r"(?<!\d)(\d{4}-\d{2}-\d{2})")
_EV_CLOCK = re.compile(r"(?<![\d:])(\d{1,2}):(\d{2})(?::(\d{2}))?")
_EV_PERCENT = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?%(?!\s?RH)", re.I)


@dataclass(frozen=True)
class Claim:
    """One checkable statement of an answer.

    ``text`` is how the answer wrote it (what the response reports); ``key`` the normalised
    form looked up for times, ids and names; ``values`` the ``(value, tolerance)``
    alternatives a number may be grounded by (any one is enough)."""

    kind: ClaimKind
    text: str
    key: str = ""
    values: tuple[tuple[Decimal, Decimal], ...] = ()
    reading: bool = False  # a measured figure: only a stated value grounds it
    unit: str | None = field(default=None, compare=False)  # canonical (``_UNIT_SPELLINGS``)
    at: int = field(default=-1, compare=False)  # where the answer writes it


@dataclass(frozen=True)
class Fact:
    """A number the evidence states, with what it is said of: its unit (when written) and
    the words of its JSON field or of the one sentence, table row or list item it is in."""

    value: Decimal
    unit: str | None
    words: frozenset[str]  # content words, units left out (the unit is compared apart)
    field: bool = False  # a JSON field's (``words``: its name's), else a passage's
    counted: bool = False  # a list's length (the model may count; it names nothing)


def _within(numbers: tuple[Decimal, ...], value: Decimal, tolerance: Decimal) -> bool:
    i = bisect.bisect_left(numbers, value - tolerance)
    return i < len(numbers) and numbers[i] <= value + tolerance


# "firmware version 1.0", "release 2.3.1": a version is an identifier, grounded only by the
# same string in the evidence, never by a stray digit (the 1.5B invented "version 1.0").
_VERSION = re.compile(
    r"\b(?:firmware(?:\s+version)?|version|release|build)\s+(v?\d+(?:\.\d+)*)\b", re.IGNORECASE
)


@dataclass(frozen=True)
class Evidence:
    """What a run's answer may draw on: numbers (sorted, absolute; ``readings`` the subset
    stated as values), clock times and dates, and the casefolded text (for ids and names)."""

    numbers: tuple[Decimal, ...]
    moments: frozenset[str]
    text: str
    known_names: tuple[str, ...] = ()
    readings: tuple[Decimal, ...] = ()
    facts: tuple[Fact, ...] = ()  # each stated number with what it is said of

    def has_number(self, value: Decimal, tolerance: Decimal) -> bool:
        return _within(self.numbers, value, tolerance)

    def has_token(self, key: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", self.text) is not None

    def grounds(self, claim: Claim) -> bool:
        if claim.kind == "number" and claim.reading:
            return any(_within(self.readings, v, t) for v, t in claim.values)
        if claim.kind == "number":
            return any(self.has_number(v, t) for v, t in claim.values)
        if claim.kind == "time":
            return claim.key in self.moments or any(self.has_number(v, t) for v, t in claim.values)
        return self.has_token(claim.key)


def normalize(text: str) -> str:
    """The one normalisation both sides get: NFKC (``℃`` -> ``°C``, no-break spaces), and
    every dash or minus sign as ``-``."""
    return unicodedata.normalize("NFKC", text).translate(_DASHES)


# --- the answer side ---------------------------------------------------------------------------


def _blank(match: re.Match[str]) -> str:
    return " " * len(match.group(0))


def _number_claim(text: str, digits: str, unit: str | None) -> Claim:
    value = Decimal(digits.replace(",", ""))
    decimals = len(digits.partition(".")[2])
    tolerance = _HALF.scaleb(-decimals)
    values = [(value, tolerance)]
    canonical = _canonical_unit(unit) if unit else None
    if canonical == "%":
        values.append((value / 100, tolerance / 100))
    elif canonical in _SECONDS:
        seconds = _SECONDS[canonical]
        for other in _SECONDS.values():
            if other != seconds:  # the same duration in another time unit
                values.append((value * seconds / other, tolerance * seconds / other))
    return Claim(
        "number",
        " ".join(text.split()),
        values=tuple(values),
        reading=canonical in _MEASURED,
        unit=canonical,
    )


def _clock_claim(text: str, hour: int, minute: int, second: str | None, ampm: str) -> Claim:
    if ampm:
        hour = hour % 12 + (12 if ampm.casefold() == "p" else 0)
    key = f"{hour:02d}:{minute:02d}" + (f":{second}" if second else "")
    # A whole hour is also grounded by its bare number ("reset hour 3" -> "3 am").
    values = ((Decimal(hour), Decimal(0)),) if minute == 0 and not second else ()
    return Claim("time", text.strip(), key=key, values=values)


def _is_checked_id(token: str) -> bool:
    """Entity ids and upper-case codes/keys are claims; ordinary words with a hyphen are not.
    Ids are opaque, so their shape decides, not a prefix: lower-case words joined by two or
    more hyphens, or with a digit ("rm-123-a", a UUID), unless a part is a word of prose
    ("up-to-date")."""
    parts = re.split(r"[-_]", token)
    if token == token.lower() and "-" in token:
        if any(part in _PROSE_PARTS for part in parts):
            return False
        return any(c.isdigit() for c in token) or token.count("-") >= 2
    letters = [c for c in token if c.isalpha()]
    upper = bool(letters) and all(c.isupper() for c in letters)
    return upper and (any(c.isdigit() for c in token) or "_" in token)


class _Scanner:
    """Pulls claims out of an answer pattern by pattern, blanking what each pattern consumed
    so a later pattern never re-reads it (an id's digits are not numbers)."""

    def __init__(self, answer: str, known_names: Iterable[str]) -> None:
        self.text = normalize(answer)
        self.known_names = known_names
        self.found: list[tuple[int, Claim]] = []

    def sub(self, pattern: re.Pattern[str], claim: Any = None) -> None:
        def replace(match: re.Match[str]) -> str:
            found = claim(match) if claim is not None else None
            for item in found if isinstance(found, list) else [found] if found else []:
                self.found.append((match.start(), dataclasses.replace(item, at=match.start())))
            return _blank(match)

        self.text = pattern.sub(replace, self.text)

    def scan(self) -> list[Claim]:
        self.sub(_MARKERS)
        self.sub(_LIST_NUMBER)
        for name in sorted(self.known_names, key=len, reverse=True):
            if len(name.strip()) >= 4:
                pattern = re.compile(rf"(?<!\w){re.escape(normalize(name))}(?!\w)", re.I)
                self.sub(pattern, lambda m: Claim("name", m.group(0), key=m.group(0).casefold()))
        self.sub(_DATETIME, self._datetime)
        self.sub(_CLOCK, self._clock)
        self.sub(_HOUR_AMPM, lambda m: _clock_claim(m.group(0), int(m.group(1)), 0, None, m[2]))
        self.sub(_VERSION, lambda m: Claim("id", m.group(0), key=m.group(1).casefold()))
        self.sub(_DASHED, self._dashed)
        self.sub(_ALNUM)
        self.sub(_DESIGNATOR, self._designator)
        self.sub(_INLINE_ENUM)
        self.sub(_GLUED, self._glued)
        self.sub(_NUMBER, lambda m: _number_claim(m.group(0), m.expand(r"\1.\2").rstrip("."), m[3]))
        return [claim for _, claim in sorted(self.found, key=lambda pair: pair[0])]

    @staticmethod
    def _datetime(match: re.Match[str]) -> list[Claim]:
        claims = [Claim("time", match.group(1), key=match.group(1))]
        if match.group(2):
            claims.append(Claim("time", match.group(2), key=match.group(2)))
        return claims

    @staticmethod
    def _clock(match: re.Match[str]) -> Claim | None:
        hour, minute = int(match.group(1)), int(match.group(2))
        if hour > 24 or minute > 59:
            return None  # a ratio or a score, not a time: left to nobody (rare)
        return _clock_claim(match.group(0), hour, minute, match.group(3), match.group(4) or "")

    @staticmethod
    def _dashed(match: re.Match[str]) -> Claim | None:
        token = match.group(0)
        return Claim("id", token, key=token.casefold()) if _is_checked_id(token) else None

    @staticmethod
    def _designator(match: re.Match[str]) -> Claim:
        return Claim("name", match.group(0), key=" ".join(match.group(0).casefold().split()))

    @staticmethod
    def _glued(match: re.Match[str]) -> Claim | None:
        digits, tail = match.group(1), match.group(2)
        if tail.casefold() in _UNIT_SPELLINGS:
            return _number_claim(match.group(0), digits, tail)
        if _ORDINAL.fullmatch(tail):
            return _number_claim(match.group(0), digits, None)
        if tail.isupper() and len(tail) <= 2:  # a designator such as 12A
            return Claim("id", match.group(0), key=match.group(0).casefold())
        return None  # 2xx, 3D, ...: not checked


def extract_claims(answer: str, *, known_names: Iterable[str] = ()) -> list[Claim]:
    """The checkable claims of ``answer``, in the order the scanner finds them."""
    return _Scanner(answer, known_names).scan()


# --- the evidence side -------------------------------------------------------------------------


@dataclass
class _Index:
    """What ``build_evidence`` collects."""

    strings: list[str] = field(default_factory=list)
    numbers: list[Decimal] = field(default_factory=list)
    readings: list[Decimal] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)


def _key_unit(key: str) -> str | None:
    """The unit a field's name states ("area_m2", "interval_seconds"), if any."""
    last = re.split(r"[_\s-]", key.casefold())[-1]
    return _UNIT_SPELLINGS.get(last) if len(last) > 1 else None


def _walk(value: Any, index: _Index, key: str = "", unit: str | None = None) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float):
        number = abs(Decimal(repr(value)))
        index.numbers.append(number)
        index.readings.append(number)
        index.facts.append(Fact(number, unit or _key_unit(key), _attribute_words(key), True))
    elif isinstance(value, str):
        index.strings.append(value)
    elif isinstance(value, list):
        index.numbers.append(Decimal(len(value)))  # the model may count what it was given
        count = Fact(Decimal(len(value)), None, _attribute_words(key), True, counted=True)
        index.facts.append(count)
        for item in value:
            _walk(item, index, key)
    elif isinstance(value, dict):
        stated = value.get("unit")
        unit_of_value = _canonical_unit(stated) if isinstance(stated, str) else None
        for name, item in value.items():
            _walk(item, index, str(name), unit_of_value if name == "value" else None)


def _stated_numbers(text: str) -> Iterator[Decimal]:
    """The numbers a text states as values: not the digits of its timestamps, clock times,
    ids and codes, citation labels, or percentages ("80% of capacity" grounds "80%", never
    "80 people")."""
    for pattern in (_MARKERS, _DATETIME, _EV_CLOCK, _DASHED, _ALNUM, _EV_PERCENT):
        text = pattern.sub(" ", text)
    yield from _text_numbers(text)


def _text_numbers(text: str) -> Iterator[Decimal]:
    for match in _EV_DIGITS.finditer(text):
        yield Decimal(match.group(0))
        if "." in match.group(0):
            yield from (Decimal(part) for part in match.group(0).split("."))
    for match in _EV_GROUPED.finditer(text):
        yield Decimal(re.sub(r"[, ]", "", match.group(0)))


def _text_moments(text: str) -> Iterator[str]:
    yield from (m.group(1) for m in _EV_DATE.finditer(text))
    for match in _EV_CLOCK.finditer(text):
        hour_minute = f"{int(match.group(1)):02d}:{match.group(2)}"
        yield hour_minute
        if match.group(3):
            yield f"{hour_minute}:{match.group(3)}"
    for match in _HOUR_AMPM.finditer(text):
        yield _clock_claim("", int(match.group(1)), 0, None, match.group(2)).key


def build_evidence(texts: Iterable[str], *, known_names: Iterable[str] = ()) -> Evidence:
    """Index ``texts`` (JSON tool results are read as JSON, anything else as plain text)."""
    index = _Index()
    for text in texts:
        try:
            _walk(json.loads(text), index)
        except ValueError:
            index.strings.append(text)
    strings = [normalize(s) for s in index.strings]
    moments: set[str] = set()
    for string in strings:
        index.numbers.extend(_text_numbers(string))
        index.readings.extend(_stated_numbers(string))
        index.facts.extend(_text_facts(string))
        moments.update(_text_moments(string))
    return Evidence(
        numbers=tuple(sorted(set(index.numbers))),
        moments=frozenset(moments),
        text="\n".join(strings).casefold(),
        known_names=tuple(known_names),
        readings=tuple(sorted(set(index.readings))),
        facts=tuple(index.facts),
    )


def ungrounded(answer: str, evidence: Evidence) -> list[str]:
    """The claims of ``answer`` the evidence does not support, as written, without repeats:
    not in the evidence at all, or a figure the evidence states of something else
    (``misattributed``)."""
    missing: list[str] = []
    for claim in extract_claims(answer, known_names=evidence.known_names):
        wrong = not evidence.grounds(claim) or misattributed(claim, answer, evidence)
        if wrong and claim.text not in missing:
            missing.append(claim.text)
    return missing


# --- attribution: a real figure said of the wrong thing -------------------------------------

# An answer's words around a figure that say what it is of: this many on each side, within
# its sentence.
ATTRIBUTE_WINDOW = 6
# Shared words that make another statement of the evidence the figure's evident source
# when none of the statements holding the figure shares one ("a floor area of 40 m²" when
# 40 is the capacity and the area field says 28.5).
MISATTRIBUTION_OVERLAP = 2
_SEGMENT = re.compile(r"(?<=[.!?;])\s+|\n+")
_UNIT_WORDS = frozenset(w for spelling in _UNIT_SPELLINGS for w in spelling.split())


def _canonical_unit(text: str) -> str | None:
    return _UNIT_SPELLINGS.get(" ".join(normalize(text).casefold().split()))


def _attribute_words(text: str) -> frozenset[str]:
    """The content words of a passage or a field name that say what a figure is of: no
    numbers, no units ("area_m2": area)."""
    words = content_words(re.sub(r"[_\-]", " ", normalize(text)))
    return frozenset(w for w in words if not w.isdigit() and w not in _UNIT_WORDS)


def _text_facts(text: str) -> Iterator[Fact]:
    """Each number of each sentence, table row or list item of ``text``, with that segment's
    words (and the unit written after the number)."""
    for segment in _SEGMENT.split(text):
        plain = segment
        for pattern in (_MARKERS, _DATETIME, _EV_CLOCK, _DASHED, _ALNUM):
            plain = pattern.sub(" ", plain)
        words = _attribute_words(segment)
        for match in _NUMBER.finditer(plain):
            value = Decimal(match.expand(r"\1.\2").rstrip(".").replace(",", ""))
            unit = _canonical_unit(match.group(3)) if match.group(3) else None
            yield Fact(value, unit, words)


# Where what a figure is said of ends: a clause break, or the next figure.
_CLAUSE_BREAK = re.compile(r"[.!?;:,\n]|\b(?:and|but|while|whereas|or)\b|\d", re.IGNORECASE)


def _answer_words(claim: Claim, answer: str) -> frozenset[str]:
    """What the answer says the figure is of: the words of its clause around it (up to the
    next figure or clause break, ``ATTRIBUTE_WINDOW`` on each side)."""
    text = _MARKERS.sub(lambda m: " " * len(m.group(0)), normalize(answer))
    before = text[: claim.at]
    breaks = [m.end() for m in _CLAUSE_BREAK.finditer(before)]
    before = before[breaks[-1] if breaks else 0 :]
    after = text[claim.at + len(claim.text) :]
    found = _CLAUSE_BREAK.search(after)
    after = after[: found.start() if found else len(after)]
    window = [*before.split()[-ATTRIBUTE_WINDOW:], *after.split()[:ATTRIBUTE_WINDOW]]
    return _attribute_words(" ".join(window))


def _holds(fact: Fact, claim: Claim) -> bool:
    """Whether ``fact`` states the claim's figure: the same duration when both say a time
    unit ("2 minutes" is "120 seconds", not "2 seconds"), else the same number."""
    if claim.unit in _SECONDS and fact.unit in _SECONDS:
        value, tolerance = claim.values[0]
        scale = _SECONDS[claim.unit] / _SECONDS[fact.unit]
        return abs(fact.value - value * scale) <= tolerance * scale
    return any(abs(fact.value - value) <= tolerance for value, tolerance in claim.values)


def _same_quantity(a: str | None, b: str | None) -> bool:
    """Whether two units may name the same quantity (either unstated; equal; both times)."""
    return a is None or b is None or a == b or (a in _SECONDS and b in _SECONDS)


def misattributed(claim: Claim, answer: str, evidence: Evidence) -> bool:
    """A figure the evidence holds, but said of something else: every statement holding it
    states another unit ("40 m²" where the evidence has 40 people), or none shares a word
    with what the answer says it is of while a statement of another figure of the same
    quantity shares ``MISATTRIBUTION_OVERLAP`` ("40 m²" of a floor area when 40 is the
    capacity and the area field holds 28.5; "every 30 seconds" of a refresh when 30 s is a
    delay and the refresh sentence says 60). Only figures found as stated facts are
    checked: one grounded otherwise (a fraction, a duration in another unit's digits) is
    left alone."""
    if claim.kind != "number" or claim.at < 0:
        return False
    holding = [fact for fact in evidence.facts if _holds(fact, claim)]
    if not holding:
        return False
    if not any(_same_quantity(claim.unit, fact.unit) for fact in holding):
        return True
    said_of = _answer_words(claim, answer)
    if not said_of or any(fact.words & said_of for fact in holding):
        return False
    return any(
        _said_of(fact, said_of)
        for fact in evidence.facts
        if not fact.counted and not _holds(fact, claim) and _same_quantity(claim.unit, fact.unit)
    )


def _said_of(fact: Fact, said_of: frozenset[str]) -> bool:
    """Whether the answer's words name what ``fact`` is of: all of its field's name, or
    ``MISATTRIBUTION_OVERLAP`` words of its passage."""
    if fact.field:
        return bool(fact.words) and fact.words <= said_of
    return len(fact.words & said_of) >= MISATTRIBUTION_OVERLAP


# --- statements about live state and about the past -----------------------------------------

# What a run's tools settle (``ToolSpec.answers``) that a statement of the present rests on,
# and one of the past.
LIVE_ANSWERS = frozenset({"occupancy", "reading", "inventory"})
PAST_ANSWERS = frozenset({"history"})
# A state said of a place or a sensor: a predicate, not a time adverb alone ("live data is
# unavailable right now" is about the service; "it is above the limit" is about the room).
_STATES = "busy|empty|full|crowded|quiet|occupied|online|offline|above|below"
_LIVE_STATE = re.compile(
    rf"\b(?:(?:is|are) (?:now |currently )?(?:{_STATES})|exceed(?:s|ing)?"
    r"|(?:is|are) (?:installed|reporting))\b",
    re.IGNORECASE,
)
_PAST_STATE = re.compile(
    rf"\b(?:yesterday|last (?:night|week|month)|earlier today|this morning"
    rf"|\d+ (?:hours?|days?) ago|(?:was|were) (?:{_STATES}))\b",
    re.IGNORECASE,
)


def unsupported_states(answer: str, settled: Collection[str]) -> list[str]:
    """The statements of live state ("is above the limit", "right now") and of the past
    ("yesterday", "was busy") in ``answer`` that no result of this turn settles: ``settled``
    holds what its successful tool calls answer (``ToolSpec.answers``): a reading, the
    occupancy or the inventory for the present, a history for the past. As written."""
    text = normalize(answer)
    found: list[str] = []
    for pattern, needs in ((_LIVE_STATE, LIVE_ANSWERS), (_PAST_STATE, PAST_ANSWERS)):
        if needs.isdisjoint(settled):
            found.extend(m.group(0) for m in pattern.finditer(text) if m.group(0) not in found)
    return found
