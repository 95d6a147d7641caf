#!/usr/bin/env bash
# The tests in three lanes at once (tests/conftest.py says which test runs in which): the
# capture lane (captures whose CPU shares the tests assert), the side lane (tests marked
# side_lane: tests/unit, the watch agent's, the bad-input and hostile ones, the CO-RE and
# 3.14/3.15 captures) and the tools lane (tests marked tools_lane: the safety tests and
# profkit's surroundings), so that one lane's waits overlap the others' work. LANES=2 runs the
# side and tools lanes' tests in one lane; LANES=1 runs every test in one pytest. ALSO, a
# command (make test's type check), runs beside them. The capture lane prints as it goes, the
# others when all are done; the exit status is the worst of them. Arguments go to every pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ "${LANES:-3}" = 1 ]; then
  [ -z "${ALSO:-}" ] || $ALSO || exit
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
if [ "${LANES:-3}" = 3 ]; then
  markers=(side_lane tools_lane)
  lanes=("the side lane" "the tools lane")
else
  markers=("side_lane or tools_lane")
  lanes=("the side lane")
fi
names=()
for i in "${!markers[@]}"; do
  log=$(mktemp)
  logs+=("$log")
  names+=("${lanes[$i]}")
  "$PY" -m pytest -ra -m "${markers[$i]}" "$@" >"$log" 2>&1 &
  pids+=($!)
done
also=()
if [ -n "${ALSO:-}" ]; then
  log=$(mktemp)
  logs+=("$log")
  names+=("$ALSO")
  $ALSO >"$log" 2>&1 &
  pids+=($!)
  also=(1)
fi
"$PY" -m pytest -ra -m "not side_lane and not tools_lane" "$@"
statuses=($?)
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  statuses+=($?)
done
pids=()
for i in "${!logs[@]}"; do
  echo "==================================== ${names[$i]} ===================================="
  cat "${logs[$i]}"
done
# 5 is pytest's "no tests collected": arguments that select one lane's tests leave the others
# empty, which is no failure as long as one ran. ALSO's status, last, counts as it is.
worst=0
empty=0
lanes_run=$((${#statuses[@]} - ${#also[@]}))
for i in "${!statuses[@]}"; do
  status=${statuses[$i]}
  if [ "$status" = 5 ] && [ "$i" -lt "$lanes_run" ]; then
    empty=$((empty + 1))
  elif [ "$status" != 0 ]; then
    worst=$status
  fi
done
[ "$worst" != 0 ] && exit "$worst"
[ "$empty" = "$lanes_run" ] && exit 5
exit 0
