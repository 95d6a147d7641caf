"""What tells a process that exec'd from the one inspected: pid and start time survive exec."""

from __future__ import annotations

from dataclasses import replace

from profkit.host.procfs import ProcessImage, parse_stat

# A real /proc/PID/stat line (52 fields), comm with a space and a parenthesis.
STAT = (
    "4242 (my (app)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 12 3 0 0 20 0 3 0 66789 "
    "100000000 5000 18446744073709551615 94000000000000 94000000100000 140720000000000 0 0 "
    "0 0 16781312 134217730 0 0 0 17 1 0 0 0 0 0 94000000200000 94000000300000 "
    "94000001000000 140726347360486 140726347360520 140726347360520 140726347362000 0"
)


def test_stat_gives_the_argument_address() -> None:
    stat = parse_stat(STAT)
    assert (stat.comm, stat.start_ticks, stat.arg_start) == ("my (app)", 66789, 140726347360486)


BASE = ProcessImage(
    start_ticks=66789, comm="python3", arg_start=140726347360486, exe=(65024, 26723)
)


def test_an_exec_of_the_same_interpreter_is_seen_by_its_new_arguments() -> None:
    assert BASE.same_program_run(BASE)
    assert not BASE.same_program_run(replace(BASE, arg_start=140723217582308))
    assert not BASE.same_program_run(replace(BASE, exe=(65024, 1)))
    assert not BASE.same_program_run(replace(BASE, start_ticks=66790))


def test_a_renamed_thread_is_not_an_exec() -> None:
    # prctl(PR_SET_NAME) and setproctitle change comm in place.
    assert BASE.same_program_run(replace(BASE, comm="worker"))
    # Where the argument address could not be read, comm is all that is left to compare.
    assert not replace(BASE, arg_start=0).same_program_run(
        replace(BASE, arg_start=0, comm="worker")
    )
