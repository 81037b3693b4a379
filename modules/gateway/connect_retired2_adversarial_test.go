package gateway

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// secretsOf is every secret EachSecret gives for conn's credential.
func secretsOf(conn *Connection) []string {
	var out []string
	credentialOf(conn).EachSecret(func(s string) bool { out = append(out, s); return true })
	return out
}

// Holds: Connect now reads the old record under the grant lock before it
// writes the new one; an old record that cannot be read (sealed with a
// key gone, or damaged) does not fail the connect — connecting again
// stays the remedy — and the new record is what storage then holds.
func TestRetired2HoldsConnectOverUnreadableRecord(t *testing.T) {
	ctx := context.Background()
	p := startTestProvider(t)
	a, _ := oauthApp(t, p.srv.URL)
	if err := a.storage.Store(ctx, ConnectionKey("svc", "alice"), []byte("not a sealed record")); err != nil {
		t.Fatal(err)
	}
	conn := p.grant(t, "alice")
	conn.Expiry = now().Add(time.Hour)
	if err := a.Connect(ctx, "svc", "alice", conn); err != nil {
		t.Fatalf("connecting over an unreadable record failed: %v", err)
	}
	got, err := a.connections.LoadFresh(ctx, "svc", "alice")
	if err != nil || got.AccessToken != conn.AccessToken || len(got.Retired) != 0 {
		t.Fatalf("after connecting over an unreadable record: %v, %v", got, err)
	}
}

// Holds: the retired tokens are the connection's own: alice's replaced
// tokens for svc are searched in her answers of svc only, never in bob's
// nor in her answers of another service (a redaction there would tell
// the reader which text is alice's token).
func TestRetired2HoldsRetiredTokensStayWithTheirConnection(t *testing.T) {
	ctx := context.Background()
	p := startTestProvider(t)
	a, _ := oauthApp(t, p.srv.URL)
	bearer := func(token string) *Connection {
		return &Connection{Kind: AuthBearer, AccessToken: token, ConnectedAt: now().UTC()}
	}
	for _, step := range []struct{ svc, user, token string }{
		{"svc", "alice", "alice-svc-token-one"},
		{"svc", "alice", "alice-svc-token-two"},
		{"svc", "bob", "bob-svc-token-only"},
		{"other", "alice", "alice-other-token-only"},
	} {
		if err := a.Connect(ctx, step.svc, step.user, bearer(step.token)); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []struct {
		svc, user string
		secrets   []string
	}{
		{"svc", "alice", []string{"alice-svc-token-two", "alice-svc-token-one"}},
		{"svc", "bob", []string{"bob-svc-token-only"}},
		{"other", "alice", []string{"alice-other-token-only"}},
	} {
		conn, err := a.connections.LoadFresh(ctx, want.svc, want.user)
		if err != nil {
			t.Fatal(err)
		}
		if got := secretsOf(conn); !slices.Equal(got, want.secrets) {
			t.Errorf("%s's credential for %s searches for %q, want %q", want.user, want.svc, got, want.secrets)
		}
	}
}

// Holds: a refresh and a connect of one grant at once (the refresh of
// the old grant near expiry, the person connecting again): both run
// under the grant lock and each reads the record the other wrote, so
// every token that went out stays searched — the final record's current
// token and retired ones hold all three.
func TestRetired2HoldsConnectRacingARefresh(t *testing.T) {
	ctx := context.Background()
	p := startTestProvider(t)
	a, svc := oauthApp(t, p.srv.URL)
	first := p.grant(t, "alice")
	first.Expiry = now().Add(30 * time.Second) // within refresh_skew
	if err := a.connections.Save(ctx, "svc", "alice", first); err != nil {
		t.Fatal(err)
	}
	again := p.grant(t, "alice")
	again.Expiry, again.ConnectedAt = now().Add(time.Hour), now().UTC()
	var wg sync.WaitGroup
	var refreshed *Credential
	var rerr, cerr error
	wg.Go(func() { refreshed, rerr = a.CredentialFor(ctx, svc, "alice") })
	wg.Go(func() { cerr = a.Connect(ctx, "svc", "alice", again) })
	wg.Wait()
	if cerr != nil {
		t.Fatalf("connect: %v", cerr)
	}
	final, err := a.connections.LoadFresh(ctx, "svc", "alice")
	if err != nil {
		t.Fatal(err)
	}
	all := secretsOf(final)
	want := []string{first.AccessToken, again.AccessToken}
	if rerr == nil && refreshed.Secret() != first.AccessToken {
		want = append(want, refreshed.Secret())
	}
	for _, tok := range want {
		if !slices.Contains(all, tok) {
			t.Errorf("a token that went out is not searched after a refresh and a connect at once (%d searched, refresh error %v)", len(all), rerr)
		}
	}
}
