// Package integration runs toolgate end to end: a real Caddy with
// toolgate's modules, loaded in this process from a Caddyfile, in front of
// real MCP servers built with the official Go SDK, driven by the SDK's
// client as the runner.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	_ "github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/internal/sseref"
)

// API keys the test gateway accepts.
const (
	aliceKey = "test-key-alice"
	bobKey   = "test-key-bob"
	carolKey = "test-key-carol" // in the admins group
	alice    = "alice@example.test"
	bob      = "bob@example.test"
	carol    = "carol@example.test"
)

// gatewayConfig describes one test gateway.
type gatewayConfig struct {
	Upstream      string // the upstream MCP URL for service "svc"
	Tools         string // the allowlist
	Auth          string // the service's auth line, default "none"
	RequestPolicy string // policy source; default testdata/policy
	// PolicyOptions are more lines in the toolgate_policy block. Both
	// policy steps get a 5s deadline: these tests are not about deadlines,
	// and a loaded machine must not turn a slow evaluation into a deny.
	PolicyOptions string
	ResultPolicy  string
	Extra         string // more lines in the toolgate block
	AuthExtra     string // more lines in the toolgate block's auth block
	// Federation, when set, adds toolgate_federation to the pipeline with
	// these lines in its block (" " for none) and serves /v1/mcp too.
	Federation    string
	Services      string // more service blocks
	Timeout       string // the service's timeout; default 10s
	PolicyTimeout string // both policy directives' timeout; default 5s
	Cipher        string // the cipher option's value; default a local key file
	Console       string // the toolgate_console block's lines; default api_key_login
	ServiceExtra  string // more lines in service svc's block
	Log           string // the global log block's body; default output discard
	RouteFirst    string // lines at the top of the MCP route, such as tracing
	Global        string // more global options, such as servers { timeouts { … } }
	// AnyHost serves the site for any Host header (http://:port, bound to
	// 127.0.0.1) instead of only for 127.0.0.1.
	AnyHost bool
	DataDir string // the file_system storage's directory; default a new one
	Sites   string // more site blocks, after the gateway's
	// ResultPolicyElsewhere gives toolgate_result_policy a matcher that
	// misses every service (a route without it fails validation).
	ResultPolicyElsewhere bool
}

// gateway is a running toolgate.
type gateway struct {
	URL     string // http://127.0.0.1:port
	DataDir string
	// pool carries the requests of api, connect and raw; nil for
	// http.DefaultTransport. A gateway started over another on the same
	// port (a reload) gets a pool of its own: a connection of the old
	// server's that returned to a shared pool after its stream ended
	// would be closed by that server as it shuts down, and a POST sent
	// on it would fail with "server closed idle connection".
	pool *http.Transport
}

// transport is the round tripper of g's requests.
func (g *gateway) transport() http.RoundTripper {
	if g.pool == nil {
		return http.DefaultTransport
	}
	return g.pool
}

// startGateway loads a Caddy config running toolgate on a free port. The
// config replaces any gateway an earlier test started in this process.
func startGateway(t testing.TB, cfg gatewayConfig) *gateway {
	t.Helper()
	return startGatewayOnPort(t, freePort(t), cfg)
}

// startGatewayOnPort is startGateway on a port the test chose (to register
// the gateway's URL with a provider first).
func startGatewayOnPort(t testing.TB, port int, cfg gatewayConfig) *gateway {
	t.Helper()
	caddyfile, data := gatewayCaddyfile(t, port, cfg)
	loadCaddyfile(t, caddyfile)
	// A config loaded over another one on the same port is a reload: the
	// old server closes its idle keep-alive connections as it shuts down,
	// and a POST sent on one of them before the client noticed fails with
	// EOF (Go resends only idempotent requests). Tests speak to the new
	// server on new connections, from a pool of its own (see gateway.pool);
	// a test that goes on with the old handle has its pool's idle
	// connections closed, so its next request dials the new server too.
	http.DefaultClient.CloseIdleConnections()
	pool := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(pool.CloseIdleConnections)
	g := &gateway{URL: fmt.Sprintf("http://127.0.0.1:%d", port), DataDir: data, pool: pool}
	for _, old := range portPools.add(port, pool) {
		old.CloseIdleConnections()
	}
	waitListening(t, g.URL)
	waitOneListener(t, port)
	return g
}

// portPools holds the pools of the gateways started on each port, so that
// a reload can close the idle connections the older handles keep to the
// server that is shutting down.
var portPools = &pools{byPort: map[int][]*http.Transport{}}

type pools struct {
	mu     sync.Mutex
	byPort map[int][]*http.Transport
}

