package integration

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// BenchmarkToolCall measures one small tools/call, straight to the upstream
// and through the whole toolgate pipeline (session, registry, request
// policy, credentials, result policy, proxy) in this process, in the same
// run. Allocations count the whole process — runner, gateway and upstream —
// so the gateway's share is the difference between the two.
func BenchmarkToolCall(b *testing.B) {
	up := startUpstream(b)
	g := startGateway(b, gatewayConfig{Upstream: up.URL})
	through := g.raw(b, aliceKey, g.createSession(b, aliceKey, "svc"), "svc")
	through.initialize()

	direct := &rawMCP{t: b, url: up.URL, headers: map[string]string{}}
	direct.initialize()

	const call = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`
	for _, bc := range []struct {
		name string
		m    *rawMCP
	}{{"direct", direct}, {"toolgate", through}} {
		b.Run(bc.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			body := []byte(call)
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, bc.m.url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set("Mcp-Session-Id", bc.m.sessionID)
				req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
				for k, v := range bc.m.headers {
					req.Header.Set(k, v)
				}
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !bytes.Contains(data, []byte(`hello`)) {
					b.Fatalf("%d %s", resp.StatusCode, data)
				}
			}
		})
	}
}
