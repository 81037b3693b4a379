package integration

// Attacks on the configuration and administration surface: config loads
// and reloads with bad or hostile values, secrets in config, the admin
// routes of toolgate's own API (tool pins, approvals), and the operators'
// commands. Tests whose comment starts with "Attack" describe what an
// attack would get through without the defence the test checks (each
// failed before its fix); those starting with "Holds" show attacks the
// design resists.

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

const adminOtherSecret = "another-state-secret-of-a-refused-config-0123456789"

// Attack: an operator reloads with a configuration that is refused (here a
// site whose port another process holds, so the http app cannot start; any
// app that fails to start after the toolgate app started does the same).
// Caddy keeps the running configuration — yet the refused one's toolgate
// App.Start already ran mcpSessions.Attach (modules/gateway/app.go:465),
// which swaps the process-wide MCP session pool's configuration
// (internal/mcpsession/sessions.go:141, "c stays in force until another
// configuration is attached"); App.Stop's Detach (app.go:539,
// sessions.go:150) does not swap it back. From then on the running gateway
// opens and seals Mcp-Session-Ids with the refused config's state_secret,
// reads MCP session state from its storage and applies its limits: every
// MCP session of the running config is "not found". A refused reload must
// change nothing. (Other OnStart hooks do the same: a shared policy engine
// takes the refused config's logger, modules/policy/policy.go:194.)
func TestAdminAttackRefusedReloadRekeysRunningMCPSessions(t *testing.T) {
	cfg := gatewayConfig{Extra: "state_secret " + testStateSecret}
	_, _, m := aliceSession(t, cfg)
	if got := mustSucceed(t, m.call(1, "echo", `{"text":"before"}`)); !strings.Contains(got, "before") {
		t.Fatalf("the control: %s", got)
	}

	// A port someone else holds (no SO_REUSEPORT): the refused config's
	// only site cannot listen there.
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	blocked := held.Addr().(*net.TCPAddr).Port

	bad := cfg
	bad.Upstream = "http://127.0.0.1:1/mcp"
	bad.DataDir = t.TempDir()
	bad.Extra = "state_secret " + adminOtherSecret
	// Caddy starts its apps in map order: the toolgate app starts before
	// the failing http app in about half the attempts.
	for attempt := 0; attempt < 24; attempt++ {
		if err := tryLoadGateway(t, blocked, bad); err == nil {
			t.Fatal("a config whose site cannot listen was loaded")
		}
		answer := m.call(10+attempt, "echo", `{"text":"after"}`)
		if !strings.Contains(string(answer), `after`) {
			t.Fatalf("after refused reload %d, the running gateway's MCP session no longer works: %s", attempt+1, answer)
		}
	}
}

// Attack: the same API key listed twice, for two people — an inline
// api_key line and an api_keys file entry, or two lines left over from a
// key rotation — is accepted without a word, and the later line silently
// wins (modules/gateway/auth.go:162, a.keys[sum] = k overwrites). Here a
// stale line hands alice's key to mallory's identity and the admins group:
// whoever holds alice's key now acts as mallory, an administrator (tool
// pins), and alice's own sessions are no longer hers. A configuration
// whose keys are ambiguous must be refused, naming both users.
func TestAdminAttackDuplicateAPIKeySilentlyChangesIdentity(t *testing.T) {
	port := freePort(t)
	cfg := gatewayConfig{Upstream: "http://127.0.0.1:1/mcp",
		AuthExtra: "api_key " + hashKey(aliceKey) + " mallory@example.test admins"}
	err := tryLoadGateway(t, port, cfg)
	if err == nil {
		t.Cleanup(func() {
			caddyMu.Lock()
			defer caddyMu.Unlock()
			_ = caddy.Stop()
		})
		g := &gateway{URL: "http://127.0.0.1:" + caItoa(port)}
		waitListening(t, g.URL)
		resp := g.api(t, http.MethodGet, "/v1/tool-pins", aliceKey, nil)
		t.Fatalf("a config giving one API key to alice and to mallory (admins) was loaded; alice's key now lists tool pins as an admin: %d %s",
			resp.StatusCode, resp.Body)
	}
	if !strings.Contains(err.Error(), "mallory@example.test") || !strings.Contains(err.Error(), alice) {
		t.Errorf("refused, but the error does not name both users: %v", err)
	}
}

