package websession

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The configuration in force ends the sign-ins made under an earlier one
// by its own terms: a shorter idle time or lifetime (a longer one extends
// none), and an OpenID Connect issuer no longer configured.
func TestLimitsOfTheConfigurationInForce(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC))
	storage, _ := fileStorage(t)
	before := NewStore(storage, 0, nil, nil)
	create := func(method, key string) *Session {
		t.Helper()
		s, err := before.Create(ctx, "alice", nil, method, key, time.Hour, 12*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	idp, other := "https://idp.example.test", "https://other.example.test"
	viaIdP, viaOther, legacy, byKey := create(MethodOIDC, idp), create(MethodOIDC, other), create(MethodOIDC, ""), create(MethodAPIKey, "")

	after := NewStore(storage, 0, nil, nil)
	after.Limit(Limits{Idle: 10 * time.Minute, Lifetime: 30 * time.Minute, Issuers: []string{idp}})
	if _, err := after.Get(ctx, viaIdP.ID); err != nil {
		t.Fatalf("a sign-in through a configured issuer: %v", err)
	}
	for name, s := range map[string]*Session{"an issuer no longer configured": viaOther, "an issuer not recorded": legacy} {
		if _, err := after.Get(ctx, s.ID); !errors.Is(err, ErrNotSignedIn) {
			t.Errorf("a sign-in through %s: %v, want it ended", name, err)
		}
	}
	if _, err := before.Get(ctx, viaOther.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Error("the sign-in the limits ended is still stored")
	}
	// The shorter idle time applies: 11 minutes unused ends it.
	*clock = clock.Add(11 * time.Minute)
	if _, err := after.Get(ctx, byKey.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Errorf("unused 11 minutes, idle now 10: %v, want it ended", err)
	}
	// The shorter lifetime applies however much it is used.
	for range 3 {
		*clock = clock.Add(9 * time.Minute)
		_, _ = after.Get(ctx, viaIdP.ID)
	}
	if _, err := after.Get(ctx, viaIdP.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Errorf("38 minutes after sign-in, lifetime now 30: %v, want it ended", err)
	}

	// Longer terms extend nothing: the record's own hour of idle time holds.
	s := create(MethodAPIKey, "")
	longer := NewStore(storage, 0, nil, nil)
	longer.Limit(Limits{Idle: 48 * time.Hour, Lifetime: 96 * time.Hour})
	*clock = clock.Add(61 * time.Minute)
	if _, err := longer.Get(ctx, s.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Errorf("unused 61 minutes with its own idle time of an hour: %v, want it ended", err)
	}
}
