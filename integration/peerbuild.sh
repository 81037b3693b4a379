#!/usr/bin/env bash
# Builds a test peer from a wrapper module under integration/ once, and
# prints the binary's absolute path on stdout. Everything else goes to
# stderr. Used by vaultserver/build.sh and kmsserver/build.sh:
#
#   peerbuild.sh <module dir> <name> [<arguments of a smoke run>...]
#
# The binary is cached as
#   ${TOOLGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolgate}/<name>-<first 16 hex of sha256(go.sum)>
# and not rebuilt while that file exists. After a build, the binary is run
# once with the smoke-run arguments (for example "version") to check that it
# starts.
set -euo pipefail

die() {
	echo "peerbuild.sh: $*" >&2
	exit 1
}

[[ $# -ge 2 ]] || die "usage: peerbuild.sh <module dir> <name> [<smoke-run arguments>...]"
here="$(cd "$1" && pwd)" || die "cannot enter $1"
name="$2"
shift 2
command -v go >/dev/null || die "go is not on PATH"

if command -v sha256sum >/dev/null; then
	sum="$(sha256sum "$here/go.sum")" || die "cannot hash $here/go.sum"
elif command -v shasum >/dev/null; then
	sum="$(shasum -a 256 "$here/go.sum")" || die "cannot hash $here/go.sum"
else
	die "need sha256sum or shasum"
fi
sum="${sum:0:16}"

cache="${TOOLGATE_CACHE:-${XDG_CACHE_HOME:-${HOME:?HOME is not set; set TOOLGATE_CACHE}/.cache}/toolgate}"
mkdir -p "$cache" || die "cannot create cache directory $cache"
cache="$(cd "$cache" && pwd)" || die "cannot enter cache directory $cache"
bin="$cache/$name-$sum"

if [[ -f "$bin" ]]; then
	[[ -x "$bin" ]] || die "$bin exists but is not executable; delete it to rebuild"
	echo "$bin"
	exit 0
fi

echo "building $name (see $here/go.mod) into $bin; this can take minutes from empty caches" >&2
tmp="$(mktemp "$cache/.$name-$sum.XXXXXX")" || die "cannot create a temporary file in $cache"
trap 'rm -f "$tmp"' EXIT
(
	cd "$here"
	GOWORK=off go build -mod=readonly -buildvcs=false -o "$tmp" .
) >&2 || die "go build of $name failed (see above)"
chmod +x "$tmp"
"$tmp" "$@" >&2 || die "the built $name binary does not run"
mv -f "$tmp" "$bin" || die "cannot move the binary to $bin"
trap - EXIT
echo "built $bin" >&2
echo "$bin"
