#!/usr/bin/env bash
# Builds the KMS server used by toolgate's tests (Local KMS behind a
# loopback-only main, see main.go) once, and prints its absolute path on
# stdout. Everything else goes to stderr.
#
#   export TOOLGATE_KMS_BIN=$(integration/kmsserver/build.sh)
#
# The binary is cached as
#   ${TOOLGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolgate}/kmsserver-<first 16 hex of sha256(go.sum)>
# and not rebuilt while that file exists (see ../peerbuild.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/../peerbuild.sh" "$here" kmsserver -version
