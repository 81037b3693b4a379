package integration

// Replica attacks on console sign-ins: a browser signed in through one
// replica, signed out through the other.

import (
	"net/url"
	"strings"
	"testing"
)

// Attack (held): alice signs in to the console through replica a; her
// cookie works on replica b too (sign-ins live in the shared storage,
// sealed with the shared state_secret). She signs out through b: the
// cookie, replayed by another browser, is dead on a and on b at once
// (sign-ins are read from storage on every request, never cached). Her
// sign-out everywhere through b ends her other browser's sign-in on a,
// and not bob's.
func TestReplicaAttackConsoleSignOutOnOtherReplica(t *testing.T) {
	up := startUpstream(t)
	a, b, _ := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return soBlock(storage, data, up.URL, "echo", "", "")
	})
	alice1 := a.signedIn(t, aliceKey)
	cookies := alice1.client.Jar.Cookies(mustURL(t, a.URL))
	onB := &person{t: t, g: b.gateway, client: alice1.client} // the same browser, its requests balanced to b
	_, page := onB.get(b.URL + "/console/services")
	if !strings.Contains(page, "<h1>Services</h1>") {
		t.Fatalf("alice's sign-in on a, on b: %.300s", page)
	}
	if status, page := onB.post(b.URL+"/console/signout", url.Values{"csrf": {onB.csrf(page)}}); status != 200 || !strings.Contains(page, "signed out") {
		t.Fatalf("sign-out on b: %d %.300s", status, page)
	}
	for _, g := range []*replica{a, b} {
		replay := g.newPerson(t)
		replay.client.Jar.SetCookies(mustURL(t, g.URL), cookies)
		if _, page := replay.get(g.URL + "/console/services"); !strings.Contains(page, "<h1>Sign in</h1>") {
			t.Errorf("the cookie of a sign-in ended on b still works on %s", g.URL)
		}
	}

	other := a.signedIn(t, aliceKey)
	bobA := a.signedIn(t, bobKey)
	third := b.signedIn(t, aliceKey)
	_, page = third.get(b.URL + "/console/services")
	if status, _ := third.post(b.URL+"/console/signout/everywhere", url.Values{"csrf": {third.csrf(page)}}); status != 200 {
		t.Fatalf("sign-out everywhere on b: %d", status)
	}
	if _, page := other.get(a.URL + "/console/services"); !strings.Contains(page, "<h1>Sign in</h1>") {
		t.Error("alice's browser signed in on a is still signed in after her sign-out everywhere on b")
	}
	if _, page := bobA.get(a.URL + "/console/services"); !strings.Contains(page, "<h1>Services</h1>") {
		t.Error("alice signing out everywhere on b signed bob out on a")
	}
}