// add records pool for port and returns the pools recorded before it.
func (p *pools) add(port int, pool *http.Transport) []*http.Transport {
	p.mu.Lock()
	defer p.mu.Unlock()
	older := p.byPort[port]
	p.byPort[port] = append(older[:len(older):len(older)], pool)
	return older
}

// gatewayDataDir is a new directory for a gateway's storage, removed when
// t ends. Not t.TempDir: the gateway runs on until the next test loads
// its own config, and its background work (a listing, an MCP session's
// state) may still write there while the directory is removed — TempDir
// fails the test on that ("directory not empty"). This removal tries a
// few times, then leaves what is left to the system's temporary files.
func gatewayDataDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "toolgate-data-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 20 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	return dir
}

// failureLog returns a file for the gateway's warnings and errors, which
// are printed if t fails: a failure under the whole suite's load (a
// storage or lock error answered as "retry later") says its cause.
func failureLog(t testing.TB) string {
	file := filepath.Join(t.TempDir(), "gateway.log")
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		t.Logf("the gateway's last warnings and errors:\n%s", strings.Join(lines[max(0, len(lines)-30):], "\n"))
	})
	return file
}

// waitOneListener waits until one socket listens on port. Caddy's reload
// returns once the old server's shutdown has begun, not once its listening
// socket is closed; until it is, the kernel (SO_REUSEPORT) hands some new
// connections to that socket, and resets them when it closes: a test's
// first request after a reload failed with "connection reset by peer".
func waitOneListener(t testing.TB, port int) {
	t.Helper()
	n := 0
	for range 250 {
		if n = listeners(t, port); n == 1 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%d sockets listen on port %d five seconds after the gateway started (want one)", n, port)
}

// listeners is how many TCP sockets listen on port (from /proc/net/tcp and
// tcp6).
func listeners(t testing.TB, port int) int {
	t.Helper()
	suffix := fmt.Sprintf(":%04X", port)
	n := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			// sl local_address rem_address st ...; 0A is LISTEN.
			f := strings.Fields(line)
			if len(f) > 3 && strings.HasSuffix(f[1], suffix) && f[3] == "0A" {
				n++
			}
		}
	}
	return n
}

// gatewayCaddyfile is the Caddyfile of a test gateway on port, and its
// storage directory.
func gatewayCaddyfile(t testing.TB, port int, cfg gatewayConfig) (caddyfile, dataDir string) {
	t.Helper()
	if cfg.Tools == "" {
		cfg.Tools = "echo big progress reconnect touch_resource drop_table leak unknown_field forbidden_tool gated_tool pinned_echo redacted poll wait ask add_tool late_tool set_visibility"
	}
	if cfg.Auth == "" {
		cfg.Auth = "none"
	}
	if cfg.Timeout == "" {
		cfg.Timeout = "10s"
	}
	if cfg.PolicyTimeout == "" {
		cfg.PolicyTimeout = "5s"
	}
	if cfg.Console == "" {
		cfg.Console = "api_key_login"
	}
	if cfg.Log == "" {
		cfg.Log = "output file " + failureLog(t) + "\n\t\tlevel WARN"
	}
	if cfg.RequestPolicy == "" {
		cfg.RequestPolicy = "testdata/policy"
	}
	if cfg.ResultPolicy == "" {
		cfg.ResultPolicy = cfg.RequestPolicy
	}
	federatedPath, federation := "", ""
	if cfg.Federation != "" {
		federatedPath, federation = "/v1/mcp", "toolgate_federation {\n"+cfg.Federation+"\n}"
	}
	data := cfg.DataDir
	if data == "" {
		data = gatewayDataDir(t)
	}
	if cfg.Cipher == "" {
		cfg.Cipher = "local " + data + "/cipher.key"
	}
	site, bind := "http://127.0.0.1", ""
	if cfg.AnyHost {
		site, bind = "http://", "default_bind 127.0.0.1"
	}
	caddyfile = fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		%[20]s
	}
	%[23]s
	%[24]s
	toolgate {
		public_url http://127.0.0.1:%[1]d
		storage file_system %[2]s
		cipher %[17]s
		auth {
			api_key %[3]s %[4]s eng
			api_key %[5]s %[6]s
			api_key %[14]s %[15]s admins
			%[22]s
		}
		service svc {
			url %[7]s
			allow_http
			tools %[8]s
			auth %[9]s
			timeout %[18]s
			%[19]s
		}
		%[12]s
		%[13]s
	}
}

