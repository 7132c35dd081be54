#!/usr/bin/env bash
# Checks that hot.order still names the functions of the shipped release binary: fails when the
# binary defines fewer than 95 % of the file's symbols. Symbol names change with the compiler,
# the dependencies and their features, and then the order file silently stops placing the hot
# code together (build.rs skips the symbols it cannot find), and the idle hub's RSS grows.
#
# Usage: crates/outpost/link/check.sh [BINARY]
# Without BINARY it builds the shipped binary as the Dockerfile does and checks that one.
# Needs nm.
set -euo pipefail
cd "$(dirname "$0")/../../.."
order="crates/outpost/link/hot.order"
min_percent=95
target="${CARGO_TARGET_DIR:-$PWD/target}"
bin="${1:-}"
if [ -z "$bin" ]; then
  # The Dockerfile's build: the shipped binary, without the demo.
  cargo build --release --locked -p outpost --no-default-features
  bin="$target/release/outpost"
fi
command -v nm >/dev/null || { echo "link/check.sh needs nm" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
grep -v '^#' "$order" | sort -u >"$work/wanted"
nm --defined-only "$bin" | awk '$2 ~ /^[tTwW]$/ { print $3 }' | sort -u >"$work/defined"
wanted=$(wc -l <"$work/wanted")
found=$(comm -12 "$work/wanted" "$work/defined" | wc -l)
echo "$order: $found of its $wanted functions are defined by $bin"
if [ "$wanted" -eq 0 ] || [ $((found * 100)) -lt $((wanted * min_percent)) ]; then
  echo "$order is stale (under ${min_percent} % of its functions are in the binary): run crates/outpost/link/regenerate.sh and commit the file" >&2
  exit 1
fi
