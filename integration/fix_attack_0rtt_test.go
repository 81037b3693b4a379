//go:build !race

// Dials 0-RTT with quic-go's client, which races with itself then (see
// h2_attack_0rtt_norace_test.go): run without the race detector.

package integration

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// Attack (held): a request of the HTTP API that acts (DELETE
// /v1/sessions/{id}, ending alice's toolgate session) sent in HTTP/3 0-RTT
// early data whose handshake never completes (as in a replay of the
// runner's first flight): it is not acted on (the session lives on), and
// what the runner reads, if anything, is the 425 too_early.
func TestFixAttackH3ZeroRTTAPIActsNot(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "")
	tlsConf := g.tlsConfig(http3.NextProtoH3)
	tlsConf.ClientSessionCache = tls.NewLRUClientSessionCache(8)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	first, err := quic.DialAddr(ctx, g.Addr, tlsConf, &quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	callEcho(t, m, (&http3.Transport{}).NewClientConn(first), 40, "first-connection")
	time.Sleep(300 * time.Millisecond) // the NewSessionTicket arrives
	_ = first.CloseWithError(0, "")

	relay := startHandshakeBlocker(t, g.Addr)
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	tr := &quic.Transport{Conn: pc}
	defer tr.Close()
	conn, err := tr.DialEarly(ctx, relay.ln.LocalAddr(), tlsConf, &quic.Config{})
	if err != nil {
		t.Fatalf("dialing with 0-RTT: %v", err)
	}
	defer conn.CloseWithError(0, "")
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
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
