//go:build !race

// Dials 0-RTT with quic-go's client, which races with itself then (see
// h2_attack_0rtt_norace_test.go): run without the race detector.

package integration

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Attack (held): a request of the HTTP API that acts (DELETE
// /v1/sessions/{id}, ending alice's toolgate session) sent in HTTP/3 0-RTT
// early data whose handshake never completes (as in a replay of the
// runner's first flight): it is not acted on (the session lives on), and
// what the runner reads, if anything, is the 425 too_early.
func TestFixAttackH3ZeroRTTAPIActsNot(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tlsConf := h3Ticket(t, ctx, g, m)
	relay := startHandshakeBlocker(t, g.Addr)
	_, str := zeroRTTStream(t, ctx, relay, tlsConf)
	sess := m.headers["X-Toolgate-Session"]
	fields := [][2]string{
		{":method", "DELETE"}, {":scheme", "https"}, {":authority", g.Addr}, {":path", "/v1/sessions/" + sess},
		{"authorization", "Bearer " + aliceKey}, {"content-length", "0"},
	}
	if err := h3Request(str, fields, ""); err != nil {
		t.Fatal(err)
	}
	b, readErr := readAllWithin(str, 10*time.Second)
	var sawEarly bool
	var dropped int
	for i := 0; i < 40; i++ { // the client's Handshake packets come (and are dropped)
		relay.mu.Lock()
		sawEarly, dropped = relay.sawEarly, relay.dropped
		relay.mu.Unlock()
		if dropped > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the runner read %q (%v)", b, readErr)
	if !sawEarly || dropped == 0 {
		t.Fatalf("the test did not set up early data without a handshake (0-RTT sent %v, dropped %d)", sawEarly, dropped)
	}
	time.Sleep(500 * time.Millisecond)
	if r := g.api(t, http.MethodGet, "/v1/sessions/"+sess, aliceKey, nil); r.StatusCode != http.StatusOK {
		t.Errorf("DELETE /v1/sessions/{id} in 0-RTT, handshake never complete (runner read %q): the session is gone afterwards (GET: %d %s)", b, r.StatusCode, r.Body)
	}
	if len(b) > 0 && !strings.Contains(string(b), "too_early") {
		t.Errorf("DELETE /v1/sessions/{id} in 0-RTT, handshake never complete: answered %q, want 425 too_early", b)
	}
}
