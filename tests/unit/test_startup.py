"""What the tools cost inside the window, split by tool, across a restarted child."""

from __future__ import annotations

import pytest

from profkit.capture.startup import cpu_spent_by_tool


def test_cpu_is_split_by_tool_name() -> None:
    before = {"profkit": 1.0, "py-spy:10": 0.5, "perf:11": 0.2}
    after = {"profkit": 1.1, "py-spy:10": 0.6, "perf:11": 0.2}
    assert cpu_spent_by_tool(before, after) == pytest.approx(
        {"profkit": 0.1, "py-spy": 0.1, "perf": 0.0}
    )


def test_a_tool_restarted_inside_the_window_is_not_counted_twice() -> None:
    # py-spy 10 had 0.5 s when the window opened, used 0.2 s more, and was reaped: its 0.7 s
    # are in profkit's children's times by the end. Its successor, py-spy 12, used 0.3 s.
    before = {"profkit": 1.0, "py-spy:10": 0.5}
    after = {"profkit": 1.0 + 0.05 + 0.7, "py-spy:12": 0.3}
    spent = cpu_spent_by_tool(before, after)
    assert spent["py-spy"] == pytest.approx(0.3)
    assert spent["profkit"] == pytest.approx(0.05 + 0.2)
    assert sum(spent.values()) == pytest.approx(sum(after.values()) - sum(before.values()))
