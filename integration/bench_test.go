package integration

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// BenchmarkToolCall measures one tools/call, straight to the upstream and
// through the whole toolgate pipeline (session, registry, the default
// request policy, credentials, the default result policy, proxy) in this
// process, in the same run: a small call, and one whose result is 1 MiB of
// text. Allocations count the whole process — runner, gateway and upstream —
// so the gateway's share is the difference between the two.
func BenchmarkToolCall(b *testing.B) {
	up := startUpstream(b)
	g := startGateway(b, gatewayConfig{Upstream: up.URL, RequestPolicy: "../policies"})
	through := g.raw(b, aliceKey, g.createSession(b, aliceKey, "svc"), "svc")
	through.initialize()
	direct := &rawMCP{t: b, url: up.URL, headers: map[string]string{}}
	direct.initialize()

	for _, size := range []struct{ name, call, want string }{
		{"small", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`, "hello"},
		{"1MiB", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"big","arguments":{"bytes":1048576}}}`, "lorem ipsum"},
	} {
		for _, path := range []struct {
			name string
			m    *rawMCP
		}{{"direct", direct}, {"toolgate", through}} {
			b.Run(size.name+"/"+path.name, func(b *testing.B) {
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
				body := []byte(size.call)
				b.ReportAllocs()
				for b.Loop() {
					req, _ := http.NewRequest(http.MethodPost, path.m.url, bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Accept", "application/json, text/event-stream")
					req.Header.Set("Mcp-Session-Id", path.m.sessionID)
					req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
					for k, v := range path.m.headers {
						req.Header.Set(k, v)
					}
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					data, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK || !bytes.Contains(data, []byte(size.want)) {
						b.Fatalf("%d %.300s", resp.StatusCode, data)
					}
				}
			})
		}
	}
}
