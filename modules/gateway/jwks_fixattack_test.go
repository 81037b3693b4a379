package gateway

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
)

// The identity provider's JWKS endpoint hangs (it accepts the connection
// and never answers: an overloaded or half-down IdP) when the fetched set
// is past jwksMaxAge. A token signed with a key the set holds waits for the
// refetch only jwksStaleWait, then is verified with the keys held: a
// caller whose request allows it a few seconds is not refused (before, it
// waited for the whole fetch, up to jwksFetchTimeout). Checked by the
// caller's own deadline, not by timing the call.
func TestStaleJWKSWhileTheIssuerHangsDelaysLittle(t *testing.T) {
	clock := setClock(t, time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC))
	k1 := newSigningKey(t, "k1")
	srv := newJWKSServer(t, k1)
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, JWKSURL: srv.URL}}})
	a.start(context.Background(), srv.Client(), zap.NewNop())
	awaitFetches(t, a)

	*clock = clock.Add(16 * time.Minute)
	srv.mu.Lock() // the IdP hangs: the refetch waits until the test releases it
	released := false
	defer func() {
		if !released {
			srv.mu.Unlock()
		}
	}()
	tok := k1.sign(t, map[string]any{"iss": testIssuer, "aud": "gw", "sub": "alice", "exp": clock.Add(time.Hour).Unix()})
	ctx, cancel := context.WithTimeout(context.Background(), 4*jwksStaleWait)
	defer cancel()
	_, err := a.Authenticate(ctx, bearer(tok), false)
	srv.mu.Unlock()
	released = true
	if err != nil {
		t.Errorf("a token signed with a key the set holds, the IdP hanging and the set 16 minutes old, the caller allowing %v: %v; want it verified with the keys held", 4*jwksStaleWait, err)
	}
}

// Holds: a key the issuer stopped publishing verifies no new token once
// the set is older than jwksMaxAge, though every token names a key the
// set holds (no unknown kid triggers the refetch); an IdP answering 500 at
// that point leaves the set as it was (a current key still verifies), and
// a flood of such tokens fetches at most once.
func TestFixAttackHoldsStaleJWKSRetiresKey(t *testing.T) {
	clock, srv, k1, k2, auth := jwksOfTwoKeys(t)
	if err := auth(k1); err != nil {
		t.Fatal(err)
	}
	// The IdP is down when the set goes stale: nothing changes.
	srv.mu.Lock()
	srv.status = 500
	srv.mu.Unlock()
	*clock = clock.Add(16 * time.Minute)
	for range 20 {
		if err := auth(k1); err != nil {
			t.Fatalf("k1 with the IdP answering 500 on a stale set: %v", err)
		}
	}
	if n := srv.fetches.Load(); n != 2 {
		t.Errorf("%d fetches, want 2 (start and one refetch)", n)
	}
	// The IdP is back and retired k1.
	srv.mu.Lock()
	srv.status = 200
	srv.keys = []signingKey{k2}
	srv.mu.Unlock()
	*clock = clock.Add(16 * time.Minute)
	if err := auth(k1); err == nil {
		t.Error("a key retired more than 15 minutes ago still verifies new tokens")
	}
	if err := auth(k2); err != nil {
		t.Errorf("k2: %v", err)
	}
}

// awaitFetches makes t wait, as it ends, for the key-set fetches a's
// issuers still run in the background: they read the test's clock, which
// the next test sets.
func awaitFetches(t *testing.T, a *AuthConfig) {
	t.Cleanup(func() {
		for _, j := range a.JWT {
			if j.keys == nil || j.keys.shared == nil {
				continue
			}
			sh := j.keys.shared
			sh.mu.RLock()
			done := sh.fetching
			sh.mu.RUnlock()
			if done != nil {
				<-done
			}
		}
	})
}

// jwksOfTwoKeys is an issuer publishing the keys k1 and k2 (srv), an auth
// block trusting it with its key set fetched at 03:00 on clock, and auth,
// which authenticates a new token (none remembered) signed with a key.
func jwksOfTwoKeys(t *testing.T) (clock *time.Time, srv *jwksServer, k1, k2 signingKey, auth func(signingKey) error) {
	t.Helper()
	ctx := context.Background()
	clock = setClock(t, time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC))
	k1, k2 = newSigningKey(t, "k1"), newSigningKey(t, "k2")
	srv = newJWKSServer(t, k1, k2)
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, JWKSURL: srv.URL}}})
	a.start(ctx, srv.Client(), zap.NewNop())
	awaitFetches(t, a)
	sub := 0
	auth = func(k signingKey) error {
		sub++
		_, err := a.Authenticate(ctx, bearer(k.sign(t, map[string]any{"iss": testIssuer, "aud": "gw", "sub": "u" + time.Duration(sub).String(), "exp": clock.Add(time.Hour).Unix()})), false)
		return err
	}
	return clock, srv, k1, k2, auth
}
