"""Names a target supplies are shown as data (bundle/names.py), frames keep them so, and a bundle
crafted to carry control characters yields none (bundle/load.py); the maps a target's files are
read through are parsed by device and inode (host/mapped.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from profkit.bundle.frames import Frame
from profkit.bundle.load import shown_strings
from profkit.bundle.names import MAX_NAME_CHARS, folded_frame, shown
from profkit.host.mapped import parse_maps

from ..support import DATA, run_profkit

EVIL = "a\nb;c\x1b[31m\x07\x7f\x85\u202ed<script>"


def test_controls_become_visible_escapes_and_the_rest_is_kept() -> None:
    assert shown(EVIL) == "a\\x0ab;c\\x1b[31m\\x07\\x7f\\x85\\u202ed<script>"
    assert shown("plain name (file.py:3)") == "plain name (file.py:3)"
    assert shown("tab\there") == "tab\\x09here"
    assert shown("\U000e0001x") == "\\U000e0001x"  # a tag character: format, not printed


def test_a_name_is_cut_at_its_bound_and_says_how_much_is_gone() -> None:
    long = "A" * (MAX_NAME_CHARS + 500)
    cut = shown(long)
    assert cut == "A" * MAX_NAME_CHARS + "…[+500 chars]"
    assert shown("x" * 10, limit=4) == "xxxx…[+6 chars]"


def test_folded_frames_keep_one_line_and_one_frame() -> None:
    name = folded_frame(EVIL)
    assert "\n" not in name and ";" not in name
    assert name.startswith("a\\x0ab:c")


def test_frames_are_made_safe_and_keep_their_kind() -> None:
    frame = Frame(EVIL + "/x", EVIL, 3, "code\x1b", python=True)
    assert frame.function == shown(EVIL) and frame.file == shown(EVIL + "/x")
    assert frame.code == "code\\x1b"
    # A walker's frame is Python whatever its file is called; a mixed stack's is told by it.
    assert frame.is_python
    assert not Frame("libc.so.6", "memcpy", 0).is_python
    assert Frame("app.py", "run", 1).is_python
    assert frame.located() == Frame(frame.file, frame.function, 3)
    assert frame.located().is_python


def test_a_parsed_part_carries_no_control_character() -> None:
    parsed = json.loads(json.dumps({"k\n": [EVIL, {"x": EVIL}], "n": [1, 2.5, None]}))
    clean = shown_strings(parsed)
    assert clean == {"k\\x0a": [shown(EVIL), {"x": shown(EVIL)}], "n": [1, 2.5, None]}


def test_a_crafted_bundle_reports_without_control_characters(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(DATA / "two_sites", bundle)
    pyspy = json.loads((bundle / "pyspy.json").read_text())
    pyspy["frames"] = [[EVIL + name, file, line] for name, file, line in pyspy["frames"]]
    (bundle / "pyspy.json").write_text(json.dumps(pyspy))
    for args in ((), ("--format", "json"), ("--format", "html")):
        done = run_profkit("report", str(bundle), *args)
        assert done.returncode == 0, done.stderr
        assert not any(c in done.stdout for c in "\x1b\x07\x7f\x85\u202e"), args
    folded = tmp_path / "out.folded"
    assert (
        run_profkit("export", str(bundle), "--format", "folded", "-o", str(folded)).returncode == 0
    )
    for line in folded.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        assert count.isdigit() and frames, line


def test_maps_lines_name_their_file_by_device_and_inode() -> None:
    text = (
        "7f0000000000-7f0000001000 r-xp 00002000 fd:01 1234   /lib/libgomp.so.1 (deleted)\n"
        "7f0000001000-7f0000002000 rw-p 00000000 00:00 0 \n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n"
        "7f0000003000-7f0000004000 r--p 00000000 08:02 99 /path with spaces/lib.so\n"
    )
    first, stack, spaced = parse_maps(text)
    assert (first.start, first.end, first.offset) == (0x7F0000000000, 0x7F0000001000, 0x2000)
    assert (first.device, first.inode) == (os.makedev(0xFD, 0x01), 1234)
    assert (first.path, first.deleted) == ("/lib/libgomp.so.1", True)
    assert stack.path == "[stack]" and stack.inode == 0
    assert spaced.path == "/path with spaces/lib.so" and not spaced.deleted
