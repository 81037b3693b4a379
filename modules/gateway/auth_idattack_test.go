package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
)

// Attack: the console refuses to name a person by an `email` claim the
// identity provider has not verified (modules/console/signin.go,
// verifySignIn: "anyone who can put an address on an account at the
// provider would sign in as its owner"). Runners' JWTs from the very same
// issuer, with the same user_claim email, get no such check: mallory, who
// put alice's address on her own account at the provider (unverified),
// gets a token naming alice@example.com and toolgate takes her for alice —
// alice's toolgate sessions, stored OAuth grants, approvals.
//
// What should happen: with user_claim email, a token whose email_verified
// is not true is refused, exactly as the console refuses the sign-in.
func TestIDAttackJWTUnverifiedEmailNamesAnotherPerson(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	key := newSigningKey(t, "k1")
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{
		Issuer: testIssuer, Audience: []string{"gw"}, KeyFiles: []string{jwksFile(t, key)},
		UserClaim: "email",
	}}})
	for name, verified := range map[string]any{"email_verified false": false, "email_verified \"false\"": "false", "no email_verified": nil} {
		claims := map[string]any{
			"iss": testIssuer, "aud": "gw", "sub": "mallory-0666", "email": "alice@example.com",
			"exp": clock.Add(time.Hour).Unix(),
		}
		if verified != nil {
			claims["email_verified"] = verified
		}
		c, err := a.Authenticate(ctx, bearer(key.sign(t, claims)), false)
		if err == nil {
			t.Errorf("%s: mallory's token was accepted as %q (method %s); want it refused like the console refuses the sign-in", name, c.User, c.Method)
		} else if !errors.Is(err, ErrBadCredentials) {
			t.Errorf("%s: %v, want ErrBadCredentials", name, err)
		}
	}
}

// Holds: a token naming the person by a verified email is accepted (the
// control for the attack above).
func TestIDAttackHoldsJWTVerifiedEmailAccepted(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	key := newSigningKey(t, "k1")
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{
		Issuer: testIssuer, Audience: []string{"gw"}, KeyFiles: []string{jwksFile(t, key)},
		UserClaim: "email",
	}}})
	c, err := a.Authenticate(ctx, bearer(key.sign(t, map[string]any{
		"iss": testIssuer, "aud": "gw", "sub": "0042", "email": "alice@example.com", "email_verified": true,
		"exp": clock.Add(time.Hour).Unix(),
	})), false)
	if err != nil || c.User != "alice@example.com" {
		t.Fatalf("verified email: %+v, %v", c, err)
	}
}

// Attack: an issuer rotates its signing keys the usual way — the new key
// k2 is published ahead, tokens are signed with it, then the old key k1
// (retired, perhaps because it leaked) is removed from the JWKS. toolgate
// refetches the JWKS only when a token names a key id it does not know;
// every token now names k2, which it knows, so it never reads the JWKS
// again and keeps trusting k1 for as long as the process runs. Whoever
// holds k1 signs, a day later, a token for any user (here "admin") that
// toolgate has never seen, and it is accepted. (The README says removing a
// key does not revoke tokens already seen; this is a token never seen.)
//
// What should happen: fetched keys are trusted for a bounded time (a
// periodic refetch, or the JWKS response's Cache-Control), after which a
// key the issuer no longer publishes verifies nothing new.
func TestIDAttackJWKSRetiredKeyTrustedForever(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	k1, k2 := newSigningKey(t, "k1"), newSigningKey(t, "k2")
	srv := newJWKSServer(t, k1, k2)
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, JWKSURL: srv.URL}}})
	a.start(ctx, srv.Client(), zap.NewNop())
	awaitFetches(t, a)
	claims := func(sub string) map[string]any {
		return map[string]any{"iss": testIssuer, "aud": "gw", "sub": sub, "exp": clock.Add(time.Hour).Unix()}
	}
	if _, err := a.Authenticate(ctx, bearer(k1.sign(t, claims("alice"))), false); err != nil {
		t.Fatalf("control: k1 while published: %v", err)
	}
	srv.setKeys(k2) // k1 retired
	// A day of ordinary traffic, every token signed with k2.
	for range 24 {
		*clock = clock.Add(time.Hour)
		if _, err := a.Authenticate(ctx, bearer(k2.sign(t, claims("bob"))), false); err != nil {
			t.Fatalf("k2: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // room for a background refetch
	}
	var err error
	for range 20 { // a refetch started by the traffic above may still be running
		if _, err = a.Authenticate(ctx, bearer(k1.sign(t, claims("admin"))), false); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err == nil {
		t.Errorf("a new token signed with k1, a day after the issuer stopped publishing it, is accepted (%d JWKS fetches in all); want refused", srv.fetches.Load())
	}
}

// Holds: kid confusion across issuers. Issuer B (say a partner's IdP whose
// users are named differently) cannot speak for issuer A's users: a token
// claiming iss A but signed with B's key — with B's kid, with A's kid, or
// with none — is refused; only A's keys verify A's tokens.
func TestIDAttackHoldsJWTCrossIssuerKeyConfusion(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	ka, kb := newSigningKey(t, "shared-kid"), newSigningKey(t, "b1")
	const issuerB = "https://partner.example.net"
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{
		{Issuer: testIssuer, Audience: []string{"gw"}, KeyFiles: []string{jwksFile(t, ka)}},
		{Issuer: issuerB, Audience: []string{"gw"}, KeyFiles: []string{jwksFile(t, kb), jwksFile(t, signingKey{priv: newSigningKey(t, "").priv, kid: "shared-kid"})}},
	}})
	claimsA := map[string]any{"iss": testIssuer, "aud": "gw", "sub": "alice", "exp": clock.Add(time.Hour).Unix()}
	for name, k := range map[string]signingKey{
		"B's key, B's kid": kb,
		"B's key, A's kid": {priv: kb.priv, kid: "shared-kid"},
		"B's key, no kid":  {priv: kb.priv},
		"an unknown key":   newSigningKey(t, "shared-kid"),
	} {
		if c, err := a.Authenticate(ctx, bearer(k.sign(t, claimsA)), false); err == nil {
			t.Errorf("%s: a token for issuer A's alice was accepted: %+v", name, c)
		}
	}
	if c, err := a.Authenticate(ctx, bearer(ka.sign(t, claimsA)), false); err != nil || c.User != "alice" {
		t.Errorf("control: A's own token: %+v, %v", c, err)
	}
}
