package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// A third look at the rejection mark (ConnectionStore.Reject, rejected)
// and the connection App.EachCallSecret reads, from a storage-write attacker's side (no cipher
// key) and a caller's.

// r3Rejected stores was as user's connection to svc and rejects it: the
// mark holds its tokens, sealed.
func r3Rejected(t *testing.T, a *App, service, user string, was *Connection) {
	t.Helper()
	ctx := context.Background()
	if err := a.connections.Save(ctx, service, user, was); err != nil {
		t.Fatal(err)
	}
	if err := a.connections.Reject(ctx, service, user, was); err != nil {
		t.Fatal(err)
	}
	if !a.connections.WasRejected(ctx, service, user) {
		t.Fatal("premise: no rejection mark")
	}
}

func r3Grant(token string) *Connection {
	return &Connection{Kind: AuthOAuth, AccessToken: token, Expiry: now().Add(time.Hour), ConnectedAt: now().UTC(),
		Retired: []RetiredToken{{Token: token + "-older", Expiry: now().Add(time.Hour)}}}
}

// r3ConnectRetires connects user to svc with a new token and returns the
// tokens the new record keeps as retired.
func r3ConnectRetires(t *testing.T, a *App, service, user string) []string {
	t.Helper()
	ctx := context.Background()
	if err := a.Connect(ctx, service, user, &Connection{Kind: AuthOAuth, AccessToken: "the-next-grants-token-" + user, ConnectedAt: now().UTC()}); err != nil {
		t.Fatalf("connect: %v", err)
	}
	stored, err := a.connections.LoadFresh(ctx, service, user)
	if err != nil {
		t.Fatal(err)
	}
	if a.connections.WasRejected(ctx, service, user) {
		t.Fatal("the rejection mark outlived the connect")
	}
	return retiredTokens(stored.Retired)
}

// Holds: DELETE /v1/connections/{service} (App.Disconnect) after the
// provider rejected the grant forgets the mark with its sealed tokens
// (ConnectionStore.Delete deletes both keys): the next connection keeps
// none of them. README: "Disconnecting forgets the retired tokens too".
func TestRetired3HoldsDisconnectForgetsTheMarksTokens(t *testing.T) {
	a, svc := oauthApp(t, "https://provider.example.com")
	r3Rejected(t, a, "svc", "alice", r3Grant("alice-rejected-grant-token"))
	if err := a.Disconnect(context.Background(), svc, "alice"); err != nil {
		t.Fatal(err)
	}
	if a.connections.WasRejected(context.Background(), "svc", "alice") {
		t.Fatal("the rejection mark outlived the disconnect")
	}
	if got := r3ConnectRetires(t, a, "svc", "alice"); len(got) != 0 {
		t.Errorf("a connection after a disconnect keeps %d tokens of the rejected grant", len(got))
	}
}

// Holds: a storage-write attacker moving a mark (or its sealed tokens)
// to another user, another service, or into a connection record gets
// nothing opened: each is sealed under a context naming its service and
// user (retiredContext, apart from CipherContext), and neither the
// connect nor the record read carries the other's tokens. Moving alice's
// mark under bob does not move her tokens into bob's record (where a
// redaction in bob's answers would tell bob alice's token).
func TestRetired3HoldsMarkMovedAcrossUsersServicesAndRecords(t *testing.T) {
	ctx := context.Background()
	a, _ := oauthApp(t, "https://provider.example.com")
	r3Rejected(t, a, "svc", "alice", r3Grant("alice-rejected-grant-token"))
	mark, err := a.storage.Load(ctx, rejectedKey("svc", "alice"))
	if err != nil {
		t.Fatal(err)
	}
	var m rejectedMark
	if err := json.Unmarshal(mark, &m); err != nil || len(m.Retired) == 0 {
		t.Fatalf("premise: the mark keeps no sealed tokens (%v)", err)
	}
	for _, to := range []struct{ svc, user string }{{"svc", "bob"}, {"other", "alice"}, {"svc", "Alice"}, {"svc", "alice/x"}} {
		if err := a.storage.Store(ctx, rejectedKey(to.svc, to.user), mark); err != nil {
			t.Fatal(err)
		}
		if got := r3ConnectRetires(t, a, to.svc, to.user); len(got) != 0 {
			t.Errorf("alice's mark moved to %s/%s: the connection there keeps %d of her tokens", to.svc, to.user, len(got))
		}
	}
	// The mark's sealed tokens as bob's connection record, and bob's
	// record's ciphertext as his mark's tokens: neither opens.
	if err := a.storage.Store(ctx, ConnectionKey("svc", "carol"), m.Retired); err != nil {
		t.Fatal(err)
	}
	if c, err := a.connections.LoadFresh(ctx, "svc", "carol"); err == nil {
		t.Errorf("a mark's sealed tokens opened as a connection record: %v", c)
	}
	if err := a.connections.Save(ctx, "svc", "dave", r3Grant("dave-live-token-xxxxxx")); err != nil {
		t.Fatal(err)
	}
	record, err := a.storage.Load(ctx, ConnectionKey("svc", "dave"))
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := json.Marshal(rejectedMark{RejectedAt: now().UTC(), Retired: record})
	if err := a.storage.Store(ctx, rejectedKey("svc", "dave"), forged); err != nil {
		t.Fatal(err)
	}
	if c := a.connections.rejected(ctx, "svc", "dave"); c != nil {
		t.Errorf("a connection record opened as a mark's tokens: %d", len(c.Retired))
	}
}

