package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/qpack"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// quicVarint appends v as a QUIC variable-length integer.
func quicVarint(b []byte, v uint64) []byte {
	switch {
	case v < 1<<6:
		return append(b, byte(v))
	case v < 1<<14:
		return append(b, byte(v>>8)|0x40, byte(v))
	case v < 1<<30:
		return append(b, byte(v>>24)|0x80, byte(v>>16), byte(v>>8), byte(v))
	}
	panic("varint too large for the test")
}

// readQuicVarint reads a QUIC variable-length integer; n is 0 when b is
// too short.
func readQuicVarint(b []byte) (v uint64, n int) {
	if len(b) == 0 {
		return 0, 0
	}
	n = 1 << (b[0] >> 6)
	if len(b) < n {
		return 0, 0
	}
	v = uint64(b[0] & 0x3f)
	for i := 1; i < n; i++ {
		v = v<<8 | uint64(b[i])
	}
	return v, n
}

// longHeaderTypes lists the QUIC v1 long-header packet types coalesced in
// datagram b (0 Initial, 1 0-RTT, 2 Handshake); short reports a
// short-header (1-RTT) packet.
func longHeaderTypes(b []byte) (types []int, short bool) {
	for len(b) > 0 {
		if b[0]&0x80 == 0 {
			return types, true
		}
		typ := int(b[0]&0x30) >> 4
		types = append(types, typ)
		p := 5
		if len(b) < p+1 {
			return
		}
		p += 1 + int(b[p])
		if len(b) < p+1 {
			return
		}
		p += 1 + int(b[p])
		if typ == 0 {
			tl, n := readQuicVarint(b[p:])
			if n == 0 {
				return
			}
			p += n + int(tl)
		}
		l, n := readQuicVarint(b[p:])
		if n == 0 {
			return
		}
		p += n + int(l)
		if p > len(b) {
			return
		}
		b = b[p:]
	}
	return
}

// handshakeBlocker is a UDP relay between one QUIC client and the
// gateway that drops every client datagram after the client's first
// flight that is not Initial or 0-RTT: the client's Handshake packets
// (its Finished) never arrive, so the TLS handshake never completes,
// as when an attacker replays a client's first flight (ClientHello and
// its 0-RTT data) without its keys.
type handshakeBlocker struct {
	ln       *net.UDPConn
	block    bool // false: relay everything, only record the first flight
	mu       sync.Mutex
	sawEarly bool // a 0-RTT packet went through
	dropped  int
	// firstFlight is what the client sent before the gateway's first
	// answer: its ClientHello and its 0-RTT data, what a replay resends.
	firstFlight [][]byte
	answered    bool
}

func startHandshakeBlocker(t testing.TB, target string) *handshakeBlocker {
	return startUDPRelay(t, target, true)
}

func startUDPRelay(t testing.TB, target string, block bool) *handshakeBlocker {
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	up, err := net.Dial("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	h := &handshakeBlocker{ln: ln, block: block}
	t.Cleanup(func() { ln.Close(); up.Close() })
	var client struct {
		sync.Mutex
		addr net.Addr
	}
	go func() { // gateway → client
		buf := make([]byte, 65536)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			h.mu.Lock()
			h.answered = true
			h.mu.Unlock()
			client.Lock()
			a := client.addr
			client.Unlock()
			if a != nil {
				_, _ = ln.WriteTo(buf[:n], a)
			}
		}
	}()
	go func() { // client → gateway
		buf := make([]byte, 65536)
		for {
			n, a, err := ln.ReadFrom(buf)
			if err != nil {
				return
			}
			client.Lock()
			client.addr = a
			client.Unlock()
			types, short := longHeaderTypes(buf[:n])
			pass := !short && len(types) > 0
			for _, typ := range types {
				if typ != 0 && typ != 1 {
					pass = false
				}
			}
			h.mu.Lock()
			if !h.answered {
				h.firstFlight = append(h.firstFlight, append([]byte(nil), buf[:n]...))
			}
			if !h.block {
				pass = true
			}
			for _, typ := range types {
				if typ == 1 && pass {
					h.sawEarly = true
				}
			}
			if !pass {
				h.dropped++
			}
			h.mu.Unlock()
			if pass {
				_, _ = up.Write(buf[:n])
			}
		}
	}()
	return h
}

