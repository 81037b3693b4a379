package postgres

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/caddypki"
	_ "github.com/caddyserver/caddy/v2/modules/caddytls"
)

// TestCaddyTLSData runs Caddy with this module as its global storage and
// a certificate to obtain from Caddy's internal CA: the CA and the
// certificate land in the table, and certmagic took its lock through this
// module (the fencing sequence advanced).
func TestCaddyTLSData(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	dsn, table := sharedDSN(t, "caddy_tls"), newTableName()
	cfg := fmt.Sprintf(`{
		"admin": {"disabled": true},
		"storage": {"module": "postgres", "dsn": %q, "table": %q},
		"apps": {
			"pki": {"certificate_authorities": {"local": {"install_trust": false}}},
			"tls": {
				"certificates": {"automate": ["pgstore.test"]},
				"automation": {"policies": [{"subjects": ["pgstore.test"], "issuers": [{"module": "internal"}]}]}
			}
		}
	}`, dsn, table)
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatalf("loading Caddy: %v", err)
	}
	defer func() {
		if err := caddy.Stop(); err != nil {
			t.Error(err)
		}
	}()
	s := newStorage(t, dsn, table, DefaultLockLease)
	var keys []string
	waitFor(t, "certificate stored", func() bool {
		keys, _ = s.List(t.Context(), "", true)
		for _, k := range keys {
			if strings.HasSuffix(k, "/pgstore.test.crt") {
				return true
			}
		}
		return false
	})
	var ca bool
	for _, k := range keys {
		ca = ca || strings.HasPrefix(k, "pki/authorities/local/")
	}
	if !ca {
		t.Errorf("no internal CA in storage: %q", keys)
	}
	var called bool
	query(t, dsn, fmt.Sprintf("select is_called from %s_fence", table), nil, &called)
	if !called {
		t.Error("no lock was taken through the storage while obtaining the certificate")
	}
}
