// Package testcaddy runs a Caddy configuration in the test's own process,
// for unit tests of a module that need the whole gateway around it (its
// routes, the toolgate app, other modules) without a peer process.
package testcaddy

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile" // the Caddyfile adapter
)

// Load adapts caddyfile, runs it, and waits until GET probe answers
// through client (any status; "": a configuration that serves nothing);
// the configuration stops when the test ends. Caddy runs one configuration per process: tests that call Load
// must not run in parallel.
func Load(t testing.TB, caddyfile, probe string, client *http.Client) {
	t.Helper()
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting the Caddyfile: %v", err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading the config: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	for i := 0; probe != ""; i++ {
		resp, err := client.Get(probe)
		if err == nil {
			resp.Body.Close()
			return
		}
		if i == 100 {
			t.Fatalf("the gateway does not answer %s: %v", probe, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
