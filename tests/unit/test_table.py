"""The plain-text tables of the report, doctor and ps."""

from __future__ import annotations

from profkit.render.table import table


def test_columns_are_as_wide_as_their_widest_cell_with_a_rule_under_the_headers() -> None:
    assert table(("tid", "name"), [[1, "main"], [12345, None]]).splitlines() == [
        "tid    name",
        "-----  ----",
        "1      main",
        "12345",
    ]


def test_text_that_looks_like_markup_or_an_emoji_code_stays_as_it_is() -> None:
    out = table(("a", "b"), [["[bold]x[/bold]", ":smile: [unknown]"]])
    assert "[bold]x[/bold]  :smile: [unknown]" in out
    assert "\x1b" not in out  # no colour, whatever the terminal


def test_a_cell_past_its_maximum_ends_in_an_ellipsis() -> None:
    lines = table(("site", "cores"), [["recipes/shm_fanout.py:123", 1.5]], (10, 0)).splitlines()
    assert lines[2] == "recipes/s…  1.5"


def test_wide_characters_take_two_cells() -> None:
    lines = table(("name", "n"), [["中文", 1], ["abcd", 2]]).splitlines()
    assert lines[2] == "中文  1" and lines[3] == "abcd  2"


def test_the_last_column_wraps_under_itself() -> None:
    detail = "bcc is not installed (apt-get install bpfcc-tools python3-bpfcc)"
    lines = table(
        ("capability", "status", "detail"), [["bcc", "missing", detail]], (22, 12, 0), 30
    ).splitlines()
    assert lines[2].startswith("bcc         missing  bcc is not installed")
    indent = " " * len("capability  missing  ")
    assert all(line.startswith(indent) for line in lines[3:]) and len(lines) > 3
    assert " ".join(line.strip() for line in lines[2:]).endswith(detail.split()[-1])
