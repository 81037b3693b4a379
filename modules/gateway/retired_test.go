package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// retiredTokens is the tokens of rs, in order.
func retiredTokens(rs []RetiredToken) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Token)
	}
	return out
}

// A replaced connection's token joins the retired ones: each once (where
// it was retired last), never the token now sent, none expired, the
// newest maxRetired; the replaced connection's own list is left as it was
// (it may be the cache's shared copy).
func TestRetiring(t *testing.T) {
	clock := setClock(t, time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	later := clock.Add(time.Hour)
	was := &Connection{AccessToken: "token-two", Expiry: later, Retired: []RetiredToken{
		{Token: "token-expired", Expiry: clock.Add(-time.Second)},
		{Token: "token-one", Expiry: later},
		{Token: "token-three"}, // no expiry known: kept
		{Token: "token-one", Expiry: later},
		{Token: ""},
	}}
	shared := slices.Clone(was.Retired)
	next := &Connection{AccessToken: "token-three"}
	got := retiredTokens(next.retiring(was))
	if want := []string{"token-one", "token-two"}; !slices.Equal(got, want) {
		t.Fatalf("retired %q, want %q", got, want)
	}
	if !slices.Equal(was.Retired, shared) {
		t.Fatalf("the replaced connection's list was changed: %v", retiredTokens(was.Retired))
	}
	if got := next.retiring(nil); got != nil {
		t.Fatalf("nothing replaced, and %v retired", got)
	}

	c := &Connection{}
	for i := range 3 * maxRetired {
		n := &Connection{AccessToken: fmt.Sprintf("token-%02d", i)}
		n.Retired = n.retiring(c)
		c = n
	}
	got = retiredTokens(c.Retired)
	if len(got) != maxRetired || got[len(got)-1] != fmt.Sprintf("token-%02d", 3*maxRetired-2) {
		t.Fatalf("after many replacements %q, want the newest %d, the last replaced last", got, maxRetired)
	}
}

// A credential's secrets are its value's, then its connection's retired
// tokens; Secret is the value's alone.
func TestCredentialEachSecretWithRetired(t *testing.T) {
	conn := &Connection{AccessToken: "the-current-token", Retired: []RetiredToken{{Token: "the-previous-token"}, {Token: "short"}}}
	c := credentialOf(conn)
	var got []string
	c.EachSecret(func(s string) bool { got = append(got, s); return true })
	if want := []string{"the-current-token", "the-previous-token"}; !slices.Equal(got, want) {
		t.Fatalf("EachSecret gave %q, want %q", got, want)
	}
	got = nil
	c.EachSecret(func(s string) bool { got = append(got, s); return false })
	if len(got) != 1 {
		t.Fatalf("EachSecret went on after f returned false: %q", got)
	}
	if c.Secret() != "the-current-token" || !c.HasSecret() {
		t.Fatalf("Secret = %q, HasSecret = %v", c.Secret(), c.HasSecret())
	}
	// A value too short to look for still has its retired tokens looked for.
	c = credentialOf(&Connection{AccessToken: "x", Retired: []RetiredToken{{Token: "the-previous-token"}}})
	if c.Secret() != "" || !c.HasSecret() {
		t.Fatalf("short value: Secret = %q, HasSecret = %v", c.Secret(), c.HasSecret())
	}
	if s := fmt.Sprint(conn, c); strings.Contains(s, "the-previous-token") || strings.Contains(s, "the-current-token") {
		t.Fatalf("a retired token in a printed connection or credential: %s", s)
	}
}

// Every replacement of a stored connection keeps the token it replaced: a
// refresh as the token nears expiry, a refresh after an upstream refused
// it, and connecting again; the record read from storage (as another
// replica reads it) has them, and the credential of the next call looks
// for them.
func TestStoredConnectionKeepsRetiredTokens(t *testing.T) {
	ctx := context.Background()
	p := startTestProvider(t)
	a, svc := oauthApp(t, p.srv.URL)
	conn := p.grant(t, "alice")
	conn.Expiry = now().Add(30 * time.Second) // within the default refresh_skew, not expired
	if err := a.connections.Save(ctx, "svc", "alice", conn); err != nil {
		t.Fatal(err)
	}
	first, err := a.CredentialFor(ctx, svc, "alice")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := a.connections.LoadFresh(ctx, "svc", "alice")
	if err != nil || stored.AccessToken == conn.AccessToken || !slices.Equal(retiredTokens(stored.Retired), []string{conn.AccessToken}) {
		t.Fatalf("after a refresh near expiry: %v, retired %d, %v; want the old token retired", stored, len(stored.Retired), err)
	}
	var secrets []string
	first.EachSecret(func(s string) bool { secrets = append(secrets, s); return true })
	if !slices.Equal(secrets, []string{stored.AccessToken, conn.AccessToken}) {
		t.Fatalf("the refreshed credential looks for %d secrets, want the new token and the old", len(secrets))
	}

	// Refused by an upstream: refreshed again (a while after the last
	// refresh), the refused token retired as well.
	setClock(t, now().Add(2*refusedRefreshInterval))
	fresh, err := a.CredentialRefused(ctx, svc, "alice", first)
	if err != nil {
		t.Fatal(err)
	}
	refused := stored.AccessToken
	stored, err = a.connections.LoadFresh(ctx, "svc", "alice")
	if err != nil || stored.AccessToken == refused || !slices.Contains(retiredTokens(stored.Retired), refused) {
		t.Fatalf("after a refusal: retired %d, %v; want the refused token retired", len(stored.Retired), err)
	}
	if !strings.HasSuffix(fresh.Value, stored.AccessToken) {
		t.Fatal("the credential after the refusal is not the stored one")
	}

	// Connecting again (another grant) keeps them all.
	before := append(retiredTokens(stored.Retired), stored.AccessToken)
	if err := a.Connect(ctx, "svc", "alice", p.grant(t, "alice")); err != nil {
		t.Fatal(err)
	}
	stored, err = a.connections.LoadFresh(ctx, "svc", "alice")
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range before {
		if tok != conn.AccessToken && !slices.Contains(retiredTokens(stored.Retired), tok) { // conn's has expired by the clock
			t.Fatalf("connecting again dropped a retired token (%d kept)", len(stored.Retired))
		}
	}
}

// A grant the provider rejected leaves its tokens sealed in the rejection
// mark (never in the clear), and the next connection keeps them as
// retired; disconnecting forgets them with the mark.
func TestRejectedGrantKeepsItsTokensForTheNextConnection(t *testing.T) {
	ctx := context.Background()
	storage, dir := fileStorage(t)
	a, _ := oauthApp(t, "https://provider.example.com")
	a.storage = storage
	a.connections = newConnectionStore(storage, a.cipher, time.Minute)
	was := &Connection{Kind: AuthOAuth, AccessToken: "the-rejected-grants-token", Expiry: now().Add(time.Hour),
		Retired: []RetiredToken{{Token: "an-older-token-of-the-grant", Expiry: now().Add(time.Hour)}}}
	if err := a.connections.Save(ctx, "svc", "alice", was); err != nil {
		t.Fatal(err)
	}
	if err := a.connections.Reject(ctx, "svc", "alice", was); err != nil {
		t.Fatal(err)
	}
	for name, data := range storedFiles(t, dir) {
		if strings.Contains(string(data), "rejected-grants-token") || strings.Contains(string(data), "older-token") {
			t.Fatalf("%s holds a token in the clear", name)
		}
	}
	if !a.connections.WasRejected(ctx, "svc", "alice") {
		t.Fatal("no rejection mark")
	}
	if err := a.Connect(ctx, "svc", "alice", &Connection{Kind: AuthOAuth, AccessToken: "the-new-grants-token", ConnectedAt: now()}); err != nil {
		t.Fatal(err)
	}
	stored, err := a.connections.LoadFresh(ctx, "svc", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if got := retiredTokens(stored.Retired); !slices.Equal(got, []string{"an-older-token-of-the-grant", "the-rejected-grants-token"}) {
		t.Fatalf("the new connection retired %d tokens, want the rejected grant's two", len(got))
	}
	if a.connections.WasRejected(ctx, "svc", "alice") {
		t.Fatal("the rejection mark outlived the new connection")
	}

	// A mark sealed under another user's context keeps nothing for alice.
	if err := a.connections.Reject(ctx, "svc", "bob", was); err != nil {
		t.Fatal(err)
	}
	mark, err := storage.Load(ctx, rejectedKey("svc", "bob"))
	if err != nil {
		t.Fatal(err)
	}
	if err := storage.Store(ctx, rejectedKey("svc", "carol"), mark); err != nil {
		t.Fatal(err)
	}
	if c := a.connections.rejected(ctx, "svc", "carol"); c != nil {
		t.Fatalf("bob's rejected tokens opened as carol's: %d", len(c.Retired))
	}
}

// EachCallSecret gives the call's credential's secrets, then, for a
// per-user one, those of the caller's connection as it stands now (read
// from storage when the replica holds no copy) when its token is another;
// a service-wide credential's alone; and fails when the connection cannot
// be read.
func TestEachCallSecret(t *testing.T) {
	ctx := context.Background()
	a, svc := oauthApp(t, "https://provider.example.com")
	old := &Credential{Header: "Authorization", Value: "Bearer the-token-the-call-sent", Grant: "g"}
	call := &Call{Service: svc, Caller: &Caller{User: "alice"}, Credential: old}
	secrets := func() []string {
		t.Helper()
		var got []string
		if err := a.EachCallSecret(call, func(s string) bool { got = append(got, s); return true }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := secrets(); !slices.Equal(got, []string{"the-token-the-call-sent"}) {
		t.Fatalf("no connection stored: %q", got)
	}
	if err := a.connections.Save(ctx, "svc", "alice", &Connection{Kind: AuthOAuth, AccessToken: "the-token-refreshed-since",
		Retired: []RetiredToken{{Token: "the-token-the-call-sent"}, {Token: "an-older-token"}}}); err != nil {
		t.Fatal(err)
	}
	want := []string{"the-token-the-call-sent", "the-token-refreshed-since", "an-older-token"}
	if got := secrets(); !slices.Equal(got, want) {
		t.Fatalf("cached: %q, want %q", got, want)
	}
	a.connections.cache.Forget(ConnectionKey("svc", "alice"))
	if got := secrets(); !slices.Equal(got, want) {
		t.Fatalf("not cached (read from storage): %q, want %q", got, want)
	}
	var first []string
	if err := a.EachCallSecret(call, func(s string) bool { first = append(first, s); return false }); err != nil || len(first) != 1 {
		t.Fatalf("went on after f returned false: %q, %v", first, err)
	}

	// Unreadable: an error, so that nothing is relayed unsearched.
	if err := a.storage.Store(ctx, ConnectionKey("svc", "alice"), []byte("not sealed")); err != nil {
		t.Fatal(err)
	}
	a.connections.cache.Forget(ConnectionKey("svc", "alice"))
	if err := a.EachCallSecret(call, func(string) bool { return true }); err == nil {
		t.Fatal("an unreadable connection, and no error")
	}

	header := &Call{Service: &Service{ID: "hdr"}, Caller: &Caller{User: "alice"}, Credential: &Credential{Header: "X-Key", Value: "a-service-wide-key"}}
	var got []string
	if err := a.EachCallSecret(header, func(s string) bool { got = append(got, s); return true }); err != nil || !slices.Equal(got, []string{"a-service-wide-key"}) {
		t.Fatalf("a service-wide credential: %q, %v", got, err)
	}
}

// BenchmarkEachCallSecret is what every search of an upstream's message
// costs to know what to look for, for a per-user credential whose
// connection the replica holds (the steady state).
func BenchmarkEachCallSecret(b *testing.B) {
	ctx := context.Background()
	a, svc := oauthApp(b, "https://provider.example.com")
	conn := &Connection{Kind: AuthOAuth, AccessToken: "the-current-token-of-alice", Retired: []RetiredToken{{Token: "an-older-token"}}}
	if err := a.connections.Save(ctx, "svc", "alice@example.com", conn); err != nil {
		b.Fatal(err)
	}
	call := &Call{Service: svc, Caller: &Caller{User: "alice@example.com"}, Credential: credentialOf(conn)}
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		if err := a.EachCallSecret(call, func(string) bool { n++; return true }); err != nil || n != 2 {
			b.Fatal(n, err)
		}
	}
}

// A service-wide header's replaced values are retired per service (the
// newest maxRetired), each secret of the value as EachSecret gives it;
// a value served again is not retired, and another service's are its own.
func TestServiceHeadersRetireReplacedValues(t *testing.T) {
	var h headerHistory
	hdr := func(v string) *Credential { return &Credential{Header: "X-Api-Key", Value: v} }
	h.serve("svc", hdr("key-one-0123456789"))
	if got := h.retired("svc"); got != nil {
		t.Fatalf("nothing replaced, and %v retired", retiredTokens(got))
	}
	h.serve("svc", hdr("key-one-0123456789")) // a reload that kept it
	h.serve("svc", hdr("key-two-0123456789 v2"))
	if got := retiredTokens(h.retired("svc")); !slices.Equal(got, []string{"key-one-0123456789"}) {
		t.Fatalf("retired %q, want the first key", got)
	}
	h.serve("svc", hdr("key-one-0123456789")) // back to the first
	if got := retiredTokens(h.retired("svc")); !slices.Equal(got, []string{"key-two-0123456789"}) {
		t.Fatalf("retired %q, want the second key's secret only", got)
	}
	if h.retired("other") != nil {
		t.Fatal("another service shares svc's retired values")
	}
	for i := range 3 * maxRetired {
		h.serve("svc", hdr(fmt.Sprintf("key-%02d-0123456789", i)))
	}
	if got := retiredTokens(h.retired("svc")); len(got) != maxRetired || got[len(got)-1] != fmt.Sprintf("key-%02d-0123456789", 3*maxRetired-2) {
		t.Fatalf("after many reloads %q", got)
	}
	c := &Credential{Header: "X-Api-Key", Value: "key-now-0123456789", retired: h.retired("svc")}
	n := 0
	c.EachSecret(func(string) bool { n++; return true })
	if n != 1+maxRetired {
		t.Fatalf("EachSecret gave %d secrets, want the value's and %d retired", n, maxRetired)
	}
}
