"""The shared field validator: a JSON integer written ``5.0`` is an integer, nothing else is."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from serve_app.api.fields import integral
from serve_app.api.routes.ask import AskRequest
from serve_app.api.routes.feedback import FeedbackRequest

THREAD = "e3e70682-c209-1cac-a29f-6fbed82c07cd"


@pytest.mark.parametrize(("given", "expected"), [(5.0, 5), (5, 5), (5.5, 5.5), ("5", "5")])
def test_integral_turns_only_whole_floats_into_ints(given: object, expected: object) -> None:
    result = integral(given)
    assert result == expected and type(result) is type(expected)


def test_a_whole_float_is_accepted_for_the_turn_and_top_k_alike() -> None:
    feedback = FeedbackRequest.model_validate(
        {"conversation_id": THREAD, "turn": 3.0, "rating": "up"}
    )
    assert feedback.turn == 3
    assert AskRequest.model_validate({"question": "hi", "top_k": 5.0}).top_k == 5


@pytest.mark.parametrize("turn", [3.5, "3", True, 0])
def test_anything_else_is_still_refused_for_the_turn(turn: object) -> None:
    with pytest.raises(ValidationError):
        FeedbackRequest.model_validate({"conversation_id": THREAD, "turn": turn, "rating": "up"})


def test_the_turn_bounds_reach_the_schema() -> None:
    """Schemathesis generates from the schema: a bound enforced but not published is a 422 for
    a request the schema calls valid."""
    (integer,) = [
        s
        for s in FeedbackRequest.model_json_schema()["properties"]["turn"]["anyOf"]
        if s != {"type": "null"}
    ]
    assert integer["minimum"] == 1 and integer["type"] == "integer"
