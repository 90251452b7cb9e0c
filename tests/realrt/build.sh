#!/usr/bin/env bash
# Builds the real CANN runtime (hicann/runtime, pinned tarballs) in its production layout
# (libacl_rt.so + libruntime.so + the libruntime_v100.so plugin it dlopens, over a
# libascend_hal.so) and our fake driver (tests/realrt/fakehal) into a cache directory outside
# the working tree, keyed by the sha256 of the tarballs, of this script and of the fake
# driver's sources. Prints progress, and the library folder as its LAST line.
#
#   AIO_ASCEND_CANN_SRC      folder holding the three tarballs
#                            (default: ../shared/third_party/cann-runtime from the repo root)
#   AIO_ASCEND_REALRT_CACHE  cache root (default: $HOME/.cache/aio_ascend/realrt)
#   AIO_ASCEND_REALRT_JOBS   make -j (default: nproc)
#
# Nothing is fetched but Debian packages (cmake, g++, protobuf, nlohmann-json), installed only
# when missing. The runtime is compiled at -O0 (a compiler launcher appends it after the
# targets' own -O3) because only its behaviour matters here, not its speed.
set -euo pipefail
export LC_ALL=C

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
if [ -n "${AIO_ASCEND_CANN_SRC:-}" ]; then
    SRC="$AIO_ASCEND_CANN_SRC"
else
    # shared/ sits beside the clone (CI, the main checkout); a git worktree may sit deeper
    SRC="$REPO/../shared/third_party/cann-runtime"
    d="$REPO"
    while [ ! -d "$SRC" ] && [ "$d" != "/" ]; do
        d="$(dirname "$d")"
        SRC="$d/shared/third_party/cann-runtime"
    done
fi
JOBS="${AIO_ASCEND_REALRT_JOBS:-$(nproc)}"
RUNTIME_TAR="hicann-runtime-681ef76.tar.xz"
CMAKE_TAR="hicann-cmake-master-049.tar.xz"
CSEC_TAR="libboundscheck-v1.1.16.tar.xz"

log() { echo "[realrt-build $(date -u +%H:%M:%S)] $*" >&2; }

for f in "$RUNTIME_TAR" "$CMAKE_TAR" "$CSEC_TAR"; do
    if [ ! -f "$SRC/$f" ]; then
        log "missing $SRC/$f (set AIO_ASCEND_CANN_SRC to the folder holding the tarballs)"
        exit 2
    fi
done

# --- Debian packages, only those missing -------------------------------------------------
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v make >/dev/null || need+=(make)
command -v g++ >/dev/null || need+=(g++)
command -v gcc >/dev/null || need+=(gcc)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v python3 >/dev/null || need+=(python3)
command -v xz >/dev/null || need+=(xz-utils)
command -v patch >/dev/null || need+=(patch)
[ -f /usr/include/google/protobuf/any.h ] || need+=(libprotobuf-dev)
[ -f /usr/include/nlohmann/json.hpp ] || need+=(nlohmann-json3-dev)
if [ "${#need[@]}" -gt 0 ]; then
    log "installing Debian packages: ${need[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >&2
fi
PROTOBUF_SO="$(ls /usr/lib/*/libprotobuf.so 2>/dev/null | head -1)"
[ -n "$PROTOBUF_SO" ] || { log "libprotobuf.so not found"; exit 2; }

# --- the cache key ------------------------------------------------------------------------
KEY="$(
    {
        sha256sum "$SRC/$RUNTIME_TAR" "$SRC/$CMAKE_TAR" "$SRC/$CSEC_TAR" | cut -d' ' -f1
        sha256sum "$HERE/build.sh" | cut -d' ' -f1
    } | sha256sum | cut -c1-16
)"
FAKE_KEY="$(
    find "$HERE/fakehal" -type f \( -name '*.c' -o -name '*.h' \) -print0 | sort -z \
        | xargs -0 sha256sum | cut -d' ' -f1 | sha256sum | cut -c1-16
)"
CACHE_ROOT="${AIO_ASCEND_REALRT_CACHE:-$HOME/.cache/aio_ascend/realrt}"
OUT="$CACHE_ROOT/$KEY"
LIB="$OUT/fake-$FAKE_KEY/lib"
if [ -f "$OUT/fake-$FAKE_KEY/.complete" ]; then
    log "cached build $OUT/fake-$FAKE_KEY"
    echo "$LIB"
    exit 0
