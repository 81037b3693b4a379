package integration

import (
	"context"
	"io"
	"testing"
	"time"
)

// Failing peers: an OAuth provider or a Vault that is slow or refuses.
// Calls fail retryably with a message that says which peer, the stored
// grant is never lost or half-written, and everything recovers by itself.
// Also covered elsewhere: TestOAuthProviderDownKeepsTheGrant,
// TestOAuthRejectedRefreshNeedsSignIn (invalid_grant),
// TestOAuthRefusedTokenIsRefreshedOnce, TestOAuthSealedVaultIsRetryable,
// TestOAuthKMSStoppedIsRetryable, TestAdversarialStorage (full and
// read-only storage), and PostgreSQL going away in modules/storage/postgres.

// A runner that gives up while a slow provider refreshes its grant: the
// refresh finishes anyway and its rotated refresh token is stored, so the
// grant is neither lost nor refreshed twice.
func TestAdversarialSlowOAuthProvider(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	waitExpiry(time.Second)

	release := p.holdTokens()
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		resp, err := m.send(ctx, "POST", "application/json, text/event-stream",
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"impatient"}}}`, "")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		gaveUp <- err
	}()
	waitFor(t, "the refresh to reach the provider", func() bool { return p.heldTokenRequests() == 1 })
	cancel()
	if err := <-gaveUp; err == nil {
		t.Fatal("the runner's call finished although the provider held the refresh")
	}
	release()
	waitFor(t, "the refresh to be answered", func() bool { return len(p.refreshes()) == 1 })

	// The next call uses the stored result of that refresh.
	m.mustEcho(t, "patient")
	if n := len(p.refreshes()); n != 1 {
		t.Errorf("%d refreshes, want the one the impatient call started", n)
	}
	p.checkRotation(t)
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "connected" || s.Connection == nil || s.Connection.RefreshCount != 1 {
		t.Errorf("catalog: %+v; want connected, refreshed once", s)
	}
}
