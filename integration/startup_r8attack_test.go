package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/toolgate/toolgate/internal/pgtest"
)

// Attack (fixed; change 1, 274a6e3): a reload while the identity
// provider is slow. Caddy listens with SO_REUSEPORT, so from the moment a
// reload's HTTP app starts, the kernel hands part of the new connections
// to the new configuration's server, whose handlers wait for the new
// toolgate app's Start (App.Started, at most 10 s) and then answer 503.
// The new Start refetched every issuer's JWKS synchronously (up to 10 s
// each), although on a reload the key set is shared with the
// configuration in force and already holds the keys: during an IdP
// hiccup, every request the kernel gave the new server (fresh
// connections, as a load balancer opens them) waited 10 s and was refused
// 503, while the configuration in force served the others at once.
// Severity: low–medium (availability at every reload with a slow IdP).
// Fixed: Start fetches only a key set no fetch has filled yet; lookups
// refetch a shared one when due. The reload no longer waits on the JWKS,
// and every request is served.
func TestR8ReloadWithSlowIdPServesEveryRequest(t *testing.T) {
	up := startUpstream(t)
	jwks := startSlowJWKS(t)

	port := freePort(t)
	caddyfile, _ := gatewayCaddyfile(t, port, gatewayConfig{Upstream: up.URL, AuthExtra: `jwt {
				issuer   ` + jwks.URL + `/a
				audience toolgate-test
				jwks_url ` + jwks.URL + `/a/keys
			}
			jwt {
				issuer   ` + jwks.URL + `/b
				audience toolgate-test
				jwks_url ` + jwks.URL + `/b/keys
			}`})
	loadCaddyfile(t, caddyfile)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitListening(t, base)
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}

	type answer struct {
		status int
		body   string
		err    error
	}
	catalog := func() answer {
		tr := &http.Transport{DisableKeepAlives: true} // a fresh connection: the kernel picks a server
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/catalog", nil)
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		resp, err := (&http.Client{Transport: tr, Timeout: 60 * time.Second}).Do(req)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, body: string(b)}
	}
	if a := catalog(); a.status != http.StatusOK {
		t.Fatalf("setup: the catalog before the reload: %d %s %v", a.status, a.body, a.err)
	}

	jwks.hold()
	defer jwks.letGo()
	loaded := make(chan error, 1)
	caddyMu.Lock()
	go func() {
		defer caddyMu.Unlock()
		loaded <- caddy.Load(cfgJSON, true)
	}()
	// Requests on fresh connections while the reload runs, and after it:
	// the kernel gives them to either configuration's server.
	const n = 8
	answers := make(chan answer, n)
	for range n {
		go func() { answers <- catalog() }()
	}
	select {
	case err := <-loaded:
		if err != nil {
			t.Fatalf("the reload: %v", err)
		}
	case <-jwks.asked:
		t.Fatal("the reload fetched the JWKS the configuration in force holds: its Start waits on a slow issuer")
	case <-time.After(60 * time.Second):
		t.Fatal("the reload did not finish while the issuer was slow")
	}
	for range n {
		go func() { answers <- catalog() }()
	}
	for range 2 * n {
		if a := <-answers; a.err != nil || a.status != http.StatusOK {
			t.Fatalf("a catalog request during a reload while the issuer was slow: %d %q %v; want every request served",
				a.status, strings.TrimSpace(a.body), a.err)
		}
	}
}

// r8HoldingProxy relays TCP connections to a real PostgreSQL at target;
// while hold is set, it keeps each new connection waiting, before it
// dials the database, until release is closed: a database slow to answer.
type r8HoldingProxy struct {
	addr    string
	hold    atomic.Bool
	asked   chan struct{}
	mu      sync.Mutex
	release chan struct{}
}

func r8StartHoldingProxy(t *testing.T, target string) *r8HoldingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &r8HoldingProxy{addr: l.Addr().String(), asked: make(chan struct{}, 64), release: make(chan struct{})}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.relay(c, target)
		}
	}()
	return p
}

// holdAgain makes the connections opened from now on wait, and returns
// what lets them, and those waiting already, through.
func (p *r8HoldingProxy) holdAgain() (let func()) {
	rel := make(chan struct{})
	p.mu.Lock()
	p.release = rel
	p.mu.Unlock()
	for len(p.asked) > 0 {
		<-p.asked
	}
	p.hold.Store(true)
	return func() {
		p.hold.Store(false)
		select {
		case <-rel:
		default:
			close(rel)
		}
	}
}

