#!/usr/bin/env bash
# Build the CO-RE object that ships in the wheel from its one source (probes/process.bpf.c, which
# the package reaches as profkit/capture/ebpf/probes), as Go's bpf2go does: clang -target bpf
# with BTF, then bpftool's linker, which keeps the BTF and CO-RE relocations and drops the DWARF.
# The object is committed; with --check the source is built again and compared with it, so that
# the two never drift. (bcc compiles text made from the same source: loaders/bcc_source.py.)
set -euo pipefail
cd "$(dirname "$0")/.."
PROBES=probes
CLANG=${CLANG:-$(command -v clang-14 || command -v clang)}
ARCH_INCLUDE=/usr/include/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
check=0
[ "${1:-}" = "--check" ] && check=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for source in "$PROBES"/*.bpf.c; do
  name=$(basename "$source" .c)
  # The object's BTF line info names the source file; the checkout's own path is mapped away
  # so that every clone builds the same bytes.
  (cd "$PROBES" && "$CLANG" -g -O2 -target bpf -D__TARGET_ARCH_x86 -I"$ARCH_INCLUDE" \
      -fdebug-prefix-map="$PWD"=. -c "$name.c" -o "$work/$name.raw.o")
  bpftool gen object "$work/$name.o" "$work/$name.raw.o"
  if [ "$check" = 1 ]; then
    if ! cmp -s "$work/$name.o" "$PROBES/$name.o"; then
      echo "build_probes: $PROBES/$name.o differs from its source; run scripts/build_probes.sh and commit it" >&2
      status=1
    fi
  else
    cp "$work/$name.o" "$PROBES/$name.o"
    echo "build_probes: $PROBES/$name.o"
  fi
done
exit $status
