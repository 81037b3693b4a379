package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// corsPage is a browser-based MCP client in plain JavaScript: it
// initializes an MCP session at the gateway with only a bearer token,
// lists the tools and calls echo, and tries once without a token; it
// writes what it saw (or the error that stopped it) into #out.
const corsPage = `<!doctype html>
<title>MCP client</title>
<pre id="out">running</pre>
<script>
const endpoint = %q, token = %q;
let step = "";
async function rpc(headers, body) {
	const r = await fetch(endpoint, {method: "POST", headers, body: JSON.stringify(body)});
	const text = await r.text();
	step = body.method + " " + r.status + " " + (r.headers.get("Content-Type") || "") + " " + text.slice(0, 200);
	let msg = null;
	if ((r.headers.get("Content-Type") || "").startsWith("text/event-stream")) {
		// Each event is one line of data here; a priming event has none.
		for (const line of text.split("\n")) if (line.startsWith("data:") && line.slice(5).trim()) msg = JSON.parse(line.slice(5));
	} else if (text) {
		msg = JSON.parse(text);
	}
	return {status: r.status, headers: r.headers, msg};
}
(async () => {
	const out = document.getElementById("out");
	try {
		const headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json",
			"Accept": "application/json, text/event-stream"};
		const init = await rpc(headers, {jsonrpc: "2.0", id: 1, method: "initialize",
			params: {protocolVersion: "2025-11-25", capabilities: {}, clientInfo: {name: "browser", version: "1"}}});
		const sid = init.headers.get("Mcp-Session-Id");
		headers["Mcp-Session-Id"] = sid;
		headers["MCP-Protocol-Version"] = "2025-11-25";
		const initialized = await rpc(headers, {jsonrpc: "2.0", method: "notifications/initialized"});
		const list = await rpc(headers, {jsonrpc: "2.0", id: 2, method: "tools/list"});
		const call = await rpc(headers, {jsonrpc: "2.0", id: 3, method: "tools/call",
			params: {name: "echo", arguments: {text: "from the browser"}}});
		const anon = await rpc({"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
			{jsonrpc: "2.0", id: 4, method: "ping"});
		out.textContent = JSON.stringify({session: !!sid, initialized: initialized.status,
			tools: list.msg.result.tools.map(t => t.name), echo: call.msg.result.content[0].text,
			unauthorized: anon.status, challenge: anon.headers.get("WWW-Authenticate")});
	} catch (e) {
		out.textContent = "error: " + e + " after " + step;
	}
	document.title = "done";
})();
</script>`

// servePage serves one HTML page on a loopback port of its own: an origin
// of its own.
func servePage(t *testing.T, page string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(page))
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

// A browser-based MCP client on an allowed origin connects to the gateway
// from a real Chromium — preflight, then initialize, tools/list and
// tools/call with only a token, reading the Mcp-Session-Id and, without a
// token, the WWW-Authenticate challenge; the same page from another origin
// is refused.
func TestBrowserMCPClientCORS(t *testing.T) {
	ctx := chromium(t)
	up := startUpstream(t)
	gwPort := freePort(t)
	page := fmt.Sprintf(corsPage, fmt.Sprintf("http://127.0.0.1:%d/v1/mcp/svc", gwPort), aliceKey)
	allowed, other := servePage(t, page), servePage(t, page)
	g := startGatewayOnPort(t, gwPort, gatewayConfig{Upstream: up.URL, Extra: "allowed_origins " + allowed})

	run(t, ctx, "the client on an allowed origin", chromedp.Navigate(allowed), chromedp.WaitReady(chromedp.CSS("title")),
		chromedp.Poll[chromedp.Void](`document.title == "done"`))
	var seen struct {
		Session      bool
		Initialized  int
		Tools        []string
		Echo         string
		Unauthorized int
		Challenge    string
	}
	text := textOf(t, ctx, "#out")
	if err := json.Unmarshal([]byte(text), &seen); err != nil {
		t.Fatalf("the page on the allowed origin: %s", text)
	}
	if !seen.Session || seen.Initialized != http.StatusAccepted || !strings.Contains(strings.Join(seen.Tools, " "), "echo") ||
		seen.Echo != `{"text":"from the browser"}` || seen.Unauthorized != http.StatusUnauthorized ||
		!strings.Contains(seen.Challenge, "resource_metadata=") {
		t.Fatalf("the page on the allowed origin saw %s", text)
	}
	shoot(t, ctx, "20-browser-mcp-client")

	run(t, ctx, "the client on another origin", chromedp.Navigate(other), chromedp.WaitReady(chromedp.CSS("title")),
		chromedp.Poll[chromedp.Void](`document.title == "done"`))
	if text := textOf(t, ctx, "#out"); !strings.HasPrefix(text, "error: TypeError") {
		t.Fatalf("the page on another origin: %s, want its request refused", text)
	}

	// What the browser was told: the preflight names the origin (never *),
	// allows the MCP headers, sends no credentials header; another origin
	// gets 403.
	preflight := func(origin string) *http.Response {
		req, _ := http.NewRequest(http.MethodOptions, g.URL+"/v1/mcp/svc", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization,content-type,mcp-session-id,x-toolgate-session,mcp-param-region,x-other")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := preflight(allowed)
	h := resp.Header
	if resp.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != allowed || h.Get("Access-Control-Allow-Credentials") != "" ||
		h.Get("Access-Control-Allow-Headers") != "authorization, content-type, mcp-session-id, x-toolgate-session, mcp-param-region" ||
		!strings.Contains(h.Get("Access-Control-Allow-Methods"), "DELETE") {
		t.Errorf("the preflight from the allowed origin: %d %v", resp.StatusCode, h)
	}
	if resp := preflight(other); resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("the preflight from another origin: %d %v", resp.StatusCode, resp.Header)
	}
	// The metadata a browser client reads next is readable from the
	// allowed origin too.
	req, _ := http.NewRequest(http.MethodGet, g.URL+"/.well-known/oauth-protected-resource/v1/mcp/svc", nil)
	req.Header.Set("Origin", allowed)
	mresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	mresp.Body.Close()
	if mresp.StatusCode != http.StatusOK || mresp.Header.Get("Access-Control-Allow-Origin") != allowed {
		t.Errorf("the metadata from the allowed origin: %d %v", mresp.StatusCode, mresp.Header)
	}
}
