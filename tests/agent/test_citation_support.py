from __future__ import annotations

from agent.citation_support import check_support, support
from agent.citations import ChunkInfo
from agent.words import content_words

ERROR_PAGE = ChunkInfo(
    "documentation/developer/error-codes.md",
    "Error codes > CV-E1013 - No occupancy source",
    "`GET /rooms/{roomId}/occupancy` was called for a room that has neither an `occupancy` nor "
    "a `door_counter` sensor. This is no sensor installed, not an outage.",
)
API_PAGE = ChunkInfo(
    "documentation/developer/twin-service-api.md",
    "Twin service API > When the room has no occupancy sensor",
    "If the room has neither an `occupancy` nor a `door_counter` sensor, the endpoint returns "
    "409 with CV-E1013 (no occupancy source), which differs from a stale status.",
)
WEBHOOK_PAGE = ChunkInfo(
    "documentation/developer/webhooks.md",
    "Webhooks > Retries",
    "Failed deliveries are retried with exponential backoff up to WEBHOOK_MAX_RETRIES times.",
)
CHUNKS = {"err": ERROR_PAGE, "api": API_PAGE, "hook": WEBHOOK_PAGE}
QUESTION = "What does error CV-E1013 mean?"
QUOTE = (
    "CV-E1013 means GET /rooms/{roomId}/occupancy was called for a room that has neither an "
    "occupancy nor a door_counter sensor: no sensor installed, not an outage."
)


def test_support_is_the_share_of_claim_words_in_heading_and_text() -> None:
    words = content_words("occupancy source outage")
    assert support(words, ERROR_PAGE) == 1.0
    assert support(words, WEBHOOK_PAGE) == 0.0
    assert support(set(), ERROR_PAGE) == 0.0


def test_a_marker_on_an_unrelated_chunk_gives_way_to_the_supporting_one() -> None:
    check = check_support(f"{QUOTE} [^hook]", QUESTION, CHUNKS)
    assert check.answer == f"{QUOTE} [^err]"
    assert check.dropped == ["hook"] and check.added == ["err"]


def test_a_partly_supporting_marker_stays_and_the_clearly_better_chunk_is_cited_first() -> None:
    check = check_support(f"{QUOTE} [^api]", QUESTION, CHUNKS)
    assert check.answer == f"{QUOTE} [^err] [^api]"
    assert check.added == ["err"] and check.dropped == []


def test_supporting_markers_are_left_alone() -> None:
    answer = f"{QUOTE} [^err]"
    check = check_support(answer, QUESTION, CHUNKS)
    assert check.answer == answer and not check.changed


def test_every_result_cited_for_one_fact_keeps_only_the_ones_that_say_it() -> None:
    check = check_support(f"{QUOTE} [^err] [^hook] [^api]", QUESTION, CHUNKS)
    assert check.answer == f"{QUOTE} [^err] [^api]"
    assert check.dropped == ["hook"]


def test_each_marker_group_is_judged_on_its_own_claim() -> None:
    answer = (
        "It means no occupancy sensor installed, not an outage [^hook]. "
        "Failed deliveries are retried with exponential backoff [^err]."
    )
    check = check_support(answer, QUESTION, CHUNKS)
    assert check.answer == (
        "It means no occupancy sensor installed, not an outage [^err]. "
        "Failed deliveries are retried with exponential backoff [^hook]."
    )


def test_a_claim_no_chunk_supports_keeps_the_models_markers() -> None:
    answer = "Ask your facility manager to reboot the kiosk. [^hook]"
    assert check_support(answer, QUESTION, CHUNKS).answer == answer


def test_unknown_markers_and_answers_without_markers_are_untouched() -> None:
    assert check_support(f"{QUOTE} [^nope]", QUESTION, CHUNKS).answer == f"{QUOTE} [^nope]"
    assert check_support(QUOTE, QUESTION, CHUNKS).answer == QUOTE
    assert check_support(f"{QUOTE} [^err]", QUESTION, {}).answer == f"{QUOTE} [^err]"


def test_a_claim_of_a_few_words_keeps_the_models_markers() -> None:
    """The 1.5B's "The default value of SENSOR_STALE_AFTER_SECONDS is 900 seconds." adds two
    words to its question; the settings table and an API page both hold them (2026-12-03)."""
    table = ChunkInfo("configuration-reference.md", "SENSOR_STALE_AFTER_SECONDS", "Default `900`.")
    api = ChunkInfo("sensor-service-api.md", "GET /latest", "The value is stale after 900 s.")
    answer = "The default value of SENSOR_STALE_AFTER_SECONDS is 900 seconds. [^table]"
    question = "What is the default of SENSOR_STALE_AFTER_SECONDS?"
    assert check_support(answer, question, {"table": table, "api": api}).answer == answer
