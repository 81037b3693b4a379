package integration

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// A method the API does not serve a path with gets 405 and the methods
// it does (Allow), not 404 "no API route"; a path it does not serve gets
// 404.
func TestAPIAnswersAWrongMethodWith405(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodPost, "/v1/catalog", http.StatusMethodNotAllowed, "GET"},
		{http.MethodPut, "/v1/sessions/abc", http.StatusMethodNotAllowed, "GET, DELETE"},
		{http.MethodGet, "/v1/tool-pins/accept", http.StatusMethodNotAllowed, "POST"},
		{http.MethodGet, "/v1/nothing", http.StatusNotFound, ""},
	} {
		req, err := http.NewRequest(c.method, g.URL+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: HTTP %d, Allow %q; want %d, Allow %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), c.status, c.allow)
		}
	}
}

// GET /v1/sessions lists the caller's live sessions by ref (never an id,
// which only its creator saw), and DELETE /v1/sessions/{ref} ends one: a
// caller who lost a session's id can still end it (the session limit's
// 429 says so). Another caller's ref, and a ref of no session, are 404
// and end nothing.
func TestAPIListsSessionsAndEndsOneByRef(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	first := g.createSession(t, aliceKey, "svc")
	second := g.createSession(t, aliceKey, "svc")
	bobs := g.createSession(t, bobKey, "svc")

	list := func(key string) []map[string]any {
		r := g.api(t, http.MethodGet, "/v1/sessions", key, nil)
		var body struct{ Sessions []map[string]any }
		if r.StatusCode != http.StatusOK || json.Unmarshal(r.Body, &body) != nil {
			t.Fatalf("GET /v1/sessions: %d %s", r.StatusCode, r.Body)
		}
		for _, s := range body.Sessions {
			if text, _ := json.Marshal(s); strings.Contains(string(text), first) || strings.Contains(string(text), second) || strings.Contains(string(text), bobs) {
				t.Fatalf("GET /v1/sessions shows a session id: %s", text)
			}
		}
		return body.Sessions
	}
	alices := list(aliceKey)
	if len(alices) != 2 {
		t.Fatalf("alice's sessions: %v, want 2", alices)
	}
	bobRef, _ := list(bobKey)[0]["ref"].(string)
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+bobRef, aliceKey, nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("alice ending bob's session by its ref: %d %s, want 404", r.StatusCode, r.Body)
	}
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+strings.Repeat("0", 64), aliceKey, nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("ending a ref of no session: %d %s, want 404", r.StatusCode, r.Body)
	}
	if n := len(list(bobKey)); n != 1 {
		t.Fatalf("bob's session was ended by alice's request (%d left)", n)
	}

	ref, _ := alices[0]["ref"].(string)
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+ref, aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("ending alice's session by its ref: %d %s", r.StatusCode, r.Body)
	}
	var statuses []int
	for _, id := range []string{first, second} {
		statuses = append(statuses, g.api(t, http.MethodGet, "/v1/sessions/"+id, aliceKey, nil).StatusCode)
	}
	if !slices.Contains(statuses, http.StatusNotFound) || !slices.Contains(statuses, http.StatusOK) {
		t.Errorf("after ending one of alice's two sessions by its ref, GET of each answers %v: want one 404, one 200", statuses)
	}
	if n := len(list(aliceKey)); n != 1 {
		t.Errorf("alice has %d sessions listed after ending one of two", n)
	}
}

// GET /v1/tool-pins?changed= takes true or false: anything else is 400, not
// read as false (a monitor asking ?changed=1 took every pin for a changed
// one).
func TestAPIToolPinsChangedTakesTrueOrFalse(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	for query, want := range map[string]int{"true": http.StatusOK, "false": http.StatusOK, "1": http.StatusBadRequest, "yes": http.StatusBadRequest, "TRUE": http.StatusBadRequest} {
		if r := g.api(t, http.MethodGet, "/v1/tool-pins?changed="+query, carolKey, nil); r.StatusCode != want {
			t.Errorf("GET /v1/tool-pins?changed=%s: %d %s, want %d", query, r.StatusCode, r.Body, want)
		}
	}
}

// A personal token that could never be sent as a bearer token is refused
// when stored, saying why: a control character (which failed every call as
// "the upstream is unreachable"), a space, a character outside ASCII, or
// the token given with its "Bearer " prefix. Nothing is stored then.
func TestAPIRefusesAPersonalTokenThatCannotBeSent(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer"})
	for _, token := range []string{"abc\x01def", "abc def", "abc\u00e9", "Bearer abcdef", " abc", "abc\t"} {
		body, _ := json.Marshal(map[string]string{"token": token})
		r := g.api(t, http.MethodPut, "/v1/connections/svc", aliceKey, body)
		if r.StatusCode != http.StatusBadRequest || !strings.Contains(string(r.Body), "invalid_token") {
			t.Errorf("storing the token %q: %d %s, want 400 invalid_token", token, r.StatusCode, r.Body)
		}
	}
	if r := g.api(t, http.MethodGet, "/v1/catalog", aliceKey, nil); !strings.Contains(string(r.Body), `"needs_sign_in"`) {
		t.Errorf("a refused token was stored: %s", r.Body)
	}
	if r := g.api(t, http.MethodPut, "/v1/connections/svc", aliceKey, []byte(`{"token":"ghp_AbC.123-_~+/=="}`)); r.StatusCode != http.StatusNoContent {
		t.Errorf("storing a well-formed token: %d %s", r.StatusCode, r.Body)
	}
}
