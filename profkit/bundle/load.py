"""Reading a bundle that someone else may have made, perhaps to harm whoever reads it.

`report`, `flame`, `export` and `timeline` read bundles other users wrote, as root at times. So
every part is read one way (BundleFiles):

- opened by name beneath the bundle directory, which is held by descriptor, with O_NOFOLLOW (a
  link to /etc/shadow or /dev/zero is refused, not followed) and O_NONBLOCK (a FIFO cannot hang
  the open), and read only if it is a regular file, checked before the open (opening a device
  can act on it) and on what was opened;
- read to a byte bound, MAX_PART_MB: a larger part is refused, not truncated;
- parsed only if its brackets nest at most MAX_DEPTH deep: Python's parser recurses, and a
  100 000-deep part would run it into the recursion limit.

The values the readers take are checked as they take them (Fields): a wrong type, a number that
is not finite, a negative count or an index past its table is a BadBundle naming the part and
the key. A part this user may not read is PermissionDenied (bundles are written 0600).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import numpy as np

from ..errors import BadBundle, PermissionDenied, UsageError
from .names import MAX_TEXT_CHARS, shown
from .parts import MANIFEST, SCHEMA_VERSION

I64 = np.int64
# The default --max-size: no part of a bundle captured within it is larger. A bundle captured
# with a larger --max-size can hold larger parts; PROFKIT_MAX_PART_MB raises the bound for it.
MAX_PART_MB = 256
PART_BOUND_ENV = "PROFKIT_MAX_PART_MB"
# A bundle's JSON nests 6 deep; Python's parser gives up near 1000 (its recursion limit).
MAX_DEPTH = 64

OPEN_PART = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)
# A JSON string, escapes included: its brackets do not nest.
STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
STEP = np.zeros(256, dtype=np.int8)
STEP[[ord("["), ord("{")]] = 1
STEP[[ord("]"), ord("}")]] = -1
CHUNK = 1 << 22
# The least CPU a cgroup quota can give: 1 ms of each period of at most 1 s.
MIN_CORES = 0.001
INT64 = 2**63
T = TypeVar("T", int, float)


def part_bound() -> int:
    """The most bytes one part may have."""
    value = os.environ.get(PART_BOUND_ENV)
    if value is None:
        return MAX_PART_MB * 1024 * 1024
    try:
        megabytes = float(value)
    except ValueError:
        megabytes = math.nan
    if not (math.isfinite(megabytes) and megabytes > 0):
        raise UsageError(f"{PART_BOUND_ENV}={value!r} is not a positive number of MB")
    return int(megabytes * 1024 * 1024)


def _denied(path: Path) -> PermissionDenied:
    return PermissionDenied(
        f"cannot read {path}: permission denied (bundles are written for their owner alone: "
        "run as the user who captured it, or as root)"
    )


def _regular(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in KINDS if test(info.st_mode)), "not a file")
        raise BadBundle(f"{path} is {kind}: profkit reads only regular files in a bundle")


def nesting(raw: bytes | bytearray) -> int:
    """How deep the brackets outside strings nest; counting stops past MAX_DEPTH. A quick scan
    in chunks, so that it needs little memory beside the part's."""
    bare = STRING.sub(b"", raw)
    depth = deepest = 0
    for start in range(0, len(bare), CHUNK):
        view = np.frombuffer(
            bare, dtype=np.uint8, count=min(CHUNK, len(bare) - start), offset=start
        )
        steps = STEP[view]
        running = np.cumsum(steps[steps != 0], dtype=np.int64) + depth
        if len(running):
            deepest = max(deepest, int(running.max()))
            depth = int(running[-1])
        if deepest > MAX_DEPTH:
            break
    return deepest


def parse(raw: bytes | bytearray, path: Path, corrupt: str) -> object:
    if nesting(raw) > MAX_DEPTH:
        raise BadBundle(f"{path} nests deeper than {MAX_DEPTH} levels; no bundle part does")
    try:
        return shown_strings(json.loads(raw))
    except RecursionError as exc:  # only where the scan and the parser disagree on invalid JSON
        raise BadBundle(f"{path} nests too deep to parse") from exc
    except ValueError as exc:  # UnicodeDecodeError included
        raise BadBundle(f"{path} {corrupt}: {exc}") from exc


