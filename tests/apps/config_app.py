"""Tools and plugins referenced by import path from the declarative-config tests."""

from __future__ import annotations

from typing import Any

from agentlog.runtime import AddContext, Plugin, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def echo(text: str) -> str:
    """Echo (a plain function: the loader makes it a tool)."""
    return text


class Motto(Plugin):
    """Adds a fixed line of context to every inference."""

    id = "motto"

    def __init__(self, text: str = "Be brief.") -> None:
        self.text = text

    def before_inference(self, ctx: Any) -> list[Any]:
        return [AddContext(self.text)]


not_a_tool = 42