// h3Request writes an HTTP/3 request (HEADERS, DATA) on str and closes
// its sending side.
func h3Request(str *quic.Stream, fields [][2]string, body string) error {
	var block bytes.Buffer
	enc := qpack.NewEncoder(&block)
	for _, f := range fields {
		if err := enc.WriteField(qpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			return err
		}
	}
	var b []byte
	b = quicVarint(b, 0x01) // HEADERS
	b = quicVarint(b, uint64(block.Len()))
	b = append(b, block.Bytes()...)
	b = quicVarint(b, 0x00) // DATA
	b = quicVarint(b, uint64(len(body)))
	b = append(b, body...)
	if _, err := str.Write(b); err != nil {
		return err
	}
	return str.Close()
}

// h3Ticket returns a TLS configuration for HTTP/3 to g holding a session
// ticket: a first connection makes a call of alice's (m) and leaves it.
func h3Ticket(t *testing.T, ctx context.Context, g *h2Gateway, m *rawMCP) *tls.Config {
	t.Helper()
	tlsConf := g.tlsConfig(http3.NextProtoH3)
	tlsConf.ClientSessionCache = tls.NewLRUClientSessionCache(8)
	first, err := quic.DialAddr(ctx, g.Addr, tlsConf, &quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	callEcho(t, m, (&http3.Transport{}).NewClientConn(first), 40, "first-connection")
	time.Sleep(300 * time.Millisecond) // the NewSessionTicket arrives
	_ = first.CloseWithError(0, "")
	return tlsConf
}

// zeroRTTStream resumes a QUIC session with the gateway through relay
// (its ticket in tlsConf's cache, see h3Ticket) and opens a stream in
// 0-RTT; it returns the connection and the stream.
func zeroRTTStream(t *testing.T, ctx context.Context, relay *handshakeBlocker, tlsConf *tls.Config) (*quic.Conn, *quic.Stream) {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	tr := &quic.Transport{Conn: pc}
	t.Cleanup(func() { tr.Close() })
	conn, err := tr.DialEarly(ctx, relay.ln.LocalAddr(), tlsConf, &quic.Config{})
	if err != nil {
		t.Fatalf("dialing with 0-RTT: %v", err)
	}
	t.Cleanup(func() { _ = conn.CloseWithError(0, "") })
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return conn, str
}

// zeroRTTCall sends a tools/call of echo with text in 0-RTT (see
// zeroRTTStream); it returns the connection and the stream.
func zeroRTTCall(t *testing.T, ctx context.Context, g *h2Gateway, m *rawMCP, relay *handshakeBlocker, tlsConf *tls.Config, text string) (*quic.Conn, *quic.Stream) {
	t.Helper()
	conn, str := zeroRTTStream(t, ctx, relay, tlsConf)
	body := echoCall(41, text)
	fields := [][2]string{
		{":method", "POST"}, {":scheme", "https"}, {":authority", g.Addr}, {":path", "/v1/mcp/svc"},
		{"content-type", "application/json"}, {"accept", "application/json"},
		{"authorization", "Bearer " + aliceKey}, {"x-toolgate-session", m.headers["X-Toolgate-Session"]},
		{"mcp-session-id", m.sessionID}, {"mcp-protocol-version", "2025-11-25"},
		{"content-length", fmt.Sprint(len(body))},
	}
	if err := h3Request(str, fields, body); err != nil {
		t.Fatal(err)
	}
	return conn, str
}

// upstreamCalls counts the requests the upstream received holding text.
func upstreamCalls(up *upstream, text string) int {
	n := 0
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, text) {
			n++
		}
	}
	return n
}
