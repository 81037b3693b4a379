package websession

import (
	"context"
	"testing"
	"time"
)

// Finding (R5 review of b5d7443): the handlers of one configuration share
// their terms, and "a sign-in is deleted only once every handler's terms
// end it" — Get and Sweep ask over(), but makeRoom (run by Create, at
// every sign-in) still deletes each of the person's sign-ins that this
// console's own terms end (alive()). Signing in at a strict console (say
// with API keys only, or one issuer) deletes the person's sign-ins that a
// lenient console of the same configuration still accepts: the person is
// signed out there.
//
// Secure behaviour: Create deletes only what every handler's terms end.
func TestR5ReviewSignInAtStrictConsoleDeletesWhatLenientKeeps(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC))
	storage, _ := fileStorage(t)
	every := new(limitSet)
	store := func() *Store {
		st := NewStore(storage, 10, nil, nil)
		st.every = every
		return st
	}
	idp, other := "https://idp.example.test", "https://other.example.test"
	strict, lenient := store(), store()
	strict.Limit(Limits{Idle: 10 * time.Minute, Issuers: []string{idp}})
	lenient.Limit(Limits{Idle: time.Hour, Issuers: []string{idp, other}})

	viaOther, err := lenient.Create(ctx, "alice", nil, MethodOIDC, other, time.Hour, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	viaIdP, err := lenient.Create(ctx, "alice", nil, MethodOIDC, idp, time.Hour, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	*clock = clock.Add(11 * time.Minute) // past the strict console's idle time, within the lenient one's

	// Control: the sweep (over) keeps both.
	if n, err := strict.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("control: the strict console's sweep deleted %d (%v)", n, err)
	}
	// alice signs in at the strict console (an API-key sign-in).
	if _, err := strict.Create(ctx, "alice", nil, MethodAPIKey, "", time.Hour, 12*time.Hour); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*Session{"an issuer only the lenient console lists": viaOther,
		"an issuer both list, idle past the strict console's terms": viaIdP} {
		if _, err := lenient.Get(ctx, s.ID); err != nil {
			t.Errorf("signing in at the strict console deleted alice's sign-in through %s, which the lenient console of the same configuration still accepts: %v", name, err)
		}
	}
}
