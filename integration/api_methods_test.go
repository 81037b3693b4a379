package integration

import (
	"net/http"
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
