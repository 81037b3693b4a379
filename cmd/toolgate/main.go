// Command toolgate is Caddy with toolgate's modules: an MCP gateway.
//
//	toolgate run --config caddyfile/demo.Caddyfile
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/toolgate/toolgate"
)

// version is toolgate's version, set when it is built:
//
//	go build -ldflags "-X main.version=$(git describe --always --dirty)" ./cmd/toolgate
//
// (make build does). Without it, the module's version (go install …@v1.2.3)
// or the revision Go recorded stands in.
var version string

func main() {
	caddy.CustomBinaryName = "toolgate"
	caddy.CustomLongDescription = `toolgate is an MCP gateway: Caddy with toolgate's modules. Agent runners
send MCP tool calls to /v1/mcp/{service}; toolgate authenticates them, asks
its policies whether each call may run, injects the caller's upstream
credential, relays the exchange and runs the result policy.

	toolgate run --config Caddyfile       run the gateway in the foreground
	toolgate validate --config Caddyfile  check a configuration without serving
	toolgate reload --config Caddyfile    apply a changed configuration
	toolgate version                      toolgate's version, and Caddy's

Every other command is Caddy's, and works as Caddy's documentation says
(https://caddyserver.com/docs/command-line), but upgrade, add-package and
remove-package, which would put a plain Caddy in this binary's place.`
	// Printed by "toolgate version" before Caddy's own version.
	caddy.CustomVersion = "toolgate " + buildVersion() + ", Caddy"
	if len(os.Args) > 1 && (os.Args[1] == "upgrade" || os.Args[1] == "add-package" || os.Args[1] == "remove-package") {
		// Caddy's: they download a Caddy build from caddyserver.com in
		// place of this binary, which would drop toolgate's modules.
		fmt.Fprintf(os.Stderr, "toolgate %s: toolgate is built from its own source with the modules it needs; build a new binary instead (make build, or go build ./cmd/toolgate)\n", os.Args[1])
		os.Exit(2)
	}
	if len(os.Args) > 1 && os.Args[1] == "reload" {
		// A reload applies the files the configuration names (api_keys,
		// key files, {file.*} secrets) also when the Caddyfile itself is
		// unchanged: Caddy alone skips a reload whose adapted
		// configuration is the same, so a revoked API key would go on
		// working.
		os.Args = append(os.Args, "--force")
	}
	caddycmd.Main()
}

// buildVersion is toolgate's version as far as the build recorded it.
func buildVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	switch {
	case rev == "":
		return "(devel)"
	case dirty:
		return rev + "-dirty"
	}
	return rev
}