fi
mkdir -p "$OUT"
log "building into $OUT (jobs=$JOBS)"

# --- the sources --------------------------------------------------------------------------
if [ ! -f "$OUT/src/.unpacked" ]; then
    rm -rf "$OUT/src"
    mkdir -p "$OUT/src"
    log "unpacking the tarballs"
    for f in "$RUNTIME_TAR" "$CMAKE_TAR" "$CSEC_TAR"; do
        tar -C "$OUT/src" -xJf "$SRC/$f"
    done
    # Debian's protobuf keeps the google namespace; the runtime's libraries (platform, adump)
    # map google to ascend_private for its own protobuf build: reverse the mapping.
    find "$OUT/src/hicann-runtime/src" \( -name CMakeLists.txt -o -name '*.cmake' \) \
        -exec grep -l 'google=ascend_private' {} + \
        | xargs sed -i 's/google=ascend_private/ascend_private=google/'
    touch "$OUT/src/.unpacked"
fi
RT="$OUT/src/hicann-runtime"

# --- third-party layout the cann-cmake recipes accept offline ----------------------------
THIRD="$OUT/3rd"
mkdir -p "$THIRD/lib_cache/json/include" "$THIRD/lib_cache/protoc"
ln -sfn "$OUT/src/hicann-cmake" "$THIRD/cann-cmake"
# csec.cmake copies this folder with file(COPY), which refuses a symlink
[ -d "$THIRD/libboundscheck-v1.1.16" ] || cp -a "$OUT/src/libboundscheck" "$THIRD/libboundscheck-v1.1.16"
ln -sfn /usr/include/nlohmann "$THIRD/lib_cache/json/include/nlohmann"
ln -sfn "$(command -v protoc)" "$THIRD/lib_cache/protoc/protoc"
# the packaging step's makeself is never run here; its recipe only needs the files to exist
mkdir -p "$THIRD/makeself"
for f in makeself.sh makeself-header.sh; do
    [ -f "$THIRD/makeself/$f" ] || printf '#!/bin/sh\nexit 1\n' >"$THIRD/makeself/$f"
done
for kind in protobuf_static protobuf_shared protobuf_host_static; do
    mkdir -p "$THIRD/lib_cache/$kind/lib"
    ln -sfn /usr/include "$THIRD/lib_cache/$kind/include"
done
# The linker reads a library by its content, so Debian's shared libprotobuf serves for the
# recipes' static names too (Debian's libprotobuf.a is not built for a shared library).
ln -sfn "$PROTOBUF_SO" "$THIRD/lib_cache/protobuf_shared/lib/libascend_protobuf.so"
ln -sfn "$PROTOBUF_SO" "$THIRD/lib_cache/protobuf_static/lib/libascend_protobuf.a"
ln -sfn "$PROTOBUF_SO" "$THIRD/lib_cache/protobuf_host_static/lib/libhost_ascend_protobuf.a"