// Holds: marks a storage-write attacker wrote — not JSON, a retired
// member that is not base64, random bytes, a mark of 8 MiB — neither make
// the next connect fail nor put anything in its record, and the connect
// clears them.
func TestRetired3HoldsGarbageMarksNeitherFailNorResurrect(t *testing.T) {
	ctx := context.Background()
	a, _ := oauthApp(t, "https://provider.example.com")
	random := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5a, 0x17, 0xc3}, 64))
	huge, _ := json.Marshal(rejectedMark{RejectedAt: now().UTC(), Retired: bytes.Repeat([]byte("x"), 6<<20)})
	for i, mark := range [][]byte{
		[]byte("not json at all"),
		[]byte(`{"rejected_at":"2026-01-01T00:00:00Z","retired":"!!!"}`),
		[]byte(`{"rejected_at":"2026-01-01T00:00:00Z","retired":"` + random + `"}`),
		[]byte(`{"retired":null}`),
		[]byte(`[]`),
		huge,
	} {
		user := "user-" + strings.Repeat("x", i)
		if err := a.storage.Store(ctx, rejectedKey("svc", user), mark); err != nil {
			t.Fatal(err)
		}
		if got := r3ConnectRetires(t, a, "svc", user); len(got) != 0 {
			t.Errorf("mark %d: the connection keeps %d tokens", i, len(got))
		}
	}
}

// Holds: the connection EachCallSecret reads is keyed by the exact user
// and service — a user name differing only in case or by a blank, or
// another service, never gets alice's connection (whose tokens would be
// searched, and so revealed by their redaction, in another's answers).
func TestRetired3HoldsCallSecretsAreExactlyTheCallersOwn(t *testing.T) {
	ctx := context.Background()
	a, svc := oauthApp(t, "https://provider.example.com")
	if err := a.connections.Save(ctx, "svc", "alice", r3Grant("alice-current-token-xxxx")); err != nil {
		t.Fatal(err)
	}
	secrets := func(svc *Service, user string) []string {
		var got []string
		call := &Call{Service: svc, Caller: &Caller{User: user}, Credential: &Credential{Header: "Authorization", Value: "Bearer an-older-token-of-" + user, Grant: "g"}}
		if err := a.EachCallSecret(call, func(s string) bool { got = append(got, s); return true }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := secrets(svc, "alice"); !slices.Contains(got, "alice-current-token-xxxx") {
		t.Fatalf("premise: alice's call secrets %q", got)
	}
	for _, user := range []string{"Alice", "ALICE", "alice ", " alice", "alice\x00", "alic"} {
		if got := secrets(svc, user); slices.Contains(got, "alice-current-token-xxxx") {
			t.Errorf("the call secrets of %q hold alice's token", user)
		}
	}
	other := *svc
	other.ID = "svc2"
	if got := secrets(&other, "alice"); slices.Contains(got, "alice-current-token-xxxx") {
		t.Error("the call secrets of another service hold alice's token to svc")
	}
}
