package integration

// The harness of the HTTP/2 and HTTP/3 attacks (h2_attack_*_test.go): a
// test gateway served over TLS with h1, h2 and h3 (or over cleartext with
// h2c), and runners that speak HTTP/2 on one connection or HTTP/3.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"
	"golang.org/x/net/http2"
)

// h2Gateway is a test gateway served over TLS (h1, h2, h3) or h2c.
type h2Gateway struct {
	*gateway
	Addr  string // 127.0.0.1:port
	Base  string // https://127.0.0.1:port or http://… for h2c
	Roots *x509.CertPool
	h2c   bool
}

// startH2Gateway starts the gateway of cfg, its site served over TLS
// with the protocols given ("h1 h2 h3"), or over cleartext when protocols
// holds h2c ("h1 h2c").
func startH2Gateway(t testing.TB, cfg gatewayConfig, protocols string) *h2Gateway {
	t.Helper()
	port := freePort(t)
	h2c := strings.Contains(protocols, "h2c")
	if strings.Contains(cfg.Global, "servers {") {
		cfg.Global = strings.Replace(cfg.Global, "servers {", "servers {\n\t\tprotocols "+protocols, 1)
	} else {
		cfg.Global += "\n\tservers {\n\t\tprotocols " + protocols + "\n\t}\n"
	}
	caddyfile, data := gatewayCaddyfile(t, port, cfg)
	site := fmt.Sprintf("http://127.0.0.1:%d {", port)
	if !strings.Contains(caddyfile, site) {
		t.Fatalf("no site %q in the test Caddyfile", site)
	}
	roots := x509.NewCertPool()
	scheme := "http"
	if !h2c {
		certFile, keyFile, cert := h2AttackCert(t)
		roots.AddCert(cert)
		caddyfile = strings.Replace(caddyfile, site,
			fmt.Sprintf("https://127.0.0.1:%d {\n\ttls %s %s", port, certFile, keyFile), 1)
		scheme = "https"
	}
	loadCaddyfile(t, caddyfile)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	h := &h2Gateway{Addr: addr, Base: scheme + "://" + addr, Roots: roots, h2c: h2c}
	pool := &http.Transport{TLSClientConfig: h.tlsConfig("h2", "http/1.1"), ForceAttemptHTTP2: true}
	if h2c {
		pool = &http.Transport{}
		pool.Protocols = new(http.Protocols)
		pool.Protocols.SetUnencryptedHTTP2(true)
	}
	t.Cleanup(pool.CloseIdleConnections)
	h.gateway = &gateway{URL: h.Base, DataDir: data, pool: pool}
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		if i == 100 {
			t.Fatalf("gateway at %s did not start listening", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitOneListener(t, port)
	return h
}

func (h *h2Gateway) tlsConfig(protos ...string) *tls.Config {
	return &tls.Config{RootCAs: h.Roots, ServerName: "127.0.0.1", NextProtos: protos}
}

// h2AttackCert writes a self-signed certificate for 127.0.0.1 and its key.
func h2AttackCert(t testing.TB) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

// h2Conn is one HTTP/2 connection to the gateway, every request on it.
type h2Conn struct {
	*http2.ClientConn
	raw net.Conn
}

// dialH2 opens one HTTP/2 connection (TLS with ALPN h2, or h2c with prior
// knowledge).
func (h *h2Gateway) dialH2(t testing.TB) *h2Conn {
	t.Helper()
	var c net.Conn
	var err error
	tr := &http2.Transport{TLSClientConfig: h.tlsConfig("h2")}
	if h.h2c {
		tr.AllowHTTP = true
		c, err = net.Dial("tcp", h.Addr)
	} else {
		var tc *tls.Conn
		tc, err = tls.Dial("tcp", h.Addr, h.tlsConfig("h2"))
		if err == nil && tc.ConnectionState().NegotiatedProtocol != "h2" {
			t.Fatalf("ALPN negotiated %q, want h2", tc.ConnectionState().NegotiatedProtocol)
		}
		c = tc
	}
	if err != nil {
		t.Fatal(err)
	}
	cc, err := tr.NewClientConn(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close(); c.Close() })
	return &h2Conn{ClientConn: cc, raw: c}
}

// h3Transport is an HTTP/3 client of the gateway.
func (h *h2Gateway) h3Transport(t testing.TB) *http3.Transport {
	tr := &http3.Transport{TLSClientConfig: h.tlsConfig("h3")}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// mcpRequest is a request of runner m (its headers and MCP session) with
// body, for a client of the test's choice.
func (m *rawMCP) mcpRequest(ctx context.Context, method string, body io.Reader, contentLength int64) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, method, m.url, body)
	req.ContentLength = contentLength
	if body == nil {
		req.Body = nil
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range m.headers {
		req.Header.Set(k, v)
	}
	if m.sessionID != "" {
		req.Header.Set("Mcp-Session-Id", m.sessionID)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	return req
}

// stalledBody is a request body that sends head and then nothing more
// until the test ends.
func stalledBody(t testing.TB, head string) io.ReadCloser {
	body, stop := stalledBodyStop(head)
	t.Cleanup(stop)
	return body
}

// stalledBodyStop is stalledBody ended by stop (an error: the client
// resets its stream).
func stalledBodyStop(head string) (io.ReadCloser, func()) {
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(head))
	}()
	return pr, func() { pw.CloseWithError(io.ErrUnexpectedEOF) }
}

// settleGoroutines waits (at most 10 s) until no more than limit
// goroutines run, and returns how many do.
func settleGoroutines(limit int) int {
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > limit && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	return runtime.NumGoroutine()
}

// readAllWithin reads body, failing after d (far above the gateway's own
// bounds).
func readAllWithin(body io.ReadCloser, d time.Duration) ([]byte, error) {
	type res struct {
		b   []byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		b, err := io.ReadAll(body)
		ch <- res{b, err}
	}()
	select {
	case r := <-ch:
		return r.b, r.err
	case <-time.After(d):
		body.Close()
		return nil, fmt.Errorf("the answer did not end within %v", d)
	}
}
