"""Line-number tables of code objects, decoded without the interpreter that wrote them.

Two formats exist in the supported versions:

* 3.10: pairs of bytes (unsigned byte-offset delta, signed line delta); a line delta of -128
  means "no line" for that range.  Offsets are in bytes (2 per instruction).
* 3.11+: location entries.  Each starts with a byte whose high bit is set; bits 3-6 give the
  kind, bits 0-2 the number of code units covered minus one.  Continuation bytes never have the
  high bit set.
"""

from __future__ import annotations

from collections.abc import Iterator

NO_LINE_310 = -128


def iter_ranges_310(table: bytes, firstlineno: int) -> Iterator[tuple[int, int, int | None]]:
    """(start byte, end byte, line or None) for every non-empty range of a 3.10 table."""
    line = firstlineno
    end = 0
    for i in range(0, len(table) - 1, 2):
        start = end
        end += table[i]
        delta = table[i + 1] - 256 if table[i + 1] >= 128 else table[i + 1]
        if delta == NO_LINE_310:
            current = None
        else:
            # The running line advances even over empty ranges.
            line += delta
            current = line
        if end > start:
            yield start, end, current


def line_310(table: bytes, firstlineno: int, lasti: int) -> int | None:
    """Line of the instruction at index ``lasti`` (3.10 ``f_lasti``, code units)."""
    if lasti < 0:
        # Frames that have not started executing report their first line.
        return firstlineno
    offset = 2 * lasti
    for start, end, line in iter_ranges_310(table, firstlineno):
        if start <= offset < end:
            return line
    return None


def _varint(table: bytes, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        b = table[pos]
        pos += 1
        value |= (b & 0x3F) << shift
        shift += 6
        if not b & 0x40:
            return value, pos


def _svarint(table: bytes, pos: int) -> tuple[int, int]:
    value, pos = _varint(table, pos)
    return (-(value >> 1) if value & 1 else value >> 1), pos


Position = tuple[int | None, int | None, int | None, int | None]


def iter_entries_311(table: bytes, firstlineno: int) -> Iterator[tuple[int, int, Position]]:
    """(start unit, end unit, (line, end line, column, end column)) for each location entry."""
    line = firstlineno
    unit = 0
    pos = 0
    n = len(table)
    while pos < n:
        first = table[pos]
        pos += 1
        if not first & 0x80:
            raise ValueError(f"corrupt location table at byte {pos - 1}")
        kind = (first >> 3) & 15
        length = (first & 7) + 1
        position: Position
        if kind == 15:
            position = (None, None, None, None)
        elif kind == 14:
            delta, pos = _svarint(table, pos)
            line += delta
            end_delta, pos = _varint(table, pos)
            col, pos = _varint(table, pos)
            end_col, pos = _varint(table, pos)
            position = (line, line + end_delta, col - 1 if col else None,
                        end_col - 1 if end_col else None)  # fmt: skip
        elif kind == 13:
            delta, pos = _svarint(table, pos)
            line += delta
            position = (line, line, None, None)
        elif kind >= 10:
            line += kind - 10
            col, end_col = table[pos], table[pos + 1]
            pos += 2
            position = (line, line, col, end_col)
        else:
            second = table[pos]
            pos += 1
            col = kind * 8 + (second >> 4)
            position = (line, line, col, col + (second & 15))
        yield unit, unit + length, position
        unit += length


def line_311(table: bytes, firstlineno: int, index: int) -> int | None:
    """Line of the code unit at ``index`` (3.11+; inline caches share their instruction's)."""
    if index < 0:
        return firstlineno
    for start, end, position in iter_entries_311(table, firstlineno):
        if start <= index < end:
            return position[0]
        if start > index:
            break
    return None


def line_for(version: tuple[int, int], table: bytes, firstlineno: int, index: int) -> int | None:
    if version >= (3, 11):
        return line_311(table, firstlineno, index)
    return line_310(table, firstlineno, index)
