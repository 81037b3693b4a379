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
	after.Limit(Limits{Idle: 10 * time.Minute, Lifetime: 30 * time.Minute, Issuers: []string{idp}, APIKeys: true})
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
	longer.Limit(Limits{Idle: 48 * time.Hour, Lifetime: 96 * time.Hour, APIKeys: true})
	*clock = clock.Add(61 * time.Minute)
	if _, err := longer.Get(ctx, s.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Errorf("unused 61 minutes with its own idle time of an hour: %v, want it ended", err)
	}
}

// The handlers of one configuration share their terms (For): a console
// ends a sign-in for itself by its own, but deletes it only once every
// console's terms end it, and the API's OAuth callback, which sets none,
// accepts a sign-in while one console's terms do.
func TestLimitsOfSeveralHandlersOfOneConfiguration(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC))
	storage, _ := fileStorage(t)
	every := new(limitSet)
	store := func() *Store {
		st := NewStore(storage, 0, nil, nil)
		st.every = every
		return st
	}
	idp, other := "https://idp.example.test", "https://other.example.test"
	strict, lenient, api := store(), store(), store()
	strict.Limit(Limits{Idle: 10 * time.Minute, Issuers: []string{idp}})
	lenient.Limit(Limits{Idle: time.Hour, Issuers: []string{idp, other}})
	create := func(key string) *Session {
		t.Helper()
		s, err := lenient.Create(ctx, "alice", nil, MethodOIDC, key, time.Hour, 12*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	viaIdP, viaOther := create(idp), create(other)

	// The strict console refuses a sign-in through an issuer it does not
	// list, and deletes nothing the lenient one accepts, reading or sweeping.
	if _, err := strict.Get(ctx, viaOther.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Errorf("the strict console accepted an issuer it does not list: %v", err)
	}
	*clock = clock.Add(11 * time.Minute)
	if _, err := strict.Get(ctx, viaIdP.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Errorf("unused 11 minutes, the strict console's idle 10: %v, want it ended there", err)
	}
	if n, err := strict.Sweep(ctx); err != nil || n != 0 {
		t.Errorf("the strict console's sweep deleted %d sign-ins (%v) the lenient one still accepts", n, err)
	}
	for name, s := range map[string]*Session{"its own issuer": viaIdP, "an issuer only it lists": viaOther} {
		if _, err := lenient.Get(ctx, s.ID); err != nil {
			t.Errorf("the lenient console lost a sign-in through %s: %v", name, err)
		}
	}

	// The API accepts what one console accepts, and nothing none does.
	if _, err := api.Get(ctx, viaOther.ID); err != nil {
		t.Errorf("the API refused a sign-in one console accepts: %v", err)
	}
	*clock = clock.Add(61 * time.Minute)
	if _, err := api.Get(ctx, viaIdP.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Errorf("unused 61 minutes, past every console's idle time: the API accepted it (%v)", err)
	}
	if n, err := strict.Sweep(ctx); err != nil || n != 1 {
		t.Errorf("the sweep deleted %d sign-ins (%v), want the one every console's terms ended", n, err)
	}
}

// The API's OAuth callback judges the browser by the console's terms: a
// sign-in the console's shortened idle time ended does not complete a
// connect.
func TestAPIStoreAppliesTheConsolesLimits(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC))
	storage, _ := fileStorage(t)
	every := new(limitSet)
	earlier := NewStore(storage, 0, nil, nil)
	s, err := earlier.Create(ctx, "alice", nil, MethodAPIKey, "", time.Hour, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	console, api := NewStore(storage, 0, nil, nil), NewStore(storage, 0, nil, nil)
	console.every, api.every = every, every
	console.Limit(Limits{Idle: 10 * time.Minute, APIKeys: true})
	*clock = clock.Add(11 * time.Minute)
	if _, err := api.Get(ctx, s.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Errorf("unused 11 minutes, the console's idle time 10: the API accepted the sign-in (%v)", err)
	}
}

// A configuration whose console no longer signs people in with API keys
// ends the API-key sign-ins made before it, and keeps the others.
func TestLimitsEndAPIKeySignInsWhenAPIKeysSignNoOneIn(t *testing.T) {
	ctx := context.Background()
	setClock(t, time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC))
	storage, _ := fileStorage(t)
	before := NewStore(storage, 0, nil, nil)
	byKey, err := before.Create(ctx, "carol", []string{"admins"}, MethodAPIKey, "", time.Hour, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	idp := "https://idp.example.test"
	viaIdP, err := before.Create(ctx, "carol", []string{"admins"}, MethodOIDC, idp, time.Hour, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	after := NewStore(storage, 0, nil, nil)
	after.Limit(Limits{Issuers: []string{idp}})
	if _, err := after.Get(ctx, byKey.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Errorf("an API-key sign-in under a console that no longer takes API keys: %v, want it ended", err)
	}
	if _, err := after.Get(ctx, viaIdP.ID); err != nil {
		t.Errorf("a sign-in through the configured issuer: %v", err)
	}
}
