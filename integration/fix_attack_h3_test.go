package integration

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// Attack (held): the answer to initialize (written by toolgate itself) to
// an HTTP/3 runner that grants 16 bytes of stream window and reads the
// body 3 s after the head: it arrives whole (quic-go queues the small
// answer, so EarlyAnswer.Finish's 2 s write deadline cuts nothing there).
func TestFixAttackH3SlowReaderAnswerWhole(t *testing.T) {
	up := startUpstream(t)
	g := startH2Gateway(t, gatewayConfig{Upstream: up.URL}, "h1 h2 h3")
	sess := g.createSession(t, aliceKey, "svc")
	tr := &http3.Transport{TLSClientConfig: g.tlsConfig(http3.NextProtoH3),
		QUICConfig: &quic.Config{InitialStreamReceiveWindow: 16, MaxStreamReceiveWindow: 16}}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	m := g.raw(t, aliceKey, sess, "svc")
	body := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	req := m.mcpRequest(ctx, http.MethodPost, strings.NewReader(body), int64(len(body)))
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("initialize: %d", resp.StatusCode)
	}
	time.Sleep(3 * time.Second)
	b, err := readAllWithin(resp.Body, 10*time.Second)
	if err != nil || !strings.Contains(string(b), `"protocolVersion"`) {
		t.Errorf("the initialize answer read 3 s after its head over HTTP/3 with a 16-byte window: %v %q", err, b)
	}
}
