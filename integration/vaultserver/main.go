// Command vaultserver is HashiCorp Vault's own command line, built from
// github.com/hashicorp/vault so that toolgate's integration tests can start a
// real Vault dev server (`vaultserver server -dev …`) without a separately
// installed Vault.
//
// It lives in its own module so that the main toolgate module never depends
// on Vault's server code. Build it with build.sh, which caches the binary and
// prints its path:
//
//	export TOOLGATE_VAULT_BIN=$(integration/vaultserver/build.sh)
package main

import (
	"os"

	"github.com/hashicorp/vault/command"
)

func main() {
	os.Exit(command.Run(os.Args[1:]))
}
