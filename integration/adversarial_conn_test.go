package integration

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Too slow and too idle: clients that send their headers or bodies a byte
// at a time, runners that stop reading their stream, thousands of idle
// connections. Caddy's server timeouts close them (README, "Server
// timeouts"); nothing reaches the upstream, and calls go on meanwhile.
// Too many streams: adversarial_streams_test.go.

// shortTimeouts are server timeouts short enough for a test to see them
// act.
const shortTimeouts = `servers {
		timeouts {
			read_header 300ms
			read_body_idle 300ms 2048
			write_idle 300ms
			idle 2s
		}
	}`

// closedWithin sends what feed returns, one piece at a time, every 50 ms,
// until the server closes the connection or answers, or feed runs out.
// It reports whether the server acted first, and what it answered.
func closedWithin(t *testing.T, conn net.Conn, pieces int, feed func(i int) string) (bool, string) {
	t.Helper()
	for i := range pieces {
		if _, err := conn.Write([]byte(feed(i))); err != nil {
			return true, ""
		}
		_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		buf := make([]byte, 4096)
		n, err := conn.Read(buf)
		if n > 0 {
			return true, string(buf[:n])
		}
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			return true, ""
		}
	}
	return false, ""
}

func dialGateway(t *testing.T, g *gateway) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestAdversarialSlowClients(t *testing.T) {
	// The slow stream reader's answer is 8 MiB: on a busy machine the
	// upstream and the result policy may take seconds over it, which is
	// not what this test is about, so their deadlines are generous.
	up, g, m := aliceSession(t, gatewayConfig{Global: shortTimeouts, Timeout: "2m", PolicyTimeout: "2m"})
	head := func(length int) string {
		return "POST /v1/mcp/svc HTTP/1.1\r\nHost: " + strings.TrimPrefix(g.URL, "http://") +
			"\r\nAuthorization: Bearer " + aliceKey + "\r\nX-Toolgate-Session: " + m.headers["X-Toolgate-Session"] +
			"\r\nMcp-Session-Id: " + m.sessionID + "\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(length) + "\r\n\r\n"
	}
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"slow"}}}`

	// Headers a few bytes at a time: closed after read_header, long
	// before they are complete (the loop would take 10 s).
	t.Run("slow headers", func(t *testing.T) {
		before := snapshot(t, up, g)
		full := head(len(body))
		closed, _ := closedWithin(t, dialGateway(t, g), 200, func(i int) string {
			if i == 0 {
				return "POST /v1/mcp/svc HTTP/1.1\r\n"
			}
			return fmt.Sprintf("X-Slow-%d: a\r\n", i)
		})
		if !closed {
			t.Errorf("a client sending a header line every 50 ms for 10 s kept its connection (%d bytes of headers)", len(full))
		}
		before.check(t)
	})

	// A body that stops: the read fails after read_body_idle; nothing
	// goes upstream.
	t.Run("stalled body", func(t *testing.T) {
		before := snapshot(t, up, g)
		conn := dialGateway(t, g)
		closed, answer := closedWithin(t, conn, 200, func(i int) string {
			if i == 0 {
				return head(len(body)) + body[:10]
			}
			return ""
		})
		if !closed {
			t.Error("a client that stopped sending its body kept its connection for 10 s")
		}
		if answer != "" && !strings.Contains(answer, " 400 ") && !strings.Contains(answer, " 408 ") {
			t.Errorf("answer %q; want 400 or 408, or the connection closed", answer)
		}
		before.check(t)
	})

	// A body trickled a byte every 50 ms never stalls, but falls behind
	// read_body_idle's minimum rate.
	t.Run("trickled body", func(t *testing.T) {
		before := snapshot(t, up, g)
		conn := dialGateway(t, g)
		closed, _ := closedWithin(t, conn, len(body)+1, func(i int) string {
			switch {
			case i == 0:
				return head(len(body))
			case i <= len(body):
				return body[i-1 : i]
			}
			return ""
		})
		if !closed {
			t.Error("a body trickled at 20 bytes/s was read to its end")
		}
		before.check(t)
	})

	// A runner that stops reading the stream of its answer: the write
	// stalls, write_idle ends it, and the session goes on.
	t.Run("slow stream reader", func(t *testing.T) {
		dialer := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			})
			return errors.Join(err, serr)
		}}
		conn, err := dialer.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		big := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"big","arguments":{"bytes":8388608}}}`
		req := strings.Replace(head(len(big)), "Content-Type", "Accept: application/json, text/event-stream\r\nContent-Type", 1) + big
		if _, err := conn.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReaderSize(conn, 1024)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("answer: %d %v", resp.StatusCode, resp.Header)
		}
		// Stop reading until the gateway gave up on the stream: it closes
		// the connection, so reading on finds the end before 8 MiB. Its end
		// of the connection is found first (in whatever state: on a busy
		// machine it may have given up already), so that its leaving
		// ESTABLISHED means something. How soon the gateway gives up
		// depends on the machine (the upstream makes 8 MiB, the gateway
		// checks them, then a write stalls for write_idle): the wait is
		// long, bounded, and not measured.
		server, client := conn.RemoteAddr(), conn.LocalAddr()
		if tcpState(t, server, client) == "" {
			t.Fatal("the gateway's end of the connection is not in /proc/net/tcp")
		}
		waitWithin(t, 2*time.Minute, "the gateway to close the stalled stream", func() bool {
			return tcpState(t, server, client) != tcpEstablished
		})
		var head bytes.Buffer
		n, err := io.Copy(&limitedBuffer{&head, 512}, resp.Body)
		if err == nil || n >= 8<<20 {
			t.Errorf("the runner read %d bytes, err %v; want the stream cut. It began:\n%s", n, err, head.Bytes())
		}
		if _, _, msgs := m.post(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`); !strings.Contains(string(lastMessage(t, msgs)), "after") {
			t.Errorf("the next call: %s", msgs)
		}
		// The stream is kept for the runner to resume, with its request's
		// body room, until the call's deadline (2 minutes) or the session's
		// end: ended now, so that no later test finds the room held.
		if status := m.delete(); status != http.StatusOK && status != http.StatusNoContent {
			t.Errorf("ending the MCP session: %d", status)
		}
	})
}

// established reports whether the TCP connection from local to remote
// is established on this machine (Linux's /proc/net/tcp and tcp6, where a
// dual-stack listener's IPv4 connections are), as the side that owns local
// sees it.
// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// tcpEstablished is TCP_ESTABLISHED as /proc/net/tcp writes it.
const tcpEstablished = "01"

// tcpState is the state of the loopback TCP socket from local to remote as
// /proc/net/tcp shows it (hexadecimal, such as tcpEstablished), or "" when
// there is none.
func tcpState(t testing.TB, local, remote net.Addr) string {
	t.Helper()
	hexAddr := func(a net.Addr) string { // the IPv4 address's last word, and the port
		ta := a.(*net.TCPAddr)
		ip := ta.IP.To4()
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], ta.Port)
	}
	l, r := hexAddr(local), hexAddr(remote)
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) > 3 && strings.HasSuffix(f[1], l) && strings.HasSuffix(f[2], r) {
				return f[3]
			}
		}
	}
	return ""
}

// Thousands of idle connections cost little each and are closed by the
// server's timeouts; calls go on meanwhile.
func TestAdversarialIdleConnections(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{Global: `servers {
		timeouts {
			read_header 3s
		}
	}`})
	const n = 2000
	memBefore, goroutinesBefore := inUse()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	memOpen, goroutinesOpen := inUse()
	perConn := (int64(memOpen) - int64(memBefore)) / n
	t.Logf("%d idle connections: %d bytes and %.1f goroutines each", n, perConn, float64(goroutinesOpen-goroutinesBefore)/n)
	if perConn > 64<<10 {
		t.Errorf("an idle connection costs %d KiB, want under 64", perConn>>10)
	}
	if _, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"busy"}}}`); !strings.Contains(string(lastMessage(t, msgs)), "busy") {
		t.Fatalf("a call among %d idle connections: %s", n, msgs)
	}
	// read_header closes each; the server keeps none of them.
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("idle connection %d: %v; want it closed by the server", i, err)
		}
	}
	waitFor(t, "the server's goroutines to end", func() bool {
		_, goroutines := inUse()
		return goroutines < goroutinesBefore+n/20
	})
}
