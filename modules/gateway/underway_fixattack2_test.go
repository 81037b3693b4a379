package gateway

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
)

// Attack: a JWT accepted when the stream opened, that merely expired
// since, should still vouch for the stream at a reload (underway), as
// without the reload. verifyJWT validates it "at its exp" instead of now;
// but nbf and iat are then checked against exp too, not against the time
// the token was accepted: a token whose nbf (or iat) lies after its exp by
// more than the leeway (accepted within the leeway of both, as the
// gateway does) is valid when presented and "not valid yet" at every
// later reload, so its stream is cut by a reload that changed nothing.
// Validating at exp plus the leeway (the last instant the gateway itself
// accepted the token) keeps the promise.
func TestFixAttack2UnderwayJWTWithLateNbfRefusedAtReload(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	clock := setClock(t, t0)
	k1 := newSigningKey(t, "k1")
	srv := newJWKSServer(t, k1)
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, JWKSURL: srv.URL}}}) // leeway 30s
	a.start(ctx, srv.Client(), zap.NewNop())
	awaitFetches(t, a)
	exp := t0.Add(time.Minute)
	odd := k1.sign(t, map[string]any{"iss": testIssuer, "aud": "gw", "sub": "alice", "exp": exp.Unix(),
		"nbf": exp.Add(45 * time.Second).Unix(), "iat": exp.Add(45 * time.Second).Unix()})
	usual := k1.sign(t, map[string]any{"iss": testIssuer, "aud": "gw", "sub": "bob", "exp": exp.Unix(),
		"nbf": t0.Unix(), "iat": t0.Unix()})
	*clock = exp.Add(20 * time.Second) // within the leeway of exp and of nbf
	for _, tok := range []string{odd, usual} {
		if _, err := a.authenticate(ctx, bearer(tok), false, "", false); err != nil {
			t.Fatalf("control: the token is refused when presented: %v", err)
		}
	}
	*clock = exp.Add(10 * time.Minute) // a reload, later
	if _, err := a.authenticate(ctx, bearer(usual), false, "", true); err != nil {
		t.Fatalf("control: a usual token that merely expired, under way: %v", err)
	}
	if _, err := a.authenticate(ctx, bearer(odd), false, "", true); err != nil {
		t.Errorf("a token accepted when presented, that merely expired since, is refused under way: %v", err)
	}
}
