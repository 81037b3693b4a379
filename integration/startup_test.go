package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// Regression: Caddy starts a configuration's apps one after another in
// map order, so its HTTP server may take requests while the toolgate
// app's Start still runs (the cipher, the canary's storage round trip,
// an issuer's JWKS, and only then the MCP sessions' configuration). An
// initialize taken in that window dereferenced the missing configuration
// (a panic; the runner got EOF). Requests taken then now wait for Start.
//
// Start is held here at its JWKS fetch, whose server answers only when the
// test lets it. Whether the HTTP server listens meanwhile depends on the
// order Caddy picked, so the test starts the gateway until it does.
func TestStartingGatewayAnswersRequestsTakenBeforeStart(t *testing.T) {
	up := startUpstream(t)
	for range 12 {
		if startInWindow(t, up) {
			return
		}
	}
	t.Fatal("in 12 starts, Caddy never started its HTTP server before the toolgate app: the window was not tested")
}

// startInWindow starts a gateway whose Start waits on its JWKS and, if its
// HTTP server listens meanwhile, sends an initialize and creates a session
// there, checking both get their answers once Start is let go on. It
// reports whether the window was tested.
func startInWindow(t *testing.T, up *upstream) bool {
	t.Helper()
	held := startHeldAtJWKS(t, up, nil)
	let := held.jwks.letGo
	defer let()
	held.heldAt(t, held.jwks.asked, "fetched its JWKS")
	// Start is held now. The HTTP server listens already, or only after it.
	addr := held.addr
	if !listensSoon(addr) {
		held.stop(t)
		return false
	}

	g := &gateway{URL: "http://" + addr, pool: http.DefaultTransport.(*http.Transport).Clone()}
	defer g.pool.CloseIdleConnections()
	type answer struct {
		status int
		id     string
		err    error
	}
	initialized, created := make(chan answer, 1), make(chan answer, 1)
	go func() {
		m := g.raw(t, aliceKey, "", "svc")
		delete(m.headers, "X-Toolgate-Session")
		resp, err := m.send(context.Background(), http.MethodPost, "application/json, text/event-stream",
			`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, "")
		if err != nil {
			initialized <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		initialized <- answer{status: resp.StatusCode, id: resp.Header.Get("Mcp-Session-Id")}
	}()
	go func() {
		req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions", strings.NewReader(`{"services":["svc"]}`))
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: g.pool}).Do(req)
		if err != nil {
			created <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		var s struct{ ID string }
		_ = json.NewDecoder(resp.Body).Decode(&s)
		created <- answer{status: resp.StatusCode, id: s.ID}
	}()
	// Pacing only: let both requests reach the gateway while Start is held.
	time.Sleep(300 * time.Millisecond)
	let()
	defer held.stop(t)
	if a := <-initialized; a.err != nil || a.status != http.StatusOK || a.id == "" {
		t.Fatalf("an initialize taken while the gateway started: %d (Mcp-Session-Id %q) %v, want 200 with a session", a.status, a.id, a.err)
	}
	if a := <-created; a.err != nil || a.status != http.StatusCreated || a.id == "" {
		t.Fatalf("POST /v1/sessions taken while the gateway started: %d %v, want 201 with an id", a.status, a.err)
	}
	return true
}

// heldStart is a gateway loading while the test goes on, its Start held
// at its identity provider's JWKS fetch until jwks lets it go (or the
// fetch's own 10 s pass).
type heldStart struct {
	addr   string
	jwks   *slowJWKS
	loaded chan error
}

// startHeldAtJWKS loads a gateway for up whose Start will wait on its JWKS;
// edit, when not nil, changes its Caddyfile first (data is its storage
// directory).
func startHeldAtJWKS(t *testing.T, up *upstream, edit func(caddyfile, data string) string) *heldStart {
	t.Helper()
	jwks := startSlowJWKS(t)
	jwks.hold()
	port := freePort(t)
	caddyfile, data := gatewayCaddyfile(t, port, gatewayConfig{Upstream: up.URL, AuthExtra: `jwt {
				issuer   ` + jwks.URL + `
				audience toolgate-test
				jwks_url ` + jwks.URL + `/keys
			}`})
	if edit != nil {
		caddyfile = edit(caddyfile, data)
	}
	return &heldStart{addr: fmt.Sprintf("127.0.0.1:%d", port), jwks: jwks, loaded: loadInBackground(t, caddyfile)}
}

// heldAt waits until a held peer was asked (asked: Start is held there
// now), failing the test if the load ended first or it never was.
func (h *heldStart) heldAt(t *testing.T, asked <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-asked:
	case err := <-h.loaded:
		h.loaded <- err // for stop
		t.Fatalf("the gateway's start ended before it %s (%v)", what, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("the gateway never %s", what)
	}
}

// stop lets Start go on, waits for the load, failing the test on its
// error, and stops Caddy.
func (h *heldStart) stop(t *testing.T) {
	t.Helper()
	h.jwks.letGo()
	if err := <-h.loaded; err != nil {
		t.Fatalf("loading the config: %v", err)
	}
	caddyMu.Lock()
	_ = caddy.Stop()
	caddyMu.Unlock()
}

// loadInBackground adapts caddyfile and has Caddy load it on a goroutine
// of its own, which holds caddyMu meanwhile: the test goes on while the
// apps start. The load's error comes on the channel.
func loadInBackground(t *testing.T, caddyfile string) chan error {
	t.Helper()
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v", err)
	}
	loaded := make(chan error, 1)
	caddyMu.Lock()
	go func() {
		defer caddyMu.Unlock()
		loaded <- caddy.Load(cfgJSON, true)
	}()
	return loaded
}

// slowJWKS is an issuer's JWKS endpoint: it answers an empty key set (or
// the status set, when not 0) and, while held, keeps each request waiting
// until it is let go: an identity provider slow to answer.
type slowJWKS struct {
	*httptest.Server
	asked  chan struct{} // a request came while held
	status atomic.Int32

	mu   sync.Mutex
	held chan struct{} // closed to let go; nil when not held
}

func startSlowJWKS(t testing.TB) *slowJWKS {
	t.Helper()
	j := &slowJWKS{asked: make(chan struct{}, 64)}
	j.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		j.mu.Lock()
		held := j.held
		j.mu.Unlock()
		if held != nil {
			select {
			case j.asked <- struct{}{}:
			default:
			}
			select {
			case <-held:
			case <-r.Context().Done():
			}
		}
		if s := int(j.status.Load()); s != 0 {
			w.WriteHeader(s)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"keys":[]}`)
	}))
	t.Cleanup(func() {
		j.letGo()
		j.Close()
	})
	return j
}

// hold makes the requests that come from now on wait for letGo.
func (j *slowJWKS) hold() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.held == nil {
		j.held = make(chan struct{})
	}
}

// letGo answers the requests held, and holds no more.
func (j *slowJWKS) letGo() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.held != nil {
		close(j.held)
		j.held = nil
	}
}

// listensSoon reports whether addr takes a connection within half a
// second: while the toolgate app's Start is held, whether Caddy started
// its HTTP server first.
func listensSoon(addr string) bool {
	for range 20 {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return true
		}
		time.Sleep(25 * time.Millisecond)
	}
	return false
}
