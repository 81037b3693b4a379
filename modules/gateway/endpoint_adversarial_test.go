package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/http/httpproxy"
)

// advService is a Streamable HTTP service at raw, provisioned, after
// checking that the configuration would be accepted (allow_http on).
func advService(t *testing.T, raw string) *Service {
	t.Helper()
	s := provisioned(t, &Service{ID: "s", URL: raw, AllowHTTP: true, Tools: []string{"t"}})
	if err := s.validate(); err != nil {
		t.Fatalf("%s is refused: %v", raw, err)
	}
	return s
}

// advEndpoint is the Endpoint of a service at raw (advService).
func advEndpoint(t *testing.T, raw string) string {
	t.Helper()
	return advService(t, raw).Endpoint()
}

// advRecorder is an HTTP server that notes which upstream session ids
// reached it, and with which request target and Host header.
type advRecorder struct {
	*httptest.Server
	mu  sync.Mutex
	got []string
}

func newAdvRecorder(t *testing.T, h func(r *http.Request) string) *advRecorder {
	rec := &advRecorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.got = append(rec.got, h(r)+" "+r.Header.Get("Mcp-Session-Id"))
		rec.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (rec *advRecorder) seen() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.got...)
}

// advPost sends what toolgate_proxy sends in a session (mcpproxy attempt:
// http.NewRequest with the service's url as provisioned, Mcp-Session-Id)
// through rt, for a service configured with url raw.
func advPost(t *testing.T, rt http.RoundTripper, raw, session string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, advService(t, raw).URL, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Mcp-Session-Id", session)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("POST %s: %v", raw, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// Attack (fixed): the upstream client toolgate uses (newUpstreamTransport, a clone
// of http.DefaultTransport) takes its proxy from the environment
// (http.ProxyFromEnvironment), which never proxies "localhost" — but it
// compares the host with "localhost" case-sensitively (httpproxy
// useProxy), so "LOCALHOST" goes to HTTP_PROXY unless NO_PROXY lists it.
// With HTTP_PROXY (or HTTPS_PROXY) set, as on many corporate hosts, a
// reload from http://localhost:PORT/mcp (a sidecar on toolgate's own host)
// to http://LOCALHOST:PORT/mcp sends the session's next request through
// the proxy, to the proxy host's own localhost:PORT — another machine —
// yet CanonicalURL folds both to one Endpoint, so the MCP session goes on
// and its upstream session id goes with it. What should happen: urls
// whose Endpoints are equal reach the same place (send requests to the url
// as digested, or keep apart what Go routes apart); here, the reload ends
// the session, or both spellings reach the sidecar.
// Fixed: a service's url is kept as gateway.CanonicalURL writes it, so both
// spellings send the same request (to localhost, never proxied).
func TestEndpointAdvLocalhostCaseEscapesProxyException(t *testing.T) {
	upstream := newAdvRecorder(t, func(r *http.Request) string { return r.Host })
	proxy := newAdvRecorder(t, func(r *http.Request) string { return r.RequestURI })
	_, port, _ := net.SplitHostPort(upstream.Listener.Addr().String())
	before := "http://localhost:" + port + "/mcp"
	after := "http://LOCALHOST:" + port + "/mcp"
	if advEndpoint(t, before) != advEndpoint(t, after) {
		t.Skip("the Endpoints differ: the reload ends the session, nothing to attack")
	}

	rt := newUpstreamTransport()
	if reflect.ValueOf(rt.Proxy).Pointer() != reflect.ValueOf(http.ProxyFromEnvironment).Pointer() {
		t.Fatal("the upstream transport no longer takes its proxy from the environment; revisit this test")
	}
	// What http.ProxyFromEnvironment does with HTTP_PROXY set and no
	// NO_PROXY (net/http vendors this very package; its result is cached
	// per process, so the environment cannot be set in a test).
	env := (&httpproxy.Config{HTTPProxy: proxy.URL}).ProxyFunc()
	rt.Proxy = func(r *http.Request) (*url.URL, error) { return env(r.URL) }

	advPost(t, rt, before, "session-issued-by-the-sidecar")
	advPost(t, rt, after, "session-issued-by-the-sidecar")
	if got := proxy.seen(); len(got) != 0 {
		t.Errorf("%s and %s have one Endpoint (the MCP session survives the reload), but the sidecar got %q "+
			"while the proxy was asked to forward %q, with the sidecar's session id, to its own localhost", before, after, upstream.seen(), got)
	}
}

// Attack (fixed): Go's own http.ServeMux matches a pattern's host case-sensitively
// (routingNode.findChild is a map lookup on r.Host), and toolgate sends the
// url's host as written in the Host header (and TLS server name). An
// upstream serving tenants by host — "tenant-a.example.com/mcp" for one,
// "/mcp" for the rest — answers http://Tenant-A.example.com/mcp from the
// other handler: another MCP server behind the same name and address. A
// reload respelling tenant-a's url that way keeps the Endpoint, so tenant
// A's upstream session id (and the catalog it listed) goes on with the
// default tenant's server. What should happen: the two spellings reach the
// same handler (toolgate sends the host as digested, lower case), or the
// reload ends the session.
// Fixed: a service's url is kept as gateway.CanonicalURL writes it: both
// spellings send Host tenant-a.example.com.
func TestEndpointAdvHostCaseSelectsAnotherServeMuxHandler(t *testing.T) {
	var mu sync.Mutex
	var got []string
	note := func(who string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = append(got, who+" (Host "+r.Host+")")
			mu.Unlock()
		}
	}
	mux := http.NewServeMux()
	mux.Handle("tenant-a.example.com/mcp", note("tenant A's MCP server"))
	mux.Handle("/mcp", note("the default tenant's MCP server"))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	before := "http://tenant-a.example.com/mcp"
	after := "http://Tenant-A.example.com/mcp"
	if advEndpoint(t, before) != advEndpoint(t, after) {
		t.Skip("the Endpoints differ: the reload ends the session, nothing to attack")
	}
	rt := newUpstreamTransport()
	rt.Proxy = nil
	rt.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		// DNS: both spellings are one name, at the server's address.
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}
	advPost(t, rt, before, "session-issued-by-tenant-a")
	advPost(t, rt, after, "session-issued-by-tenant-a")
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || strings.Fields(got[0])[0] != strings.Fields(got[1])[0] || !strings.HasPrefix(got[0], "tenant A") || !strings.HasPrefix(got[1], "tenant A") {
		t.Errorf("%s and %s have one Endpoint (the MCP session survives the reload), but the requests reached %q", before, after, got)
	}
}

