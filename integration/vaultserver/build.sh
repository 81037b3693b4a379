#!/usr/bin/env bash
# Builds the Vault binary used by toolgate's integration tests (HashiCorp
# Vault's own command, see main.go) once, and prints its absolute path on
# stdout. Everything else goes to stderr.
#
#   export TOOLGATE_VAULT_BIN=$(integration/vaultserver/build.sh)
#
# The binary is cached as
#   ${TOOLGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolgate}/vault-<first 16 hex of sha256(go.sum)>
# and not rebuilt while that file exists (see ../peerbuild.sh). A build from
# empty Go caches takes several minutes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/../peerbuild.sh" "$here" vault version
