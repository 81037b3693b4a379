// Package toolgate pulls in every toolgate Caddy module. Build a custom Caddy
// with it (xcaddy build --with github.com/toolgate/toolgate) or use the
// toolgate command in cmd/toolgate.
package toolgate

import (
	_ "github.com/toolgate/toolgate/modules/api"
	_ "github.com/toolgate/toolgate/modules/ciphers/kms"
	_ "github.com/toolgate/toolgate/modules/ciphers/local"
	_ "github.com/toolgate/toolgate/modules/ciphers/vaulttransit"
	_ "github.com/toolgate/toolgate/modules/console"
	_ "github.com/toolgate/toolgate/modules/credentials"
	_ "github.com/toolgate/toolgate/modules/demo"
	_ "github.com/toolgate/toolgate/modules/federation"
	_ "github.com/toolgate/toolgate/modules/gateway"
	_ "github.com/toolgate/toolgate/modules/mcpproxy"
	_ "github.com/toolgate/toolgate/modules/policy"
	_ "github.com/toolgate/toolgate/modules/registry"
	_ "github.com/toolgate/toolgate/modules/session"
	_ "github.com/toolgate/toolgate/modules/storage/postgres"
	_ "github.com/toolgate/toolgate/modules/upstreams/sse"
	_ "github.com/toolgate/toolgate/modules/upstreams/stdio"
)
