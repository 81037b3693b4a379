#!/usr/bin/env bash
# Builds the Vault binary used by toolgate's integration tests (HashiCorp
# Vault's own command, see main.go) once, and prints its absolute path on
# stdout. Everything else goes to stderr.
#
#   export TOOLGATE_VAULT_BIN=$(integration/vaultserver/build.sh)
#
# The binary is cached as
#   ${TOOLGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolgate}/vault-<first 16 hex of sha256(go.sum)>
# and not rebuilt while that file exists. A build from empty Go caches takes
# several minutes.
set -euo pipefail

die() {
	echo "vaultserver/build.sh: $*" >&2
	exit 1
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" || die "cannot find the script's directory"
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
bin="$cache/vault-$sum"

if [[ -f "$bin" ]]; then
	[[ -x "$bin" ]] || die "$bin exists but is not executable; delete it to rebuild"
	echo "$bin"
	exit 0
fi

echo "building vault (github.com/hashicorp/vault, see $here/go.mod) into $bin; this takes minutes from empty caches" >&2
tmp="$(mktemp "$cache/.vault-$sum.XXXXXX")" || die "cannot create a temporary file in $cache"
trap 'rm -f "$tmp"' EXIT
(
	cd "$here"
	GOWORK=off go build -mod=readonly -buildvcs=false -o "$tmp" .
) >&2 || die "go build failed (see above)"
chmod +x "$tmp"
"$tmp" version >&2 || die "the built binary does not run"
mv -f "$tmp" "$bin" || die "cannot move the binary to $bin"
trap - EXIT
echo "built $bin" >&2
echo "$bin"
