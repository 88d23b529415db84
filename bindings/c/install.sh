#!/usr/bin/env bash
# Installs the C library built by `cargo build --release` under a prefix, for C and C++ programs
# that build against it (`make install PREFIX=...` builds first, then runs this):
#   PREFIX/lib/libinsitubatch.so, PREFIX/lib/libinsitubatch.a
#   PREFIX/include/insitubatch.h, PREFIX/include/insitubatch.hpp
#   PREFIX/lib/pkgconfig/insitubatch.pc
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

install -d "$prefix/lib/pkgconfig" "$prefix/include"
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
echo "installed insitubatch $version under $prefix"
echo "  cc prog.c \$(pkg-config --cflags --libs insitubatch) -Wl,-rpath,$prefix/lib"
echo "  (with PKG_CONFIG_PATH=$prefix/lib/pkgconfig if that is not on pkg-config's path)"