func (p *r8HoldingProxy) relay(c net.Conn, target string) {
	defer c.Close()
	if p.hold.Load() {
		select {
		case p.asked <- struct{}{}:
		default:
		}
		p.mu.Lock()
		rel := p.release
		p.mu.Unlock()
		<-rel
	}
	db, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer db.Close()
	go func() {
		io.Copy(db, c)
		db.Close()
	}()
	io.Copy(c, db)
}

// Held (change 1, 274a6e3 with ffdd034): Start failing after the HTTP app
// started. The gateway's postgres storage names a role the database does
// not have (SQLSTATE 28000), its connection held at CheckAtStart, by a
// proxy in front of the database, until the test lets it through; when Caddy started its HTTP server
// first, an initialize, POST /v1/sessions and a console page are sent
// meanwhile. They waited for Start and, once it failed, were answered 503
// with Retry-After (no EOF, so no handler panicked), and Caddy refused the
// configuration in the database's words.
func TestR8StartFailingAfterHTTPStartedAnswersWaiters503(t *testing.T) {
	up := startUpstream(t)
	pg := r8StartHoldingProxy(t, fmt.Sprintf("127.0.0.1:%d", pgtest.Shared(t).Port))
	for attempt := range 12 {
		if r8FailInWindow(t, up, pg) {
			t.Logf("the window was tested at start %d", attempt+1)
			return
		}
	}
	t.Fatal("in 12 starts, Caddy never started its HTTP server before the toolgate app: the window was not tested")
}

func r8FailInWindow(t *testing.T, up *upstream, pg *r8HoldingProxy) bool {
	t.Helper()
	let := pg.holdAgain()
	defer let()

	port := freePort(t)
	caddyfile, data := gatewayCaddyfile(t, port, gatewayConfig{Upstream: up.URL})
	caddyfile = strings.Replace(caddyfile, "storage file_system "+data,
		"storage postgres postgres://no_such_role:some-pw@"+pg.addr+"/postgres?sslmode=disable", 1)
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v", err)
	}
	loaded := make(chan error, 1)
	caddyMu.Lock()
	go func() {
		defer caddyMu.Unlock()
		err := caddy.Load(cfgJSON, true)
		_ = caddy.Stop()
		loaded <- err
	}()
	select {
	case <-pg.asked:
	case err := <-loaded:
		t.Fatalf("the gateway's start ended without asking the database (%v)", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway never asked the database")
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if !listensSoon(addr) {
		let()
		if err := <-loaded; err == nil {
			t.Fatal("a gateway whose database refuses its password started")
		}
		return false
	}

	type answer struct {
		what   string
		status int
		retry  string
		err    error
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	send := func(what, method, path, body string) answer {
		req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
		}
		resp, err := client.Do(req)
		if err != nil {
			return answer{what: what, err: err}
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return answer{what: what, status: resp.StatusCode, retry: resp.Header.Get("Retry-After")}
	}
	answers := make(chan answer, 3)
	go func() {
		answers <- send("initialize", http.MethodPost, "/v1/mcp/svc",
			`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	}()
	go func() { answers <- send("POST /v1/sessions", http.MethodPost, "/v1/sessions", `{"services":["svc"]}`) }()
	go func() { answers <- send("GET /console/", http.MethodGet, "/console/", "") }()
	// Pacing only: let the requests reach the gateway while Start is held.
	time.Sleep(300 * time.Millisecond)
	let()
	for range 3 {
		a := <-answers
		if a.err != nil || a.status != http.StatusServiceUnavailable || a.retry == "" {
			t.Errorf("%s taken while a start that then failed was under way: %d (Retry-After %q) %v; want 503 with Retry-After", a.what, a.status, a.retry, a.err)
		}
	}
	err = <-loaded
	t.Logf("the configuration was refused: %v", err)
	if err == nil || !strings.Contains(err.Error(), "SQLSTATE 28000") || strings.Contains(err.Error(), "some-pw") {
		t.Errorf("the configuration whose database has no such role: %v; want it refused in the database's words, without the password", err)
	}
	return true
}