// Attack: an operator writes the upstream's URL with credentials in it
// (or from an environment variable that holds them) and mistypes it. The
// registry means to refuse credentials in URLs without repeating them
// ("must not carry credentials; use auth instead"), but a URL that does not
// parse is reported first with url.Parse's own error, which quotes the
// whole URL, password included (modules/gateway/registry.go:283,
// fail("url", "%v", err)). The error goes to the operator's terminal, the
// admin API's answer and Caddy's log.
func TestAdminAttackUnparsableServiceURLEchoesItsPassword(t *testing.T) {
	const password = "upstream-password-s3cr3t"
	cfg := gatewayConfig{Upstream: "http://127.0.0.1:1/mcp",
		Services: "service creds {\n\t\t\turl https://svc:" + password + "@upstream.example/%zz/mcp\n\t\t\ttools echo\n\t\t}"}
	err := tryLoadGateway(t, freePort(t), cfg)
	if err == nil {
		t.Fatal("a service whose url does not parse was loaded")
	}
	if !strings.Contains(err.Error(), "creds") {
		t.Fatalf("the error does not name the service: %v", err)
	}
	if strings.Contains(err.Error(), password) {
		t.Errorf("the refusal shows the URL's password: %v", err)
	}
}

// ---------------------------------------------------------------------------
// Holds
// ---------------------------------------------------------------------------

