"""The fixed sentences the service detects in a model's answer or writes in its place.

A leaf module (no imports): the prompts show them to the model and the json_schema
tool-calling mode turns its ``idk`` step into :data:`IDK_MARKER`.
"""

from __future__ import annotations

# Returned verbatim when the data does not answer the question (and on hop exhaustion).
IDK_MARKER = "I don't know based on the available CrowdVision data."
# Every out-of-scope refusal starts with this; the service detects it in native mode.
REFUSAL_MARKER = "I can only help with CrowdVision"
# What the service answers for a refusal (a json_schema ``decline`` step, OpenAI's refusal).
DECLINE_TEXT = (
    f"{REFUSAL_MARKER}: your buildings and rooms, live occupancy and sensors, "
    "and how the platform works."
)
