"""A scrolling list of one-line Texts that builds and renders only the lines on screen.

Textual's Line API (ScrollView.render_line): a panel with 128 host sparklines or 300 log lines
costs what its dozen visible lines cost, and changing the lines repaints without a layout pass
unless their number changed. Lines are produced on demand by a factory, so the ones scrolled out
of view are never even built.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

LineFactory = Callable[[int], Text]


class LinesView(ScrollView):
    DEFAULT_CSS = """
    LinesView {
        height: auto;
        overflow-x: hidden;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._count = 0
        self._factory: LineFactory = lambda index: Text()
        self._strips: dict[int, Strip] = {}

    @property
    def line_count(self) -> int:
        return self._count

    def set_lines(self, count: int, factory: LineFactory, *, follow: bool = False) -> None:
        """Show `count` lines, line i being factory(i). follow: stay at the end if already there."""
        at_end = self.scroll_y >= self.max_scroll_y
        self._count = count
        self._factory = factory
        self._strips.clear()
        # Same number of lines: a repaint; a different number: the panel's height may change.
        self.virtual_size = Size(self.size.width, count)
        self.refresh()
        if follow and at_end:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def line_text(self, index: int) -> Text:
        """The text of line `index` (for tests and for copying)."""
        return self._factory(index)

    def render_line(self, y: int) -> Strip:
        index = self.scroll_offset.y + y
        width = self.size.width
        if index >= self._count:
            return Strip.blank(width, self.rich_style)
        strip = self._strips.get(index)
        if strip is None:
            text = self._factory(index)
            text.truncate(width, overflow="ellipsis")
            segments = list(text.render(self.app.console))
            strip = Strip(segments).apply_style(self.rich_style)
            self._strips[index] = strip
        return strip.crop_extend(0, width, self.rich_style)

    def on_resize(self) -> None:
        self._strips.clear()
        self.virtual_size = Size(self.size.width, self._count)