// Holds: an API key removed by a reload stops working at once, also on the
// MCP session it initialized (every request authenticates again; nothing
// is cached by the session), and its owner's other key keeps the session.
func TestAdminHoldsRevokedKeyEndsItsMCPSession(t *testing.T) {
	const revocable = "test-key-alice-second"
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, AuthExtra: "api_key " + hashKey(revocable) + " " + alice}
	g := startGatewayOnPort(t, port, cfg)
	sess := g.createSession(t, revocable, "svc")
	m := g.raw(t, revocable, sess, "svc")
	m.initialize()
	mustSucceed(t, m.call(1, "echo", `{"text":"before"}`))

	cfg.AuthExtra = ""
	cfg.DataDir = g.DataDir
	g2 := startGatewayOnPort(t, port, cfg)
	m.transport = g2.transport()
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`)
	if status != http.StatusUnauthorized {
		t.Errorf("the revoked key's MCP session after the reload: %d %s; want 401", status, msgs)
	}
	if n := up.upstreamCalls("echo"); n != 1 {
		t.Errorf("the upstream got %d echo calls; want only the one before the revocation", n)
	}
	// The same person's remaining key still reaches the session.
	m.headers["Authorization"] = "Bearer " + aliceKey
	mustSucceed(t, m.call(3, "echo", `{"text":"alice's other key"}`))
}

// Holds: toolgate's API takes only a bearer token, never the console's
// cookie, so a hostile page that makes a signed-in browser POST to it
// (a "simple" cross-site request: text/plain, no preflight) gets nothing:
// no session is created, no approval decided.
func TestAdminHoldsAPIIgnoresConsoleCookieCrossSite(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp"})
	browser := g.signedIn(t, aliceKey)
	// The control: where a session created through the API is stored.
	g.createSession(t, bobKey, "svc")
	if entries, _ := os.ReadDir(filepath.Join(g.DataDir, "toolgate", "sessions")); len(entries) != 1 {
		t.Fatalf("the control: %d stored sessions, want bob's one", len(entries))
	}
	for _, origin := range []string{"http://evil.example", g.URL} {
		for _, route := range []string{"/v1/sessions", "/v1/approvals/AAAAAAAAAAAAAAAAAAAAAA/approve", "/v1/tool-pins/accept"} {
			req, _ := http.NewRequest(http.MethodPost, g.URL+route, strings.NewReader(`{"services":["svc"]}`))
			req.Header.Set("Content-Type", "text/plain")
			req.Header.Set("Origin", origin)
			resp, err := browser.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
				t.Errorf("POST %s from %s with alice's console cookie: %d; want 401 or 403", route, origin, resp.StatusCode)
			}
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(g.DataDir, "toolgate", "sessions")); len(entries) != 1 {
		t.Errorf("the cross-site posts created %d toolgate sessions", len(entries)-1)
	}
}

// Holds: the admin route of the API answers non-admins 403 whatever they
// send, and malformed, oversized or smuggled bodies (unknown fields, two
// objects, 1 MiB) are refused with 400 before anything is read from or
// written to storage, also for an admin.
func TestAdminHoldsToolPinRoutesRefuseNonAdminsAndBadBodies(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp"})
	before := storageFiles(t, g.DataDir)
	for _, key := range []string{aliceKey, bobKey} {
		if resp := g.api(t, http.MethodGet, "/v1/tool-pins", key, nil); resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET /v1/tool-pins as a non-admin: %d %s", resp.StatusCode, resp.Body)
		}
		if resp := g.api(t, http.MethodPost, "/v1/tool-pins/accept", key, []byte(`{"service":"svc","tool":"echo","digest":"sha256:00"}`)); resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST /v1/tool-pins/accept as a non-admin: %d %s", resp.StatusCode, resp.Body)
		}
	}
	for name, body := range map[string]string{
		"unknown field": `{"service":"svc","tool":"echo","digest":"sha256:00","by":"alice"}`,
		"two objects":   `{"service":"svc","tool":"echo","digest":"x"}{"service":"svc"}`,
		"not an object": `["svc"]`,
		"oversized":     `{"service":"` + strings.Repeat("a", 1<<20) + `"}`,
	} {
		if resp := g.api(t, http.MethodPost, "/v1/tool-pins/accept", carolKey, []byte(body)); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s, as an admin: %d %.200s; want 400", name, resp.StatusCode, resp.Body)
		}
	}
	// Method confusion: the route exists for POST only.
	if resp := g.api(t, http.MethodPut, "/v1/tool-pins/accept", carolKey, []byte(`{}`)); resp.StatusCode == http.StatusOK {
		t.Errorf("PUT /v1/tool-pins/accept: %d", resp.StatusCode)
	}
	if after := storageFiles(t, g.DataDir); len(after) != len(before) {
		t.Errorf("refused admin requests changed storage: %d files before, %d after", len(before), len(after))
	}
}

// Holds: toolgate validate (Caddy's Validate: every module provisioned,
// then cleaned up) on a config with a local cipher and a fresh data
// directory creates neither the key file nor anything in storage.
func TestAdminHoldsValidateWritesNothing(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "keys", "cipher.key")
	caddyfile, _ := gatewayCaddyfile(t, freePort(t), gatewayConfig{Upstream: "http://127.0.0.1:1/mcp",
		DataDir: filepath.Join(dir, "data"), Cipher: "local " + keyFile})
	if err := validateCaddyfile(t, caddyfile); err != nil {
		t.Fatalf("validate: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		t.Errorf("validate created %s", e.Name())
	}
}

// Holds: a postgres storage whose DSN does not parse (a bad port, an
// unterminated quote, a bad percent escape, a bad pool option) is refused
// with an error that never shows the password, in URL or keyword/value
// form.
func TestAdminHoldsPostgresDSNErrorsHidePassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u:pw-SECRET-1@h:notaport/db",
		"host=h password='pw-SECRET-2 port=5432",
		"postgres://u:pw%zz-SECRET-3@h/db",
		"host=h password=pw-SECRET-4 pool_max_conns=x",
	} {
		caddyfile, data := gatewayCaddyfile(t, freePort(t), gatewayConfig{Upstream: "http://127.0.0.1:1/mcp"})
		caddyfile = strings.Replace(caddyfile, "storage file_system "+data,
			"storage postgres {\n\t\t\tdsn \""+dsn+"\"\n\t\t}", 1)
		cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
		if err == nil {
			caddyMu.Lock()
			err = caddy.Load(cfgJSON, true)
			caddyMu.Unlock()
		}
		switch {
		case err == nil:
			t.Errorf("a config with the DSN %q was loaded", dsn)
		case !strings.Contains(err.Error(), "dsn"):
			t.Errorf("%q refused for another reason: %v", dsn, err)
		case strings.Contains(err.Error(), "SECRET"):
			t.Errorf("the refusal of a DSN shows its password: %v", err)
		}
	}
}

// Attack (fixed): a route naming a service the registry does not define
// (`toolgate_registry trackr`, a typo of tracker) passed toolgate validate
// and answered every request with 404 "unknown service".
// Fixed: toolgate_registry refuses, when provisioned, a literal service id
// (not a placeholder) that the registry does not define.
func TestAdminAttackRouteNamingAnUndefinedService(t *testing.T) {
	caddyfile, _ := gatewayCaddyfile(t, freePort(t), gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", DataDir: t.TempDir()})
	if !strings.Contains(caddyfile, "toolgate_registry\n") {
		t.Fatalf("the test gateway's route has no toolgate_registry line:\n%s", caddyfile)
	}
	validate := func(caddyfile string) error { return validateCaddyfile(t, caddyfile) }
	if err := validate(strings.Replace(caddyfile, "toolgate_registry\n", "toolgate_registry svc\n", 1)); err != nil {
		t.Fatalf("a route naming a defined service: %v", err)
	}
	if err := validate(strings.Replace(caddyfile, "toolgate_registry\n", "toolgate_registry {http.request.uri.path.2}\n", 1)); err != nil {
		t.Fatalf("a route naming its service with a placeholder: %v", err)
	}
	err := validate(strings.Replace(caddyfile, "toolgate_registry\n", "toolgate_registry trackr\n", 1))
	if err == nil || !strings.Contains(err.Error(), `"trackr" is not defined`) {
		t.Fatalf("a route naming an undefined service: %v", err)
	}
}
