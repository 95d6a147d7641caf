#!/usr/bin/env bash
# Render every output of every recorded bundle under tests/data into DIR, one file each, so that two
# trees can be compared byte for byte (a refactor must not change what a saved bundle reports):
#   scripts/recorded_reports.sh /tmp/before && <change> && scripts/recorded_reports.sh /tmp/after
#   diff -r /tmp/before /tmp/after
set -euo pipefail
out=${1:?usage: recorded_reports.sh DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
profkit=${PROFKIT:-$here/.venv/bin/profkit}
mkdir -p "$out"
# Reports name their bundle's path: render copies at one fixed place, whichever tree runs this.
copies=/tmp/profkit-recorded-bundles
rm -rf "$copies" && mkdir -p "$copies"
cp -r "$here"/tests/data/*/ "$copies"/
for bundle in "$copies"/*/; do
  name=$(basename "$bundle")
  for fmt in text json html; do
    "$profkit" report "$bundle" --format "$fmt" -o "$out/$name.report.$fmt" >/dev/null
  done
  for view in merged python workers offcpu; do
    "$profkit" flame "$bundle" --view "$view" -o "$out/$name.flame.$view.svg" >/dev/null
    for fmt in folded speedscope pprof pstats; do
      "$profkit" export "$bundle" --view "$view" --format "$fmt" -o "$out/$name.$view.$fmt" >/dev/null
    done
  done
  "$profkit" timeline "$bundle" -o "$out/$name.timeline.json" >/dev/null
done
# pprof is gzipped and the gzip header carries a time: compare the payload
for f in "$out"/*.pprof; do gzip -dc <"$f" >"$f.raw" && rm "$f"; done
ls "$out" | wc -l
