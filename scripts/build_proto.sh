#!/bin/bash
# The pprof code, generated again from profile.proto with grpcio-tools' protoc (a dev
# dependency); commit what it writes. With --check, generate into a scratch directory and fail
# when it differs from the committed files.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIR=profkit/render/proto
out=$DIR
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
"$PY" -m grpc_tools.protoc -I"$DIR" --python_out="$out" --pyi_out="$out" "$DIR/profile.proto"
if [ "$out" != "$DIR" ]; then
  for f in profile_pb2.py profile_pb2.pyi; do
    if ! cmp -s "$out/$f" "$DIR/$f"; then
      echo "build_proto: $DIR/$f differs from what profile.proto generates (run scripts/build_proto.sh)" >&2
      exit 1
    fi
  done
fi