# --- configure ----------------------------------------------------------------------------
BUILD="$OUT/build"
mkdir -p "$BUILD"
cat >"$OUT/cc-O0" <<'EOF'
#!/bin/sh
# Appended last so that it wins over the targets' own -O2/-O3.
exec "$@" -O0 -g0 -U_FORTIFY_SOURCE
EOF
chmod +x "$OUT/cc-O0"
# The acl-compat tarball (a prebuilt libascendcl) is only copied when include_acl is absent;
# nothing that is built here needs it.
mkdir -p "$BUILD/include_acl/tdt" "$BUILD/lib_acl"
# configured once per cache directory: a change to this script is a new key, a new directory
if [ ! -f "$BUILD/Makefile" ]; then
    log "configuring"
    cmake -S "$RT" -B "$BUILD" \
        -DENABLE_OPEN_SRC=True \
        -DCMAKE_BUILD_TYPE=Release \
        -DUSE_CXX11_ABI=ON \
        -DCANN_3RD_LIB_PATH="$THIRD" \
        -DASCEND_INSTALL_PATH="$OUT/no-ascend" \
        -DENABLE_BUILD_DEVICE=OFF \
        -DCMAKE_C_COMPILER_LAUNCHER="$OUT/cc-O0" \
        -DCMAKE_CXX_COMPILER_LAUNCHER="$OUT/cc-O0" \
        -DCMAKE_SHARED_LINKER_FLAGS='-Wl,-rpath,$ORIGIN' \
        >"$OUT/configure.log" 2>&1 || {
        tail -40 "$OUT/configure.log" >&2
        log "configure failed: $OUT/configure.log"
        exit 1
    }
fi

# --- build only what the acl path loads ---------------------------------------------------
TARGETS=(acl_rt runtime runtime_v100 runtime_common)
log "building ${TARGETS[*]} (progress in $OUT/build.log)"
if ! make -C "$BUILD" -j"$JOBS" "${TARGETS[@]}" >"$OUT/build.log" 2>&1; then
    grep -m20 -B2 -A8 'error' "$OUT/build.log" >&2 || tail -40 "$OUT/build.log" >&2
    log "build failed: $OUT/build.log"
    exit 1
fi

# --- assemble the library folder: the runtime's libraries and our driver ----------------
if [ ! -f "$OUT/.runtime-complete" ]; then
    log "collecting the runtime libraries"
    rm -rf "$OUT/runtime-lib" "$OUT/data"
    mkdir -p "$OUT/runtime-lib" "$OUT/data"
    find "$BUILD" -name '*.so*' -type f ! -path '*/CMakeFiles/*' ! -name 'libascend_hal.so' \
        -exec cp -a {} "$OUT/runtime-lib/" \;
    # the runtime reads its platform .ini files from <libdir>/../data/platform_config
    cp -a "$RT/src/platform/platform_config/cann" "$OUT/data/platform_config"
    touch "$OUT/.runtime-complete"
fi
log "building the fake driver"
FAKE="$OUT/fake-$FAKE_KEY"
rm -rf "$FAKE"
mkdir -p "$FAKE/lib"
cp -a "$OUT/runtime-lib/." "$LIB/"
ln -sfn "$OUT/data" "$FAKE/data"
# Every symbol of the public driver headers, as the runtime's own stub generator writes them
# (`return 0`), traced, and weak: our fakehal/*.c defines what is modelled.
python3 "$RT/cmake/stub/h2c.py" -i "$RT/pkg_inc/driver/ascend_hal.h" \
    "$RT/pkg_inc/driver/ascend_hal_external.h" "$RT/pkg_inc/driver/ascend_hal_base.h" \
    -o "$FAKE/hal_stub_gen.c" >"$FAKE/h2c.log" 2>&1
{
    echo 'int aio_fakehal_unmodelled(const char *name);'
    sed 's/^    return 0;$/    return aio_fakehal_unmodelled(__func__);/' "$FAKE/hal_stub_gen.c"
} >"$FAKE/hal_stub.c"
CFLAGS_FAKE=(-O1 -g -fPIC -pthread -I"$RT/pkg_inc/driver" -I"$RT/pkg_inc")
gcc "${CFLAGS_FAKE[@]}" -w -c "$FAKE/hal_stub.c" -o "$FAKE/hal_stub.o"
objcopy --weaken "$FAKE/hal_stub.o"
objs=("$FAKE/hal_stub.o")
for c in "$HERE"/fakehal/*.c; do
    o="$FAKE/$(basename "$c" .c).o"
    gcc "${CFLAGS_FAKE[@]}" -Wall -Wextra -Werror -c "$c" -o "$o"
    objs+=("$o")
done
gcc -shared -pthread -Wl,-soname,libascend_hal.so -o "$LIB/libascend_hal.so" "${objs[@]}"
touch "$FAKE/.complete"
log "done"
echo "$LIB"