// What held: a url written as CanonicalURL writes it keeps the digest
// earlier versions stored with their sessions (sha256 of url+"\x00"),
// including the forms CanonicalURL leaves alone (zones, escaped and
// non-ASCII hosts, ports other than the default, queries, a host without
// a path), and a stdio service (no url) keeps its own.
func TestEndpointAdvCanonicalDigestsUnchanged(t *testing.T) {
	for _, raw := range []string{
		"https://tracker.example.com",
		"https://[fe80::1%25eth0]:8443/mcp",
		"https://[fe80::1%25ETH0]/mcp",
		"https://ex%C3%A9mple.com/mcp",
		"https://bücher.example/MCP?Team=A",
		"https://example.com./mcp",
		"https://example.com:0443/mcp",
		"http://127.0.0.1:8080",
		"https://example.com:80/mcp",
		"http://example.com:443/mcp",
	} {
		sum := sha256.Sum256([]byte(raw + "\x00"))
		if got, want := advEndpoint(t, raw), hex.EncodeToString(sum[:16]); got != want {
			t.Errorf("Endpoint of %s is %s, want %s (the digest an earlier version stored)", raw, got, want)
		}
	}
	sum := sha256.Sum256([]byte("\x00stdio"))
	if got := endpointOf("", "stdio"); got != hex.EncodeToString(sum[:16]) {
		t.Errorf("Endpoint of a stdio service changed: %s", got)
	}
}
