package sse

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/toolgate/toolgate/internal/mcpbridge"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// advLegacySidecar is a 2024-11-05 server on this host that names its
// message endpoint absolutely, with its host written "LOCALHOST", and
// answers initialize on its stream.
func advLegacySidecar(t *testing.T) (srv *httptest.Server, port string) {
	t.Helper()
	streams := struct {
		sync.Mutex
		m map[string]chan string
	}{m: map[string]chan string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sse", func(w http.ResponseWriter, r *http.Request) {
		ch := make(chan string, 4)
		streams.Lock()
		sid := fmt.Sprint(len(streams.m))
		streams.m[sid] = ch
		streams.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: endpoint\ndata: http://LOCALHOST:%s/message?sid=%s\n\n", port, sid)
		w.(http.Flusher).Flush()
		for {
			select {
			case msg := <-ch:
				fmt.Fprintf(w, "data: %s\n\n", msg)
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
		}
	})
	mux.HandleFunc("POST /message", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		streams.Lock()
		ch := streams.m[r.URL.Query().Get("sid")]
		streams.Unlock()
		if ch != nil && strings.Contains(string(body), `"initialize"`) {
			ch <- `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"sidecar","version":"1"}}}`
		}
		w.WriteHeader(http.StatusAccepted)
	})
	srv = httptest.NewServer(mux)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	_, port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	return srv, port
}

// Attack (fixed): the legacy SSE guard now lets through a message endpoint whose
// origin only CanonicalURL equates with the service's
// (http://LOCALHOST:PORT for a service at http://localhost:PORT/sse, a
// sidecar on toolgate's own host), but it sends the request to the url as
// the server wrote it, not to the service's origin. Go's proxy settings
// (http.ProxyFromEnvironment, which the upstream transport uses) exempt
// "localhost" but compare it case-sensitively, so with HTTP_PROXY set —
// common on corporate hosts — every message of the session, with the
// caller's credential (X-Api-Key here), goes in plain http to the proxy,
// which forwards it to its own localhost:PORT: another machine. Before
// the change the guard refused that origin (errOtherHost). What should
// happen: a message the guard accepts goes to the service's own origin as
// the service's url spells it (rewrite the request's scheme and host to
// the canonical origin), or the guard refuses it; never to the proxy.
// Fixed: a request the guard accepts is sent to the service's origin, in
// its spelling (scheme and host rewritten, the Host header with them).
func TestSSEGuardAdvLocalhostCaseEndpointGoesThroughProxy(t *testing.T) {
	_, port := advLegacySidecar(t)
	var mu sync.Mutex
	var proxied []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		proxied = append(proxied, r.Method+" "+r.RequestURI+" X-Api-Key="+r.Header.Get("X-Api-Key"))
		mu.Unlock()
		http.Error(w, "proxy: refused", http.StatusBadGateway)
	}))
	t.Cleanup(proxy.Close)

	// The upstream transport as gateway.newUpstreamTransport makes it (a
	// clone of http.DefaultTransport, proxy from the environment), with
	// what http.ProxyFromEnvironment does under HTTP_PROXY=<proxy> and no
	// NO_PROXY (its result is cached per process, so the environment
	// itself cannot be set in a test).
	base := http.DefaultTransport.(*http.Transport).Clone()
	env := (&httpproxy.Config{HTTPProxy: proxy.URL}).ProxyFunc()
	base.Proxy = func(r *http.Request) (*url.URL, error) { return env(r.URL) }

	// The service as provisioned and attached (Service.provision keeps
	// the url as CanonicalURL writes it; Attach derives the origin).
	svcURL := gateway.CanonicalURL("http://localhost:" + port + "/sse")
	u, err := url.Parse(svcURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config{Service: "sidecar", URL: svcURL, Header: "X-Api-Key", MaxMessage: 1 << 20,
		DialTimeout: time.Second, Timeout: 5 * time.Second}
	rt := &runtime{cfg: cfg, origin: gateway.CanonicalURL(u.Scheme + "://" + u.Host), base: base}
	rt.bridge = mcpbridge.New(mcpbridge.Config{Service: cfg.Service, MaxMessage: cfg.MaxMessage}, rt)
	t.Cleanup(func() { _ = rt.Destruct() })

	init, err := mcpmsg.Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`), mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(gateway.WithUpstreamUser(context.Background(), "alice"), 3*time.Second)
	defer cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "http://toolgate/mcp/sidecar", nil)
	r.Header.Set("X-Api-Key", "alice-secret")
	_, _, err = rt.Open(r, init) // the session, if any, ends with rt (Destruct)

	mu.Lock()
	defer mu.Unlock()
	if len(proxied) != 0 {
		t.Errorf("the service is at %s, but its session's messages went to the HTTP proxy (to be forwarded to the proxy's own localhost), credential included: %q (Open: %v)", svcURL, proxied, err)
	}
}
