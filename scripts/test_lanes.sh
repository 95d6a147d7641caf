#!/usr/bin/env bash
# The tests in lanes at once (tests/conftest.py says which test runs in which): the capture
# lane (captures whose CPU shares the tests assert, and the safety tests) beside the side lane
# (tests marked side_lane or tools_lane: tests/unit, the watch agent's, the bad-input and
# hostile ones, profkit's surroundings), so that one lane's waits overlap the other's work.
# LANES=3 runs the tools_lane tests in a third lane of their own; LANES=1 runs every test in
# one pytest. The capture lane prints as it goes, the others when all are done; the exit status
# is the worst of them. Arguments go to every pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ "${LANES:-2}" = 1 ]; then
  exec "$PY" -m pytest -ra "$@"
fi
# A script's background job inherits SIGINT ignored, and so would every process its tests
# start (profkit, the recipes): with job control on, the other lanes get it as the capture
# lane does.
set -m
logs=()
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  rm -f "${logs[@]}"
}
trap cleanup EXIT
if [ "${LANES:-2}" = 3 ]; then
  markers=(side_lane tools_lane)
  names=(side tools)
else
  markers=("side_lane or tools_lane")
  names=(side)
fi
for marker in "${markers[@]}"; do
  log=$(mktemp)
  logs+=("$log")
  "$PY" -m pytest -ra -m "$marker" "$@" >"$log" 2>&1 &
  pids+=($!)
done
"$PY" -m pytest -ra -m "not side_lane and not tools_lane" "$@"
statuses=($?)
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  statuses+=($?)
done
pids=()
for i in "${!logs[@]}"; do
  echo "==================================== the ${names[$i]} lane ===================================="
  cat "${logs[$i]}"
done
# 5 is pytest's "no tests collected": arguments that select one lane's tests leave the others
# empty, which is no failure as long as one ran.
worst=0
empty=0
for status in "${statuses[@]}"; do
  if [ "$status" = 5 ]; then
    empty=$((empty + 1))
  elif [ "$status" != 0 ]; then
    worst=$status
  fi
done
[ "$worst" != 0 ] && exit "$worst"
[ "$empty" = "${#statuses[@]}" ] && exit 5
exit 0
