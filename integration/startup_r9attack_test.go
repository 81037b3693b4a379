package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// Attack (fixed; change 2, 6a23c34: "at Start, a JWKS is fetched only when the
// shared key set was never fetched successfully"): the identity provider
// is having an outage — its JWKS answered HTTP 500 when the gateway
// started, so the shared key set was never filled — and the operator
// reloads the configuration meanwhile (any change: a new API key, a
// service). The reload's Start sees a set never fetched and fetches it
// synchronously, up to jwksFetchTimeout (10 s) per issuer, while the IdP
// hangs. Caddy listens with SO_REUSEPORT: from the moment the reload's
// HTTP app starts, the kernel gives part of the new connections to the
// new server, whose handlers wait for the toolgate app's Start
// (App.Started) — every request, API-key callers' too, not only the
// issuer's.
//
// What happened: the reload's Start fetched the JWKS the configuration in
// force shares and waited on the hanging issuer until its fetch gave up
// (10 s; the Start's own "cannot fetch JWKS" warning is logged a second
// time), so the requests the new server took meanwhile waited on the IdP:
// what 274a6e3/6a23c34 set out to stop, left in the case where it matters
// most (an IdP outage, during which operators reload).
// Severity: low–medium (availability at a reload during an IdP outage;
// the same as the r8 finding, for a set the configuration in force could
// not fill).
// Suggested fix (done; the code says how): fetch synchronously only a key set no configuration in
// force shares (jwksPool.LoadOrNew's loaded is false); on a reload start
// the fetch in the background (keySet.startFetch) and do not wait.
func TestR9ReloadDuringAnIdPOutageDoesNotWait(t *testing.T) {
	up := startUpstream(t)
	jwks := startSlowJWKS(t)
	jwks.status.Store(http.StatusInternalServerError) // the IdP's outage

	logFile := filepath.Join(t.TempDir(), "r9.log")
	port := freePort(t)
	caddyfile, _ := gatewayCaddyfile(t, port, gatewayConfig{Upstream: up.URL, Log: "output file " + logFile + "\n\t\tlevel WARN",
		AuthExtra: `jwt {
				issuer   ` + jwks.URL + `/a
				audience toolgate-test
				jwks_url ` + jwks.URL + `/a/keys
			}`})
	loadCaddyfile(t, caddyfile)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitListening(t, base)
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	// What a Start that fetched the JWKS and failed says (AuthConfig.start).
	const startFetchFailed = "cannot fetch JWKS; JWTs from this issuer are rejected until it succeeds"
	startFetches := func() int {
		b, _ := os.ReadFile(logFile)
		return strings.Count(string(b), startFetchFailed)
	}
	if n := startFetches(); n != 1 {
		t.Fatalf("setup: the first start, the IdP answering 500, logged %d failed fetches; want 1", n)
	}

	// The outage goes on (the IdP now hangs) and the operator reloads;
	// the IdP is let go only once the reload is done.
	jwks.hold()
	defer jwks.letGo()
	loaded := make(chan error, 1)
	caddyMu.Lock()
	go func() {
		defer caddyMu.Unlock()
		loaded <- caddy.Load(cfgJSON, true)
	}()
	select {
	case err := <-loaded:
		if err != nil {
			t.Fatalf("the reload: %v", err)
		}
	case <-time.After(120 * time.Second):
		t.Fatal("the reload did not finish while the issuer hung")
	}
	if n := startFetches(); n > 1 {
		t.Fatalf("the reload's Start fetched the JWKS the configuration in force shares (never filled: the IdP's outage) and "+
			"waited on the hanging issuer until the fetch gave up (%d failed start fetches logged): every request the new server "+
			"took meanwhile waited for it", n)
	}
}
