package gateway_test

import (
	"crypto/tls"
	"net"
	"testing"
)

// Attack (fixed: an address's or localhost's origin takes the connection's
// scheme): without public_url, OwnOrigin took "https://" + Host as the
// gateway's own on any connection, plain ones included ("also behind a
// proxy that terminates TLS"), comparing the origin's host text with the
// Host header. When neither carries a port, the two name different
// origins: https://localhost is port 443, the gateway's plain
// http://localhost is port 80. Browsers let an https page fetch or post
// to http://localhost, http://127.0.0.1 and http://[::1] (potentially
// trustworthy: no mixed-content block), and such a request carries
// Origin: https://localhost and Host: localhost — which OwnOrigin, and so
// CheckOrigin and the console's sameOrigin, accept. Any other local
// service on https port 443 (a developer's mkcert dev server, a local
// reverse proxy, an app the victim runs) therefore passes CheckOrigin and
// the console's sameOrigin: it can sign the victim's browser in to an
// attacker's API key (login CSRF: the sign-in form checks only
// sameOrigin; integration TestD2AttackLoginCSRFFromHTTPSLocalhostPage)
// and drive every flow that needs no credential; the Host check of
// loopback connections passes, as localhost is loopback. (Forms after
// sign-in also need the session's CSRF token, which such a page lacks.)
// Severity: low (needs a gateway on port 80 of the loopback without
// public_url and another https origin on port 443 of the same host).
// Fix: compare effective origins, not text: give the origin and the Host
// their scheme's default port (the Host's scheme being the connection's:
// http on a plain one) and accept "https" on a plain connection only when
// the Host names an explicit port equal to the origin's, or when a
// trusted proxy's X-Forwarded-Proto says https; or refuse an https origin
// for a loopback Host on a plain connection.
func TestD2AttackHTTPSOriginOfPort443TakenForPlainPort80(t *testing.T) {
	bare, err := loadCaddyfile(t, "toolgate {\n}")
	if err != nil {
		t.Fatal(err)
	}
	lo4 := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80}
	lo6 := &net.TCPAddr{IP: net.IPv6loopback, Port: 80}
	for _, c := range []struct {
		host, origin string
		local        net.Addr
	}{
		{"localhost", "https://localhost", lo4},
		{"127.0.0.1", "https://127.0.0.1", lo4},
		{"[::1]", "https://[::1]", lo6},
	} {
		r := d1Request(c.host, c.origin, c.local, "127.0.0.1:50000")
		if bare.OwnOrigin(r, c.origin) || bare.CheckOrigin(r) {
			t.Errorf("a page of %s (port 443) posting to the plain gateway at http://%s (port 80): OwnOrigin %v, CheckOrigin %v (want refused: another origin)",
				c.origin, c.host, bare.OwnOrigin(r, c.origin), bare.CheckOrigin(r))
		}
	}
}

// Attack (legitimate configuration refused; fixed: browserOrigin): with public_url, OwnOrigin
// compares the Origin with public_url's scheme://host[:port] as written
// ("as browsers send it: lower case"), but nothing makes it so: Validate
// accepts public_url https://Gateway.Example.com and
// https://gateway.example.com:443, while browsers send Origin
// https://gateway.example.com. Every browser request with an Origin is
// then refused — the console's sign-in and forms (sameOrigin), the API,
// the MCP endpoint — with a message about untrusted pages, though the
// README's public_url row calls it "the one browser origin allowed by
// default". allowed_origins refuses such spellings at validation; public_url
// does not.
// Severity: low (availability, misleading; no bypass).
// Fix: normalise publicOrigin in Provision (lower-case scheme and host,
// drop the scheme's default port, IDN to its xn-- form), or refuse such a
// public_url in Validate as allowed_origins does.
func TestD2AttackPublicURLOriginNotNormalised(t *testing.T) {
	for _, c := range []struct{ publicURL, host string }{
		{"https://Gateway.Example.com", "Gateway.Example.com"},
		{"https://gateway.example.com:443", "gateway.example.com:443"},
		{"http://gateway.example.com:80", "gateway.example.com:80"},
	} {
		app, err := loadCaddyfile(t, "toolgate {\n public_url "+c.publicURL+"\n}")
		if err != nil {
			t.Errorf("public_url %s: %v", c.publicURL, err)
			continue
		}
		origin := "https://gateway.example.com"
		if c.publicURL[:5] == "http:" {
			origin = "http://gateway.example.com"
		}
		r := d1Request("gateway.example.com", origin, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 8443}, "10.0.0.2:40000")
		r.TLS = &tls.ConnectionState{}
		if !app.OwnOrigin(r, origin) || !app.CheckOrigin(r) {
			t.Errorf("public_url %s accepted, but the browser's Origin %s for it is refused (OwnOrigin %v, CheckOrigin %v)",
				c.publicURL, origin, app.OwnOrigin(r, origin), app.CheckOrigin(r))
		}
	}
}

// Held: without public_url, what a DNS-rebinding page or a foreign page
// can present is refused: a name over plain http whatever its spelling
// (trailing dot, upper case, a subdomain of localhost, a decimal or octal
// or hex IPv4 form — browsers normalise those to dotted quads before
// sending Host and Origin, so a mismatch is a forged request), an IPv6
// zone, another port, another scheme on TLS, an origin with a path or
// userinfo; and https only with the same Host text.
func TestD2AttackOwnOriginSpellingsHeld(t *testing.T) {
	bare, err := loadCaddyfile(t, "toolgate {\n}")
	if err != nil {
		t.Fatal(err)
	}
	lan := &net.TCPAddr{IP: net.IPv4(192, 168, 1, 5), Port: 8080}
	for _, c := range []struct {
		host, origin string
		tls, want    bool
	}{
		{"evil.example:8080", "http://evil.example:8080", false, false},
		{"localhost.:8080", "http://localhost.:8080", false, false},
		{"a.localhost:8080", "http://a.localhost:8080", false, false},
		{"2130706433:8080", "http://2130706433:8080", false, false},
		{"0x7f000001:8080", "http://0x7f000001:8080", false, false},
		{"[fe80::1%25eth0]:8080", "http://[fe80::1%25eth0]:8080", false, false},
		{"192.168.1.5:8080", "http://192.168.1.5:8081", false, false},
		{"192.168.1.5:8080", "http://192.168.1.5:8080/", false, false},
		{"192.168.1.5:8080", "http://x@192.168.1.5:8080", false, false},
		{"192.168.1.5:8080", "http://192.168.1.5:8080", true, false},
		{"192.168.1.5:8080", "ftp://192.168.1.5:8080", false, false},
		{"evil.example:8443", "https://other.example:8443", true, false},
		{"192.168.1.5:8080", "http://192.168.1.5:8080", false, true},
		{"[::ffff:192.168.1.5]:8080", "http://[::ffff:192.168.1.5]:8080", false, true},
		{"gw.example:8443", "https://gw.example:8443", true, true},
	} {
		r := d1Request(c.host, c.origin, lan, "192.168.1.20:40000")
		if c.tls {
			r.TLS = &tls.ConnectionState{}
		}
		if got := bare.OwnOrigin(r, c.origin); got != c.want {
			t.Errorf("Host %q, Origin %q, TLS %v: OwnOrigin = %v, want %v", c.host, c.origin, c.tls, got, c.want)
		}
	}
}
