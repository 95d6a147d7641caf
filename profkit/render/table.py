"""Plain-text tables that stay readable in 80 columns and in logs (no colour, no box drawing)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    max_widths: Sequence[int] | None = None,
    wrap_last: int = 0,
) -> str:
    """Columns padded to their widest cell; `max_widths` truncates, `wrap_last` wraps the last."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if max_widths:
        widths = [min(w, m) if m else w for w, m in zip(widths, max_widths, strict=False)]
    if wrap_last:
        widths[-1] = min(widths[-1], wrap_last)
    indent = " " * (sum(widths[:-1]) + 2 * (len(widths) - 1))
    lines = []
    for index, row in enumerate(cells):
        parts = [_fit(cell, width) for cell, width in zip(row[:-1], widths, strict=False)]
        last = textwrap.wrap(row[-1], widths[-1]) if wrap_last and row[-1] else [row[-1]]
        lines.append(
            "  ".join([*parts, _fit(last[0], widths[-1]) if not wrap_last else last[0]]).rstrip()
        )
        lines.extend(indent + more for more in last[1:])
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fit(cell: str, width: int) -> str:
    if len(cell) > width:
        return cell[: max(1, width - 1)] + "…"
    return cell.ljust(width)
