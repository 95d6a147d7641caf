#!/usr/bin/env bash
# The tests in two lanes at once: the side lane (tests marked side_lane: tests/unit, the watch
# agent's, the bad-input and hostile ones; tests/conftest.py says which) runs beside the capture
# lane (the rest of tests/live), so that one lane's waits overlap the other's work. The capture
# lane prints as it goes, the side lane when both are done; the exit status is the worse of the
# two. LANES=1 runs every test in one pytest instead. Arguments go to both pytests.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ "${LANES:-2}" = 1 ]; then
  exec "$PY" -m pytest -ra "$@"
fi
side_log=$(mktemp)
side=
trap 'rm -f "$side_log"; [ -n "$side" ] && kill "$side" 2>/dev/null' EXIT
"$PY" -m pytest -ra -m side_lane "$@" >"$side_log" 2>&1 &
side=$!
"$PY" -m pytest -ra -m "not side_lane" "$@"
capture_status=$?
wait "$side"
side_status=$?
side=
echo "==================================== the side lane ===================================="
cat "$side_log"
# 5 is pytest's "no tests collected": arguments that select one lane's tests leave the other
# lane empty, which is no failure as long as that one ran.
for status in "$capture_status" "$side_status"; do
  if [ "$status" != 0 ] && [ "$status" != 5 ]; then
    exit "$status"
  fi
done
[ "$capture_status" = 5 ] && [ "$side_status" = 5 ] && exit 5
exit 0
