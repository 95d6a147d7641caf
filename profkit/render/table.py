"""Plain-text tables that stay readable in 80 columns and in logs (no colour, no box drawing),
laid out by rich: a column as wide as its widest cell, truncated with an ellipsis past its
maximum, the last column wrapped at word boundaries where asked."""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    max_widths: Sequence[int] | None = None,
    wrap_last: int = 0,
) -> str:
    """Columns padded to their widest cell; `max_widths` truncates, `wrap_last` wraps the last."""
    cells = [["" if c is None else str(c) for c in r] for r in rows]
    # in terminal cells: a wide character takes two
    widths = [
        max([cell_len(str(h)), *(cell_len(r[i]) for r in cells)]) for i, h in enumerate(headers)
    ]
    if max_widths:
        widths = [min(w, m) if m else w for w, m in zip(widths, max_widths, strict=False)]
    if wrap_last:
        widths[-1] = min(widths[-1], wrap_last)
    grid = Table(box=None, padding=(0, 1), pad_edge=False, show_header=True, highlight=False)
    for index, (header, width) in enumerate(zip(headers, widths, strict=True)):
        last = index == len(widths) - 1
        grid.add_column(
            str(header),
            width=width,
            no_wrap=not (last and wrap_last),
            overflow="fold" if last and wrap_last else "ellipsis",
        )
    grid.add_row(*("-" * w for w in widths))
    for row in cells:
        grid.add_row(*row)
    out = io.StringIO()
    width = sum(widths) + 2 * (len(widths) - 1)
    Console(
        file=out, width=width, color_system=None, highlight=False, markup=False, emoji=False
    ).print(grid)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())
