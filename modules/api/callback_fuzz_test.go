package api_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/toolgate/toolgate/internal/testcaddy"
	_ "github.com/toolgate/toolgate/modules/api"
	_ "github.com/toolgate/toolgate/modules/ciphers/local"
	_ "github.com/toolgate/toolgate/modules/console"
)

// FuzzOAuthCallbackQuery sends the OAuth callback
// (GET /v1/connections/{service}/callback) whatever query a provider or
// an attacker may put in a browser's address bar, to a gateway running in
// this process, with no toolgate sign-in in the browser. When state is
// not empty, the query starts with a state signed with the gateway's
// secret whose payload is state (so that the fuzzer gets past the
// signature into the checks behind it). Nothing may happen: the answer
// is a 400 page, or 403 (another browser) for a signed state; never 200
// or 5xx; the provider is never asked for a token; the storage is byte for
// byte as it was; and nothing from the query becomes markup in the page.
func FuzzOAuthCallbackQuery(f *testing.F) {
	valid := []byte(`{"u":"alice@example.com","b":"a-browser","s":"svc","e":4102444800,"n":"a-nonce"}`)
	for _, seed := range []struct {
		query string
		state []byte
	}{
		{"", nil},
		{"code=abc&state=xyz", nil},
		{"state=xyz", nil},
		{"code=abc", nil},
		{"error=access_denied&state=xyz", nil},
		{"error=server_error&error_description=down+for+maintenance", nil},
		{"error=%3Cscript%3Ealert(1)%3C%2Fscript%3E&error_description=%3Cimg+src%3Dx+onerror%3Dalert(1)%3E", nil},
		{"code=a&code=b&state=s&state=t", nil},
		{"state=eyJ1IjoiYSJ9.AAAA&code=c", nil},
		{"code=%ff%fe&state=%00", nil},
		{"code=c;state=s", nil},
		{"%zz=1&state=s&code=c", nil},
		{"error=&error_description=" + strings.Repeat("d", 301), nil},
		{"iss=https%3A%2F%2Fevil.example&code=c&state=s", nil},
		{"code=abc", valid},
		{"error=access_denied&error_description=%3Cb%3Eno%3C%2Fb%3E", valid},
		{"", valid},
		{"code=abc", []byte(`{"u":"alice@example.com","b":"a-browser","s":"other","e":4102444800,"n":"a-nonce"}`)},
		{"code=abc", []byte(`{"u":"alice@example.com","b":"a-browser","s":"svc","e":1,"n":"a-nonce"}`)},
		{"code=abc", []byte(`{"u":"","b":"","s":"svc","e":4102444800,"n":""}`)},
		{"code=abc", []byte(`{"u":"../../x","b":"a","s":"svc","e":4102444800,"n":"../../../etc"}`)},
		{"code=abc", []byte(`[1,2`)},
	} {
		f.Add(seed.query, seed.state)
	}
	cb := startCallbackGateway(f)
	tags := strings.Count(cb.get(f, "").body, "<")
	before := cb.stored(f)
	f.Fuzz(func(t *testing.T, query string, state []byte) {
		if len(state) > 0 {
			query = "state=" + signState(state) + "&" + query
		}
		got := cb.get(t, query)
		if got.status != http.StatusBadRequest && (got.status != http.StatusForbidden || len(state) == 0) {
			t.Fatalf("?%s: %d, want 400 (or 403 for a signed state)\n%s", query, got.status, got.body)
		}
		if n := strings.Count(got.body, "<"); n != tags {
			t.Fatalf("?%s: the page has %d tags, want %d: the query became markup\n%s", query, n, tags, got.body)
		}
		if n := cb.providerCalls.Load(); n != 0 {
			t.Fatalf("?%s: the provider was asked %d times", query, n)
		}
		if after := cb.stored(t); after != before {
			t.Fatalf("?%s: the storage changed:\n%s\n→\n%s", query, before, after)
		}
	})
}

// callbackStateSecret is the test gateway's state_secret.
const callbackStateSecret = "a-state-secret-of-at-least-32-bytes!"

// signState signs payload as the gateway signs its OAuth states:
// base64url(payload) "." base64url(HMAC-SHA256(state_secret, payload)).
func signState(payload []byte) string {
	mac := hmac.New(sha256.New, []byte(callbackStateSecret))
	mac.Write(payload)
	return base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// callbackGateway is a gateway in this process with one oauth service,
// svc, whose provider counts the requests it gets.
type callbackGateway struct {
	url           string
	data          string
	client        *http.Client
	providerCalls atomic.Int64
}

func startCallbackGateway(t testing.TB) *callbackGateway {
	cb := &callbackGateway{data: t.TempDir(), client: &http.Client{Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		cb.providerCalls.Add(1)
		http.Error(w, "no", http.StatusBadRequest)
	}))
	t.Cleanup(provider.Close)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cb.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	caddyfile := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output discard
	}
	toolgate {
		public_url %[1]s
		storage file_system %[2]s
		cipher local %[2]s/cipher.key
		state_secret %[5]s
		auth {
			api_key sha256:%[3]x alice@example.com
		}
		service svc {
			url http://127.0.0.1:1/mcp
			allow_http
			tools echo
			auth oauth {
				authorization_url %[4]s/authorize
				token_url %[4]s/token
				client_id client
				client_secret secret
			}
		}
	}
}

%[1]s {
	route {
		toolgate_api
		toolgate_console {
			api_key_login
		}
	}
}
`, cb.url, cb.data, sha256.Sum256([]byte("alice-key")), provider.URL, callbackStateSecret)
	testcaddy.Load(t, caddyfile, cb.url+"/.well-known/oauth-protected-resource", cb.client)
	return cb
}

type callbackAnswer struct {
	status int
	body   string
}

// get sends the callback with query as its raw query.
func (cb *callbackGateway) get(t testing.TB, query string) callbackAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cb.url+"/v1/connections/svc/callback", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.URL.RawQuery = asBrowserSends(query)
	resp, err := cb.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return callbackAnswer{resp.StatusCode, string(body)}
}

// asBrowserSends is query as a browser puts it in a request line: bytes
// a URI's query may not hold (RFC 3986: controls, space, quotes, angle
// brackets, non-ASCII, …) percent-encoded, everything else, including
// broken percent escapes, as it is.
func asBrowserSends(query string) string {
	var b strings.Builder
	for i := range len(query) {
		c := query[i]
		if c > ' ' && c < 0x7f && !strings.ContainsRune("\"#<>\\^`{|}", rune(c)) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// stored is every file of the storage and its content, as one string.
func (cb *callbackGateway) stored(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(cb.data, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		fmt.Fprintf(&b, "%s %x %v\n", strings.TrimPrefix(path, cb.data), sha256.Sum256(data), err)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
