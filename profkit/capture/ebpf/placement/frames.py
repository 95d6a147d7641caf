"""The address range of every function an unwind table describes: each FDE's start and length
in .eh_frame (the one every shared library keeps, static functions included) or .debug_frame
(unstripped builds). Only the ranges are read; the unwinding instructions are skipped.

The formats (the DWARF standard's call-frame information, and the LSB's .eh_frame on it):
records of a length (4 bytes, or 0xffffffff then 8), then either a CIE, which says how its FDEs
encode their addresses, or an FDE, which points back at its CIE and holds the function's start
and length. .eh_frame encodes addresses as the CIE's 'R' augmentation says (mostly 4 bytes
relative to where they lie); .debug_frame holds them as absolute 8-byte values.
"""

from __future__ import annotations

import struct

# DW_EH_PE_*: the value's format in the low nibble, what it is relative to in the next one.
OMIT = 0xFF
ABSPTR, ULEB128, UDATA2, UDATA4, UDATA8 = 0x00, 0x01, 0x02, 0x03, 0x04
SLEB128, SDATA2, SDATA4, SDATA8 = 0x09, 0x0A, 0x0B, 0x0C
PCREL, DATAREL = 0x10, 0x30
_FIXED = {
    ABSPTR: "<Q",
    UDATA2: "<H",
    UDATA4: "<I",
    UDATA8: "<Q",
    SDATA2: "<h",
    SDATA4: "<i",
    SDATA8: "<q",
}
# More records than this in one table is not a real library's.
MAX_RECORDS = 1 << 20


def _uleb(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at
        if shift > 63:
            raise ValueError("a LEB128 number longer than 64 bits")


def _sleb(data: bytes, at: int) -> tuple[int, int]:
    value, end = _uleb(data, at)
    bits = 7 * (end - at)
    if value & (1 << (bits - 1)):
        value -= 1 << bits
    return value, end


def _encoded(data: bytes, at: int, encoding: int, base: int) -> tuple[int, int]:
    """A value in the given pointer encoding, and where the next field starts; base is the
    section's address, for values relative to where they lie."""
    form = encoding & 0x0F
    if form == ULEB128:
        value, end = _uleb(data, at)
    elif form == SLEB128:
        value, end = _sleb(data, at)
    elif form in _FIXED:
        layout = _FIXED[form]
        (value,) = struct.unpack_from(layout, data, at)
        end = at + struct.calcsize(layout)
    else:
        raise ValueError(f"pointer encoding {encoding:#x}")
    if encoding & 0x70 == PCREL:
        value += base + at
    elif encoding & 0x70 not in (0, DATAREL):
        raise ValueError(f"pointer encoding {encoding:#x}")
    return value & ((1 << 64) - 1), end


def _cie_encoding(data: bytes, at: int, end: int, base: int) -> int:
    """The FDE pointer encoding a CIE (its body from `at`) gives its FDEs."""
    version = data[at]
    at += 1
    augmentation_end = data.index(b"\0", at, end)
    augmentation = data[at:augmentation_end].decode("ascii", errors="replace")
    at = augmentation_end + 1
    if "eh" in augmentation:
        at += 8
    _, at = _uleb(data, at)  # code alignment
    _, at = _sleb(data, at)  # data alignment
    at = at + 1 if version == 1 else _uleb(data, at)[1]  # return address register
    encoding = ABSPTR
    if augmentation.startswith("z"):
        _, at = _uleb(data, at)  # the augmentation data's length
        for letter in augmentation[1:]:
            if letter == "R":
                encoding = data[at]
                at += 1
            elif letter == "P":
                personality = data[at]
                _, at = _encoded(data, at + 1, personality, base)
            elif letter == "L":
                at += 1
            elif letter not in "SB":
                break  # an augmentation not known: what follows cannot be read
    return encoding


def fde_ranges(data: bytes, base: int, eh_frame: bool) -> list[tuple[int, int]]:
    """(start, end) of every FDE of the table; base: the section's address. ValueError (or
    IndexError, struct.error) where the table is malformed."""
    ranges = []
    encodings: dict[int, int] = {}
    at = 0
    for _ in range(MAX_RECORDS):
        if at + 4 > len(data):
            break
        (length,) = struct.unpack_from("<I", data, at)
        if length == 0:
            if eh_frame:
                break  # the terminator
            at += 4
            continue
        header = 4
        if length == 0xFFFFFFFF:
            (length,) = struct.unpack_from("<Q", data, at + 4)
            header = 12
        body = at + header
        end = body + length
        if end > len(data):
            raise ValueError("a record past the end of the table")
        wide = header == 12
        cie_field = struct.unpack_from("<Q" if wide else "<I", data, body)[0]
        id_size = 8 if wide else 4
        is_cie = cie_field == 0 if eh_frame else cie_field == (1 << (8 * id_size)) - 1
        if is_cie:
            encodings[at] = _cie_encoding(data, body + id_size, end, base)
        else:
            cie = body - cie_field if eh_frame else cie_field
            encoding = encodings.get(cie)
            if encoding is None:
                encoding = _cie_of(data, cie, base, eh_frame, encodings)
            if encoding == OMIT:
                at = end
                continue
            start, field = _encoded(data, body + id_size, encoding if eh_frame else UDATA8, base)
            size, _ = _encoded(data, field, (encoding & 0x0F) if eh_frame else UDATA8, base)
            if size:
                ranges.append((start, start + size))
        at = end
    else:
        raise ValueError(f"more than {MAX_RECORDS} records")
    return ranges


def _cie_of(data: bytes, at: int, base: int, eh_frame: bool, known: dict[int, int]) -> int:
    """The encoding of the CIE at `at`, read where an FDE names one not yet seen."""
    if not 0 <= at < len(data) - 4:
        raise ValueError("an FDE names a CIE outside the table")
    (length,) = struct.unpack_from("<I", data, at)
    header, id_size = (12, 8) if length == 0xFFFFFFFF else (4, 4)
    if length == 0xFFFFFFFF:
        (length,) = struct.unpack_from("<Q", data, at + 4)
    body = at + header
    known[at] = _cie_encoding(data, body + id_size, body + length, base)
    return known[at]
