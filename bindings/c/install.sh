#!/usr/bin/env bash
# Installs the C library built by `cargo build --release` under a prefix, for C and C++ programs
# that build against it (`make install PREFIX=...` builds first, then runs this):
#   PREFIX/lib/libinsitubatch.so, PREFIX/lib/libinsitubatch.a
#   PREFIX/include/insitubatch.h, PREFIX/include/insitubatch.hpp
#   PREFIX/lib/pkgconfig/insitubatch.pc
#   PREFIX/lib/cmake/insitubatch/insitubatchConfig.cmake (and its ConfigVersion file), for
#   CMake's find_package(insitubatch CONFIG)
# Usage: bindings/c/install.sh PREFIX
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 PREFIX   (for example \$HOME/.local or /opt/insitubatch)" >&2
  exit 2
fi
root="$(cd "$(dirname "$0")/../.." && pwd)"
release="$root/target/release"
for f in libinsitubatch.so libinsitubatch.a; do
  if [ ! -f "$release/$f" ]; then
    echo "$release/$f is missing: run \`cargo build --release\` (or \`make install\`) first" >&2
    exit 1
  fi
done
mkdir -p "$1"
prefix="$(cd "$1" && pwd)"
case "$prefix" in
  *[[:space:]]*)
    echo "PREFIX '$prefix' contains whitespace, which pkg-config files cannot hold: choose another" >&2
    exit 2
    ;;
esac
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")"

install -d "$prefix/lib/pkgconfig" "$prefix/lib/cmake/insitubatch" "$prefix/include"
install -m 755 "$release/libinsitubatch.so" "$prefix/lib/"
install -m 644 "$release/libinsitubatch.a" "$prefix/lib/"
install -m 644 "$root/bindings/c/include/insitubatch.h" "$root/bindings/c/include/insitubatch.hpp" \
  "$prefix/include/"
# Libs.private: what the static library needs besides itself (`rustc --print native-static-libs`
# for this target; the tests link a program against the installed .a with exactly these).
cat > "$prefix/lib/pkgconfig/insitubatch.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: insitubatch
Description: Shuffled, split-aware batches from Zarr arrays read in place (C ABI; insitubatch.hpp for C++17)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -linsitubatch
Libs.private: -lstdc++ -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
EOF
# The CMake package finds the prefix from its own place, so a moved prefix still works.
cat > "$prefix/lib/cmake/insitubatch/insitubatchConfig.cmake" <<'EOF'
# insitubatch: shuffled, split-aware batches from Zarr arrays read in place.
#   find_package(insitubatch CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE insitubatch::insitubatch)         # the shared library
#   target_link_libraries(app PRIVATE insitubatch::insitubatch_static)  # or the static one
# Both carry the include directory (insitubatch.h for C; insitubatch.hpp for C++17).
get_filename_component(_insitubatch_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET insitubatch::insitubatch)
  add_library(insitubatch::insitubatch SHARED IMPORTED)
  # The library has no SONAME: link it by name (-L, -l), not by path, so that programs record
  # `libinsitubatch.so` and find it through their run path.
  set_target_properties(insitubatch::insitubatch PROPERTIES
    IMPORTED_LOCATION "${_insitubatch_prefix}/lib/libinsitubatch.so"
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "${_insitubatch_prefix}/include")
endif()
if(NOT TARGET insitubatch::insitubatch_static)
  add_library(insitubatch::insitubatch_static STATIC IMPORTED)
  # What the archive needs besides itself, as Libs.private in insitubatch.pc.
  set_target_properties(insitubatch::insitubatch_static PROPERTIES
    IMPORTED_LOCATION "${_insitubatch_prefix}/lib/libinsitubatch.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_insitubatch_prefix}/include"
    INTERFACE_LINK_LIBRARIES "stdc++;gcc_s;util;rt;pthread;m;dl;c")
endif()
unset(_insitubatch_prefix)
EOF
# Before 1.0 a minor version may change the ABI: a request is met by the same major.minor at the
# same or a later patch; from 1.0 on, by the same major at the same or a later version.
sed "s/@VERSION@/$version/" > "$prefix/lib/cmake/insitubatch/insitubatchConfigVersion.cmake" <<'EOF'
set(PACKAGE_VERSION "@VERSION@")
set(PACKAGE_VERSION_COMPATIBLE FALSE)
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _insitubatch_have "${PACKAGE_VERSION}")
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _insitubatch_want "${PACKAGE_FIND_VERSION}")
string(REGEX MATCH "^[0-9]+" _insitubatch_major "${PACKAGE_VERSION}")
if(PACKAGE_FIND_VERSION_MAJOR EQUAL _insitubatch_major
   AND NOT PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION
   AND (NOT _insitubatch_major EQUAL 0 OR _insitubatch_have VERSION_EQUAL _insitubatch_want))
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
unset(_insitubatch_have)
unset(_insitubatch_want)
unset(_insitubatch_major)
EOF
echo "installed insitubatch $version under $prefix"
echo "  cc prog.c \$(pkg-config --cflags --libs insitubatch) -Wl,-rpath,$prefix/lib"
echo "  (with PKG_CONFIG_PATH=$prefix/lib/pkgconfig if that is not on pkg-config's path)"
echo "  CMake: find_package(insitubatch CONFIG REQUIRED), configured with -DCMAKE_PREFIX_PATH=$prefix"
