package integration

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// Finding (R5 review of 9960b11, "a link's or provider's text is shown
// with nothing hidden or reordered"): the Activity page still prints the
// link's ?user= text as it is — "Recent decisions for <user>" — escaped as
// HTML but with its bidirectional and invisible characters raw and with no
// bound on its length (activity.html: {{$d.User}}, not {{visible …}}),
// unlike the connect page's ?for= the commit fixed. A link sent to an
// administrator puts a reordered sentence on toolgate's own page.
//
// Secure behaviour: the filter is shown through approval.Visible (cut),
// as every other outside text on the console.
func TestR5ReviewActivityPageEchoesLinkUserTextRaw(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	admin := g.signedIn(t, carolKey)
	crafted := "alice@example.test\u202e moc.elpmaxe-lieve//:sptth ta ngis-er tsum uoY \u202c"
	status, page := admin.get(g.URL + "/console/activity?user=" + url.QueryEscape(crafted))
	if status != http.StatusOK || !strings.Contains(page, "Recent decisions for") {
		t.Fatalf("control: the admin's filtered Activity page: %d\n%.2000s", status, page)
	}
	for _, line := range strings.Split(htmlUnescape(page), "\n") {
		if strings.Contains(line, "Recent decisions for") && strings.ContainsRune(line, '\u202e') {
			t.Errorf("the Activity page shows the link's ?user= text with a raw U+202E (right-to-left override): %q; "+
				"want it escaped like other outside text", line)
		}
	}
}

// Finding (R5 review of b5d7443, "sign-ins made under an earlier
// configuration end by this one's terms … an issuer no longer
// configured"): the terms (websession.Limits) name the OpenID Connect
// issuers in force, but not whether API-key sign-in is. An administrator
// who turns api_key_login off (to require the identity provider's
// sign-in, its MFA) and reloads leaves every console sign-in made by
// pasting an API key alive, with its groups (an admin's included), until
// its own lifetime ends.
//
// Secure behaviour: a sign-in by a method the configuration in force no
// longer offers ends, as one through an issuer no longer configured does.
func TestR5ReviewAPIKeySignInSurvivesAPIKeyLoginTurnedOff(t *testing.T) {
	idp := startHostileIssuer(t)
	up := startUpstream(t)
	port := freePort(t)
	g := startGatewayOnPort(t, port, gatewayConfig{Upstream: up.URL, Extra: "state_secret " + testStateSecret,
		Console: "api_key_login\n\t\t" + r5OIDCBlock(idp.URL)})
	admin := g.signedIn(t, carolKey)
	if _, page := admin.get(g.URL + "/console/activity?everyone=1"); !strings.Contains(page, "Recent decisions of everyone") {
		t.Fatalf("control: carol (admins), signed in with her API key, does not see everyone's activity:\n%.2000s", page)
	}
	// SSO only from now on: API-key sign-in is turned off.
	g2 := startGatewayOnPort(t, port, gatewayConfig{Upstream: up.URL, Extra: "state_secret " + testStateSecret,
		Console: r5OIDCBlock(idp.URL), DataDir: g.DataDir})
	fresh := g2.newPerson(t)
	if status, _ := fresh.post(g2.URL+"/console/signin", url.Values{"api_key": {carolKey}}); status == http.StatusOK {
		if _, page := fresh.get(g2.URL + "/console/activity?everyone=1"); strings.Contains(page, "Recent decisions of everyone") {
			t.Fatalf("control: API-key sign-in still works after api_key_login was turned off")
		}
	}
	admin.g = g2
	if _, page := admin.get(g2.URL + "/console/activity?everyone=1"); strings.Contains(page, "Recent decisions of everyone") {
		t.Errorf("api_key_login is off, yet the console sign-in made by pasting an API key before the reload still acts as an admin")
	}
}
