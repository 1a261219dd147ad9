"""Errors that cross the line between the engine side and the runner side.

They live here, with the messages, so that the executor can name what a
worker raises without importing the runner.
"""

from __future__ import annotations


class InvalidPlanError(ValueError):
    """The plan contradicts the runner's state; nothing was applied."""
