"""The consoles every view draws with: colour on a terminal, plain text in a pipe, and in both
no control sequence from the text (clean.py says which). rich lives here and in the views that
build its renderables: `loadwatch analyze --json` and the daemon start without importing it."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO, Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

from loadwatch.exporters.terminal.clean import clean_text
from loadwatch.exporters.terminal.fmt import pipe_width


class CleanConsole(Console):
    """A rich Console whose output holds no control sequence but rich's own.

    Every segment of text any renderable yields is cleaned as it is rendered, so no view, table
    cell or log line is missed; rich's own control segments (the live screen's cursor moves)
    and the colours it renders from styles pass. Markup and emoji codes are off: a string from
    the log such as `[link=...]` is shown as written, never obeyed.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        kwargs.setdefault("emoji", False)
        kwargs.setdefault("highlight", False)
        super().__init__(**kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterator[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and segment.text:
                text = clean_text(segment.text)
                if text != segment.text:
                    segment = Segment(text, segment.style)
            yield segment


def make_console(file: IO[str]) -> Console:
    """Colour on a terminal; plain text, no escape codes, in a pipe."""
    if file.isatty():
        return CleanConsole(file=file)
    return CleanConsole(file=file, force_terminal=False, color_system=None, width=pipe_width())


def plain_text(renderable: RenderableType, width: int) -> str:
    """A renderable as text without colour or the padding rich adds at line ends."""
    console = CleanConsole(
        file=io.StringIO(), width=width, record=True, force_terminal=False, color_system=None
    )
    console.print(renderable)
    return "".join(line.rstrip() + "\n" for line in console.export_text().splitlines())


def show(renderable: RenderableType, file: IO[str]) -> None:
    """Colour on a terminal; plain text in a pipe."""
    if file.isatty():
        make_console(file).print(renderable)
    else:
        file.write(plain_text(renderable, pipe_width()))
        file.flush()