%[25]s:%[1]d {
	@mcp path /v1/mcp/* %[27]s
	route @mcp {
		%[26]s
		toolgate_session
		%[28]s
		toolgate_registry
		toolgate_policy {
			source %[10]s
			timeout %[30]s
			%[16]s
		}
		toolgate_credentials
		toolgate_result_policy {
			source %[11]s
			timeout %[30]s
		}
		toolgate_proxy
	}
	metrics /metrics
	toolgate_api
	toolgate_console {
		%[21]s
	}
}
%[29]s
`, port, data, hashKey(aliceKey), alice, hashKey(bobKey), bob, cfg.Upstream, cfg.Tools, cfg.Auth,
		cfg.RequestPolicy, cfg.ResultPolicy, cfg.Extra, cfg.Services, hashKey(carolKey), carol, cfg.PolicyOptions, cfg.Cipher, cfg.Timeout,
		cfg.ServiceExtra, cfg.Log, cfg.Console, cfg.AuthExtra, cfg.Global, bind, site, cfg.RouteFirst, federatedPath, federation, cfg.Sites,
		cfg.PolicyTimeout)
	if cfg.ResultPolicyElsewhere {
		caddyfile = resultPolicyStep.ReplaceAllStringFunc(caddyfile, func(step string) string {
			return strings.Replace(step, "toolgate_result_policy {", "toolgate_result_policy /v1/mcp/no-such-service {", 1)
		})
	}
	return caddyfile, data
}

// resultPolicyStep is the toolgate_result_policy block of gatewayCaddyfile.
var resultPolicyStep = regexp.MustCompile(`(?s)\n\t\ttoolgate_result_policy \{.*?\n\t\t\}`)

var caddyMu sync.Mutex

// loadCaddyfile adapts and runs a Caddyfile in this process.
func loadCaddyfile(t testing.TB, caddyfile string) {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	cfgJSON, warnings, err := adapter.Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, caddyfile)
	}
	for _, w := range warnings {
		t.Logf("adapt warning: %s", w.String())
	}
	caddyMu.Lock()
	if err := caddy.Load(cfgJSON, true); err != nil {
		caddyMu.Unlock()
		t.Fatalf("loading config: %v", err)
	}
	caddyMu.Unlock()
	t.Cleanup(func() {
		caddyMu.Lock()
		defer caddyMu.Unlock()
		_ = caddy.Stop()
	})
}

func hashKey(k string) string {
	return "sha256:" + fmt.Sprintf("%x", sha256Sum([]byte(k)))
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitListening(t testing.TB, base string) {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	for range 100 {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("gateway at %s did not start listening", base)
}

// createSession creates a toolgate session for the API key's owner.
func (g *gateway) createSession(t testing.TB, key string, services ...string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"services": services})
	resp := g.api(t, http.MethodPost, "/v1/sessions", key, body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/sessions: %d %s", resp.StatusCode, resp.Body)
	}
	var s struct{ ID string }
	if err := json.Unmarshal(resp.Body, &s); err != nil || s.ID == "" {
		t.Fatalf("POST /v1/sessions: no id in %s", resp.Body)
	}
	return s.ID
}

type apiResponse struct {
	StatusCode int
	Header     http.Header
	Body       []byte
}

func (g *gateway) api(t testing.TB, method, path, key string, body []byte) apiResponse {
	t.Helper()
	req, err := http.NewRequest(method, g.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Transport: g.transport()}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return apiResponse{StatusCode: resp.StatusCode, Header: resp.Header, Body: b}
}

// headerTransport adds fixed headers to every request, like a runner that
// authenticates to toolgate.
type headerTransport struct {
	base    http.RoundTripper
	headers map[string]string
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.headers {
		r.Header.Set(k, v)
	}
	return h.base.RoundTrip(r)
}

// connect opens an MCP session through the gateway with the official SDK
// client, as a runner does.
func (g *gateway) connect(t testing.TB, key, session, service string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	return g.connectWith(t, key, session, service, -1, opts)
}

// connectWith is connect with the SDK's MaxRetries for the runner's
// streams (-1: none).
func (g *gateway) connectWith(t testing.TB, key, session, service string, maxRetries int, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "test-runner", Version: "1.0.0"}, opts)
	transport := &mcp.StreamableClientTransport{
		Endpoint: g.URL + "/v1/mcp/" + service,
		HTTPClient: &http.Client{Transport: headerTransport{base: g.transport(), headers: map[string]string{
			"Authorization":      "Bearer " + key,
			"X-Toolgate-Session": session,
			"Cookie":             "runner-cookie=secret",
		}}},
		MaxRetries: maxRetries,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connecting through the gateway: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// rawMCP is a runner that speaks Streamable HTTP by hand, to see bytes
// exactly as the gateway sends them.
type rawMCP struct {
	t         testing.TB
	url       string
	headers   map[string]string
	sessionID string
	seen      []json.RawMessage // what rpc received
	// transport carries its requests: its gateway's (see gateway.pool);
	// nil for http.DefaultTransport.
	transport http.RoundTripper
}

func (g *gateway) raw(t testing.TB, key, session, service string) *rawMCP {
	return &rawMCP{t: t, url: g.URL + "/v1/mcp/" + service, transport: g.transport(), headers: map[string]string{
		"Authorization": "Bearer " + key, "X-Toolgate-Session": session,
	}}
}

// post sends one message and returns the status, the headers and the
// JSON-RPC messages of the answer (one for JSON, each event for SSE, read
// as a standard-conforming SSE client reads them).
func (m *rawMCP) post(body string) (int, http.Header, []json.RawMessage) {
	m.t.Helper()
	resp, err := m.send(context.Background(), http.MethodPost, "application/json, text/event-stream", body, "")
	if err != nil {
		m.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var msgs []json.RawMessage
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for _, ev := range sseref.Parse(string(data)).Events {
			// An event without data is a priming event (SEP-1699), not a message.
			if ev.Type == "message" && ev.Data != "" {
				msgs = append(msgs, json.RawMessage(ev.Data))
			}
		}
	} else if len(bytes.TrimSpace(data)) > 0 {
		msgs = append(msgs, json.RawMessage(data))
	}
	return resp.StatusCode, resp.Header, msgs
}

// send sends one HTTP request of the runner's MCP session: a POST with
// body, a GET (with Last-Event-ID when lastEventID is set) or a DELETE.
// The response is the caller's to close.
func (m *rawMCP) send(ctx context.Context, method, accept, body, lastEventID string) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, method, m.url, strings.NewReader(body))
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	for k, v := range m.headers {
		req.Header.Set(k, v)
	}
	if m.sessionID != "" {
		req.Header.Set("Mcp-Session-Id", m.sessionID)
		if _, set := m.headers["Mcp-Protocol-Version"]; !set {
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
	}
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	return (&http.Client{Transport: m.transport}).Do(req)
}

// echoRequest is a tools/call of the upstream's echo tool with text, as
// request id in m's session, for a load generator to send with its own
// client.
func (m *rawMCP) echoRequest(id int, text string) *http.Request {
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":%q}}}`, id, text)
	req, _ := http.NewRequest(http.MethodPost, m.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", m.sessionID)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	for k, v := range m.headers {
		req.Header.Set(k, v)
	}
	return req
}

// delete ends the runner's MCP session.
func (m *rawMCP) delete() int {
	m.t.Helper()
	resp, err := m.send(context.Background(), http.MethodDelete, "", "", "")
	if err != nil {
		m.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// endMCPSession ends m's MCP session (DELETE), failing t unless it is
// ended.
func endMCPSession(t testing.TB, m *rawMCP) {
	t.Helper()
	if status := m.delete(); status != http.StatusNoContent {
		t.Errorf("DELETE of the MCP session: %d", status)
	}
}

// initialize performs the MCP handshake.
func (m *rawMCP) initialize() {
	m.t.Helper()
	m.initializeWith(`{}`)
}

// initializeWith initializes the MCP session declaring the client
// capabilities caps (a JSON object).
func (m *rawMCP) initializeWith(caps string) {
	m.t.Helper()
	status, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":` + caps + `,"clientInfo":{"name":"raw","version":"1"}}}`)
	if status != http.StatusOK || len(msgs) != 1 || hdr.Get("Mcp-Session-Id") == "" {
		m.t.Fatalf("initialize: %d %v %s", status, hdr, msgs)
	}
	m.sessionID = hdr.Get("Mcp-Session-Id")
	if status, _, _ := m.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); status != http.StatusAccepted {
		m.t.Fatalf("notifications/initialized: %d", status)
	}
}

// testdataPath returns an absolute path under testdata.
func testdataPath(t testing.TB, rel string) string {
	p, err := filepath.Abs(filepath.Join("testdata", rel))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// aliceSession starts an upstream, a gateway in front of it (cfg, with the
// upstream filled in), and alice's initialized MCP session through it.
func aliceSession(t testing.TB, cfg gatewayConfig) (*upstream, *gateway, *rawMCP) {
	t.Helper()
	up := startUpstream(t)
	cfg.Upstream = up.URL
	g := startGateway(t, cfg)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	return up, g, m
}

// upstreamKinds are the two ways a go-sdk upstream answers a POST: over
// SSE (its default) and with a JSON body; configure is for
// startUpstreamWith.
var upstreamKinds = []struct {
	name      string
	configure func(*mcp.StreamableHTTPOptions)
}{
	{"sse", nil},
	{"json", func(o *mcp.StreamableHTTPOptions) { o.JSONResponse = true }},
}
