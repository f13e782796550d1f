#!/bin/sh
# Checks an installed libcolocated (make test-install): the files and links,
# the SONAME and versioned symbols of the shared library, and C programs built
# against the prefix as users build theirs (pkg-config, shared and static;
# CMake's find_package, both targets). Usage: check.sh PREFIX SONAME SOFILE RELEASE
set -eu
prefix=$1 soname=$2 sofile=$3 release=$4
here=$(cd "$(dirname "$0")" && pwd)
lib=$prefix/lib
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "install check: $*" >&2; exit 1; }

for f in "include/colocated.h" "lib/$sofile" "lib/libcolocated.a" "lib/pkgconfig/colocated.pc" \
         "lib/cmake/colocated/colocatedConfig.cmake" "lib/cmake/colocated/colocatedConfigVersion.cmake"; do
  [ -f "$prefix/$f" ] || fail "$f is not installed"
done
[ "$(readlink "$lib/$soname")" = "$sofile" ] || fail "$soname does not link to $sofile"
[ "$(readlink "$lib/libcolocated.so")" = "$soname" ] || fail "libcolocated.so does not link to $soname"
readelf -d "$lib/$sofile" | grep -q "Library soname: \[$soname\]" || fail "no SONAME $soname"
# Every exported function is versioned COLOCATED_1, and only the C API is exported.
exported=$(objdump -T "$lib/$sofile" | awk '$2 == "g" && $4 != "*UND*" && $4 != "*ABS*" {print $(NF-1), $NF}')
[ -n "$exported" ] || fail "nothing exported"
echo "$exported" | grep -v '^COLOCATED_1 colocated_' | grep -q . && fail "exports beyond the C API: $(echo "$exported" | grep -v '^COLOCATED_1 colocated_' | head -n 3)"
echo "$exported" | grep -q '^COLOCATED_1 colocated_version$' || fail "colocated_version is not exported as COLOCATED_1"

expect="colocated $release api"
export PKG_CONFIG_PATH="$lib/pkgconfig"
[ "$(pkg-config --modversion colocated)" = "$release" ] || fail "pkg-config version"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$here/version.c" -o "$out/shared" $(pkg-config --cflags --libs colocated)
LD_LIBRARY_PATH=$lib "$out/shared" | grep -q "^$expect .* devices 3$" || fail "the pkg-config build does not run"
readelf -d "$out/shared" | grep -q "NEEDED.*\[$soname\]" || fail "the program does not need $soname"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$here/version.c" -o "$out/static" $(pkg-config --cflags colocated) \
  -Wl,-Bstatic -lcolocated -Wl,-Bdynamic $(pkg-config --libs --static colocated)
readelf -d "$out/static" | grep -q "libcolocated" && fail "the static build needs the shared library"
"$out/static" | grep -q "^$expect .* devices 3$" || fail "the static pkg-config build does not run"

if command -v cmake >/dev/null 2>&1; then
  cmake -S "$here/cmake" -B "$out/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$out/cmake" >/dev/null
  LD_LIBRARY_PATH=$lib "$out/cmake/version_shared" | grep -q "^$expect .* devices 3$" || fail "the CMake shared build"
  "$out/cmake/version_static" | grep -q "^$expect .* devices 3$" || fail "the CMake static build"
  # A release line the prefix does not have is not found.
  sed 's/find_package(colocated 0.2 /find_package(colocated 9.0 /' "$here/cmake/CMakeLists.txt" > "$out/CMakeLists.txt"
  mkdir -p "$out/other" && cp "$out/CMakeLists.txt" "$out/other/" && cp "$here/version.c" "$out/"
  if cmake -S "$out/other" -B "$out/other/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null 2>&1; then
    fail "find_package(colocated 9.0) found $release"
  fi
else
  fail "cmake is not installed (the CMake package is part of the check)"
fi
echo "install check: $prefix ok ($sofile, pkg-config shared and static, CMake)"
