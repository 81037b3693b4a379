package gateway_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Without public_url, the browser origin allowed by default is the
// request's own (OwnOrigin): https with its Host, or http with a Host that
// is an address or localhost; a console served without public_url takes
// its own forms. With public_url, only its origin and
// allowed_origins are; and a request arriving on a loopback address must
// still name a loopback host (DNS rebinding) whatever its Origin says.
func TestCheckOriginAllowsTheRequestsOwnOriginWithoutPublicURL(t *testing.T) {
	bare, err := loadCaddyfile(t, "toolgate {\n}")
	if err != nil {
		t.Fatal(err)
	}
	public, err := loadCaddyfile(t, "toolgate {\n public_url https://gw.example.com\n}")
	if err != nil {
		t.Fatal(err)
	}
	onLoopback := func(r *http.Request) *http.Request {
		return r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 18080}))
	}
	for _, c := range []struct {
		name         string
		public       bool
		host, origin string
		loopback     bool
		want         bool
	}{
		{"own origin, no public_url", false, "127.0.0.1:18080", "http://127.0.0.1:18080", true, true},
		{"own origin, https, no public_url, not loopback", false, "gw.internal:8443", "https://gw.internal:8443", false, true},
		{"own origin spelled in capitals", false, "GW.internal:8443", "https://gw.internal:8443", false, true},
		{"own origin, an address, no public_url, not loopback", false, "10.0.0.7:8080", "http://10.0.0.7:8080", false, true},
		// Over plain http a name may be any name rebound to the gateway's
		// address: it needs public_url or allowed_origins.
		{"own origin, plain http by name, no public_url", false, "gw.internal:8080", "http://gw.internal:8080", false, false},
		{"another origin, no public_url", false, "127.0.0.1:18080", "http://evil.example", true, false},
		{"another port, no public_url", false, "127.0.0.1:18080", "http://127.0.0.1:18081", true, false},
		{"plain http by name, another port, no public_url", false, "gw.internal:8443", "http://gw.internal:8443", false, false},
		{"null, no public_url", false, "127.0.0.1:18080", "null", true, false},
		{"rebinding: own origin of a foreign name on loopback", false, "evil.example:18080", "http://evil.example:18080", true, false},
		{"no Origin, no public_url", false, "127.0.0.1:18080", "", true, true},
		{"public_url's origin", true, "gw.example.com", "https://gw.example.com", false, true},
		{"the request's own origin, public_url set", true, "127.0.0.1:18080", "http://127.0.0.1:18080", true, false},
	} {
		app := bare
		if c.public {
			app = public
		}
		r := httptest.NewRequest(http.MethodPost, "http://"+c.host+"/console/signin", nil)
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if c.loopback {
			r = onLoopback(r)
		}
		if got := app.CheckOrigin(r); got != c.want {
			t.Errorf("%s: CheckOrigin = %v, want %v", c.name, got, c.want)
		}
	}
}
