// Command toolgate is Caddy with toolgate's modules: an MCP gateway.
//
//	toolgate run --config caddyfile/demo.Caddyfile
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/toolgate/toolgate"
)

func main() {
	caddycmd.Main()
}