_SCALARS = (int, float, bool, type(None))


def shown_strings(value: object) -> object:
    """Every string of a parsed part, keys included, as names.shown() makes it: whatever a
    bundle holds (a target's names, or text crafted into the file), no output made from it
    carries a control character or an unbounded string. A column of numbers is passed over."""
    if isinstance(value, str):
        return shown(value, MAX_TEXT_CHARS)
    if isinstance(value, list):
        if all(type(item) in _SCALARS for item in value):
            return value
        return [shown_strings(item) for item in value]
    if isinstance(value, dict):
        return {shown(key, MAX_TEXT_CHARS): shown_strings(item) for key, item in value.items()}
    return value


class BundleFiles:
    """A bundle directory held open; its parts read beneath it by name, each parsed once."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.bound = part_bound()
        self._parts: dict[str, Fields | None] = {}
        try:
            # O_PATH: the parts are opened by name, so the directory need not be listable.
            self.fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise BadBundle(f"{directory} is not a bundle directory") from exc
        except PermissionError as exc:
            raise _denied(directory) from exc
        except OSError as exc:
            raise BadBundle(f"cannot open {directory}: {exc.strerror}") from exc

    def __enter__(self) -> BundleFiles:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        os.close(self.fd)

    def raw(self, name: str) -> bytearray | None:
        """A part's bytes, or None when it is absent."""
        path = self.directory / name
        try:
            named = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except PermissionError as exc:  # the directory may not be searched
            raise _denied(self.directory) from exc
        except OSError as exc:
            raise BadBundle(f"cannot read {path}: {exc.strerror}") from exc
        _regular(path, named)
        try:
            fd = os.open(name, OPEN_PART, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise _denied(path) from exc
        except OSError as exc:  # ELOOP: replaced by a link since the stat
            raise BadBundle(f"cannot read {path}: {exc.strerror}") from exc
        try:
            opened = os.fstat(fd)
            _regular(path, opened)
            if (opened.st_dev, opened.st_ino) != (named.st_dev, named.st_ino):
                raise BadBundle(f"{path} was replaced while profkit opened it")
            return self._read(fd, path, opened.st_size)
        except OSError as exc:
            raise BadBundle(f"cannot read {path}: {exc.strerror}") from exc
        finally:
            os.close(fd)

    def _read(self, fd: int, path: Path, size: int) -> bytearray:
        data = bytearray()
        # Read one byte past the bound, not trusting st_size: the file may grow meanwhile.
        while size <= self.bound and len(data) <= self.bound:
            chunk = os.read(fd, min(1 << 20, self.bound + 1 - len(data)))
            if not chunk:
                return data
            data += chunk
        raise BadBundle(
            f"{path} is over {self.bound / 2**20:.3g} MB, the most a part may be "
            f"({PART_BOUND_ENV} raises it for a bundle captured with a larger --max-size)"
        )

    def manifest(self) -> Fields:
        """The manifest, its version checked (bundle/manifest.py checks the values it takes)."""
        path = self.directory / MANIFEST
        raw = self.raw(MANIFEST)
        if raw is None:
            raise BadBundle(f"{self.directory} has no {MANIFEST}")
        data = parse(raw, path, "is not valid JSON")
        if not isinstance(data, dict) or "schema_version" not in data:
            raise BadBundle(f"{path} is not a profkit manifest")
        manifest = Fields(data, str(path))
        version = manifest.integer("schema_version", minimum=1)
        if version > SCHEMA_VERSION:
            raise BadBundle(
                f"{path} has schema {version}; this profkit reads up to {SCHEMA_VERSION}"
            )
        return manifest

    def part(self, name: str) -> Fields | None:
        """A collector's normalised file, or None when it was not captured."""
        if name not in self._parts:
            path = self.directory / name
            raw = self.raw(name)
            if raw is None:
                self._parts[name] = None
                return None
            data = parse(raw, path, "is truncated or corrupt")
            if not isinstance(data, dict):
                # A file that is there but holds no table is damage, not a collector that did
                # not run.
                raise BadBundle(f"{path} holds {describe(data)}, not a collector's data")
            self._parts[name] = Fields(data, str(path))
        return self._parts[name]


def describe(value: object) -> str:
    """A JSON value in a few words, for a message."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return f"a string ({json.dumps(value[:20])})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return repr(value)


class _Required:
    pass


REQUIRED = _Required()


def need_int(value: object, label: str, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadBundle(f"{label} is {describe(value)}, not an integer")
    return _in_range(value, label, minimum)


def need_number(value: object, label: str, minimum: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadBundle(f"{label} is {describe(value)}, not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadBundle(f"{label} is {value}, not a finite number")
    return _in_range(value, label, minimum)


def _in_range(value: T, label: str, minimum: float | None) -> T:
    # Every count and time was a 64-bit integer where it was taken (an int beyond it, as JSON
    # allows, would not fit numpy's columns, and a 4000-digit one makes a poor message).
    if not -INT64 <= value < INT64:
        raise BadBundle(f"{label} is a number beyond 64 bits")
    if minimum is not None and value < minimum:
        raise BadBundle(f"{label} is {value}, {'negative' if minimum == 0 else f'below {minimum}'}")
    return value


def need_text(value: object, label: str) -> str:
    if not isinstance(value, str):
        raise BadBundle(f"{label} is {describe(value)}, not a string")
    return value


def need_ids(value: object, label: str, count: int) -> tuple[int, ...]:
    """A list of indices into a table of `count` entries (a stack's frames)."""
    if not isinstance(value, list) or not all(type(i) is int for i in value):
        raise BadBundle(f"{label} is {describe(value)}, not a list of indices")
    if value and (min(value) < 0 or max(value) >= count):
        bad = min(value) if min(value) < 0 else max(value)
        raise BadBundle(f"{label} holds {bad}, not an index into its {count} entries")
    return tuple(value)


def need_column(value: object, label: str, minimum: int | None = 0) -> np.ndarray:
    """A column of integers (numpy checks a long one at C speed; only a bad one is walked)."""
    if not isinstance(value, list):
        raise BadBundle(f"{label} is {describe(value)}, not a list of numbers")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        array = np.asarray([None])  # ragged or odd: found below
    if len(value) == 0:
        return np.zeros(0, dtype=I64)
    if array.ndim != 1 or array.dtype.kind not in "iuf":
        wrong = next(
            (v for v in value if isinstance(v, bool) or not isinstance(v, (int, float))), None
        )
        if wrong is not None:
            raise BadBundle(f"{label} holds {describe(wrong)}, not a number")
        raise BadBundle(f"{label} holds a number beyond 64 bits")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        bad = array[~np.isfinite(array)][0]
        raise BadBundle(f"{label} holds {bad}, not a finite number")
    low, high = array.min(), array.max()
    if high >= INT64 or low < -INT64:
        raise BadBundle(f"{label} holds {high if high >= INT64 else low}, beyond 64 bits")
    if minimum is not None and low < minimum:
        what = "negative" if minimum == 0 else f"below {minimum}"
        raise BadBundle(f"{label} holds {low}, {what}")
    return array.astype(I64)


def need_below(array: np.ndarray, count: int, label: str, table: str) -> np.ndarray:
    """An index column whose entries must name one of the `count` entries of `table`."""
    if len(array) and int(array.max()) >= count:
        raise BadBundle(f"{label} holds {int(array.max())}, past the {count} entries of {table}")
    return array


class Fields:
    """One JSON object of a part, its values checked as they are taken. A key that is absent
    takes the default given, else is an error; null is a value only where a maybe_ accessor
    takes it."""

    def __init__(self, data: dict[str, object], where: str, prefix: str = "") -> None:
        self.data, self.where, self.prefix = data, where, prefix

    def label(self, key: str) -> str:
        return f"{self.where}: {self.prefix}{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _get(self, key: str, default: object) -> object:
        if key in self.data:
            return self.data[key]
        if isinstance(default, _Required):
            raise BadBundle(f"{self.where} lacks {self.prefix}{key}")
        return default

    def integer(
        self, key: str, default: int | _Required = REQUIRED, minimum: int | None = 0
    ) -> int:
        return need_int(self._get(key, default), self.label(key), minimum)

    def maybe_integer(self, key: str, minimum: int | None = 0) -> int | None:
        value = self.data.get(key)
        return None if value is None else need_int(value, self.label(key), minimum)

    def number(
        self, key: str, default: float | _Required = REQUIRED, minimum: float | None = 0.0
    ) -> float:
        return need_number(self._get(key, default), self.label(key), minimum)

    def maybe_number(self, key: str, minimum: float | None = 0.0) -> float | None:
        value = self.data.get(key)
        return None if value is None else need_number(value, self.label(key), minimum)

    def text(self, key: str, default: str | _Required = REQUIRED) -> str:
        return need_text(self._get(key, default), self.label(key))

    def maybe_text(self, key: str) -> str | None:
        value = self.data.get(key)
        return None if value is None else need_text(value, self.label(key))

    def maybe_choice(self, key: str, choices: tuple[str, ...]) -> str | None:
        """A text that must be one of `choices`, or None."""
        value = self.maybe_text(key)
        if value is not None and value not in choices:
            raise BadBundle(f"{self.label(key)} is {value!r}, not one of {', '.join(choices)}")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise BadBundle(f"{self.label(key)} is {describe(value)}, not true or false")
        return value

    def table(self, key: str, optional: bool = False) -> Fields:
        """A nested object; absent, an empty one where optional."""
        value = self._get(key, {} if optional else REQUIRED)
        return self._object(value, key)

    def maybe_table(self, key: str) -> Fields | None:
        value = self.data.get(key)
        return None if value is None else self._object(value, key)

    def _object(self, value: object, key: str) -> Fields:
        if not isinstance(value, dict):
            raise BadBundle(f"{self.label(key)} is {describe(value)}, not an object")
        return Fields(value, self.where, f"{self.prefix}{key}.")

    def items(self, key: str, optional: bool = False) -> list[object]:
        value = self._get(key, [] if optional else REQUIRED)
        if not isinstance(value, list):
            raise BadBundle(f"{self.label(key)} is {describe(value)}, not a list")
        return value

    def objects(self, key: str, optional: bool = False) -> list[Fields]:
        return [
            self._object(value, f"{key}[{i}]") for i, value in enumerate(self.items(key, optional))
        ]

    def texts(self, key: str, optional: bool = False) -> list[str]:
        return [
            need_text(value, self.label(f"{key}[{i}]"))
            for i, value in enumerate(self.items(key, optional))
        ]

    def by_tid(self, key: str, optional: bool = False) -> dict[int, object]:
        """An object keyed by thread id."""
        table = self.table(key, optional)
        out: dict[int, object] = {}
        for name, value in table.data.items():
            if not (name.isascii() and name.isdigit()) or len(name) > 18:
                raise BadBundle(f"{table.label(name)}: {json.dumps(name[:20])} is not a thread id")
            out[int(name)] = value
        return out

    def column(
        self, key: str, minimum: int | None = 0, default: list[int] | _Required = REQUIRED
    ) -> np.ndarray:
        value = self._get(key, default)
        if value is None and not isinstance(default, _Required):
            value = default
        return need_column(value, self.label(key), minimum)

    def columns(
        self, key: str, minimums: Mapping[str, int | None], optional: bool = False
    ) -> dict[str, np.ndarray]:
        """A table of columns, one per name, all of one length; where optional, an absent or
        null table, or column, reads as empty."""
        table = self.maybe_table(key) if optional else self.table(key)
        if table is None:
            table = Fields({}, self.where, f"{self.prefix}{key}.")
        default: list[int] | _Required = [] if optional else REQUIRED
        out = {name: table.column(name, minimum, default) for name, minimum in minimums.items()}
        if len({len(column) for column in out.values()}) > 1:
            lengths = ", ".join(f"{name} {len(column)}" for name, column in out.items())
            raise BadBundle(f"{self.label(key)}: its columns differ in length ({lengths})")
        return out
