package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// A call refused because its caller's share of request bytes is taken
// is answered with the refusal even when its runner sends the whole body
// at once: the gateway reads what the runner still sends of it (at most
// max_request_size) after answering, instead of closing a connection with
// the body unread, which resets it — and a runner still writing its body
// then gets the reset instead of the refusal and its Retry-After (seen
// under load in TestAccountingHoldsConcurrentCallsAndDropsDoNotDrift).
func TestAccountingRefusalReachesARunnerSendingAtOnce(t *testing.T) {
	key, _, auth := acctUser("atonce")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "20s", AuthExtra: auth,
		Extra: "max_request_size 1MiB\nmax_request_bytes_in_flight_per_caller 1MiB"})
	m := acctRunner(t, g, key)
	pad := strings.Repeat("p", 900<<10)
	call := func(id int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"pad":%q}}}`, id, pad)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream", call(1), "")
	if err != nil || held.StatusCode != http.StatusOK {
		t.Fatalf("the call holding the share: %v %v", err, held)
	}
	defer held.Body.Close()
	for i := range 8 {
		resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream", call(10+i), "")
		if err != nil {
			t.Fatalf("call %d: the runner got %v, want the refusal", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		b := string(body)
		if !acctRefusedBytes(resp.StatusCode, b) || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("call %d: %d %v %.300s, want 503 for the share with Retry-After", i, resp.StatusCode, resp.Header, b)
		}
	}
}
