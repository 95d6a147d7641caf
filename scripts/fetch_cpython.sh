#!/usr/bin/env bash
# Debian unstable's (sid) CPython 3.14 and 3.15, as Debian builds them (libpython inside a
# non-PIE executable), fetched into a cache folder for the walker's tests, and made to run on an
# older Debian by relinking a copy of the executable against sid's own glibc and libraries.
# Torch has no CPU wheel for them here: numpy (its OpenBLAS pool) and libgomp through ctypes give
# the tests their pools. Idempotent: each step is skipped when its result is already there.
# `make test`'s setup runs it (scripts/setup.sh --test) into .cache/cpython.
#
#   fetch_cpython.sh CACHE [VERSION...]      (default versions: 3.14 3.15)
#
# Result per version V:
#   CACHE/V/root/...               the unpacked .debs (usr/bin, usr/lib/pythonV, usr/lib/x86_64-linux-gnu)
#   CACHE/V/bin/pythonV            relinked copy (interpreter + rpath -> CACHE/V/root)
#   CACHE/V/run                    wrapper: exec bin/pythonV with PYTHONHOME set, CACHE/V/site on PYTHONPATH
#   CACHE/V/site/numpy             numpy's manylinux_2_28 cpVV wheel, unpacked (skip: NUMPY=0)
# The system's apt configuration and state are not touched: apt runs on a private sources list,
# lists folder and cache folder under CACHE/apt.
set -euo pipefail

CACHE=${1:?usage: $0 CACHE [VERSION...]}
shift || true
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(3.14 3.15)
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
ARCH=x86_64-linux-gnu

log() { printf '[fetch_cpython] %s\n' "$*" >&2; }

# --- patchelf (Debian's) -------------------------------------------------------------------
if ! command -v patchelf >/dev/null; then
    log "installing Debian's patchelf"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q patchelf >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q patchelf >/dev/null; }
fi

# --- private apt state naming the system's own Debian mirror, suite sid ---------------------
mirror() {
    local uri=""
    if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
        # deb822: first URIs line of a stanza whose URI ends in /debian (not -security)
        uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' \
              /etc/apt/sources.list.d/*.sources)
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\// && $i ~ /\/debian\/?$/) { print $i; exit } }' \
              /etc/apt/sources.list)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}
MIRROR=$(mirror)
APTDIR=$CACHE/apt
mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
echo "deb [signed-by=$KEYRING] $MIRROR sid main" >"$APTDIR/sources.list"
APT_OPTS=(
    -o Dir::Etc::SourceList="$APTDIR/sources.list"
    -o Dir::Etc::SourceParts=/dev/null
    -o Dir::Etc::Preferences=/dev/null
    -o Dir::Etc::PreferencesParts=/dev/null
    -o Dir::State::Lists="$APTDIR/lists"
    -o Dir::Cache="$APTDIR/cache"
    -o Dir::Cache::pkgcache="" -o Dir::Cache::srcpkgcache=""
    -o APT::Sandbox::User=root
    -o Acquire::Languages=none
    -o Debug::NoLocking=1
    -q
)
# Refresh the sid index at most once a day.
stamp=$APTDIR/updated
if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440)" ]; then
    log "apt-get update (sid from $MIRROR, private state in $APTDIR)"
    apt-get "${APT_OPTS[@]}" update >"$APTDIR/update.log" 2>&1 \
        || { cat "$APTDIR/update.log" >&2; exit 1; }
    touch "$stamp"
fi

# Libraries the executable and its lib-dynload extensions link, plus a C++ runtime and OpenMP
# for extension wheels (numpy's OpenBLAS brings its own libgfortran).
COMMON_LIBS=(libc6 libexpat1 zlib1g libffi8 libzstd1 liblzma5 libbz2-1.0 libmpdec4 libssl3t64
    libcrypt1 libuuid1 libsqlite3-0 libncursesw6 libtinfo6 libreadline8t64 libgcc-s1 libstdc++6
    libgomp1)

install_python() {
    local V=$1 D=$CACHE/$1
    # A fresh unpack each time it is not runnable: old .debs of an earlier sid would mix in.
    rm -rf "$D/debs" "$D/root"
    mkdir -p "$D/debs" "$D/root" "$D/bin"
    pkgs=("python$V-minimal" "libpython$V-minimal" "libpython$V-stdlib" "${COMMON_LIBS[@]}")
    log "downloading ${#pkgs[@]} packages for $V"
    (cd "$D/debs" && apt-get "${APT_OPTS[@]}" download "${pkgs[@]}" >"$D/download.log" 2>&1) \
        || { cat "$D/download.log" >&2; exit 1; }
    for deb in "$D"/debs/*.deb; do
        dpkg -x "$deb" "$D/root"
    done
    log "  $(cd "$D/debs" && ls | tr '\n' ' ')"
    lib=$D/root/usr/lib/$ARCH
    ld=$lib/ld-linux-x86-64.so.2
    [ -e "$ld" ] || ld=$D/root/lib/$ARCH/ld-linux-x86-64.so.2
    [ -e "$ld" ] || { log "no ld-linux-x86-64.so.2 in libc6"; exit 1; }
    # A copy keeping the name pythonV (tools recognise the interpreter by its name).
    cp -f "$D/root/usr/bin/python$V" "$D/bin/python$V.tmp"
    # --force-rpath: DT_RPATH (not RUNPATH) also serves the libraries that lib-dynload
    # extensions and wheels load, not only the executable's own DT_NEEDED.
    patchelf --set-interpreter "$ld" --force-rpath --set-rpath "$lib" "$D/bin/python$V.tmp"
    mv -f "$D/bin/python$V.tmp" "$D/bin/python$V"
    cat >"$D/run" <<EOF
#!/bin/sh
# python$V from Debian sid, relinked against its own glibc ($D/root)
PYTHONPATH=$D/site\${PYTHONPATH:+:\$PYTHONPATH} PYTHONHOME=$D/root/usr exec $D/bin/python$V "\$@"
EOF
    chmod +x "$D/run"
    "$D/run" -c 'import sys, sysconfig; print(sys.version.replace("\n", " "), "Py_GIL_DISABLED", sysconfig.get_config_var("Py_GIL_DISABLED"))' >&2
}

install_numpy() {
    local V=$1 D=$CACHE/$1
    log "numpy for $V"
    rm -rf "$D/wheels" "$D/site"
    mkdir -p "$D/wheels" "$D/site"
    # Any pip will do: it only downloads the wheel for the target's tag.
    local pip=(python3 -m pip)
    "${pip[@]}" download -q --no-deps --python-version "$V" --only-binary=:all: \
        --platform manylinux_2_28_x86_64 -d "$D/wheels" numpy
    for whl in "$D"/wheels/*.whl; do
        python3 -m zipfile -e "$whl" "$D/site"
        log "  $(basename "$whl")"
    done
    "$D/run" -c 'import numpy as np; a = np.ones((256, 256)); assert (a @ a)[0, 0] == 256; print("numpy", np.__version__, "matmul ok")' >&2
}

for V in "${VERSIONS[@]}"; do
    D=$CACHE/$V
    if [ -x "$D/run" ] && "$D/run" -c 'pass' 2>/dev/null; then
        log "python$V already in $D"
    else
        install_python "$V"
    fi
    if [ "${NUMPY:-1}" = 1 ] && ! "$D/run" -c 'import numpy' 2>/dev/null; then
        install_numpy "$V"
    fi
done
