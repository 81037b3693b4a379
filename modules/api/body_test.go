package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// A body the API refuses is said wrong in the API's words (the field and
// the kind it takes), not in Go's (struct fields, Go types, parser states).
func TestBodyErrorsSayWhatIsWrong(t *testing.T) {
	for body, want := range map[string]string{
		``:                             "the body is empty: send a JSON object",
		`not json`:                     "the body is not JSON: send a JSON object",
		`{"services":`:                 "the body is not JSON: send a JSON object",
		`["tracker"]`:                  "the body must be a JSON object, not an array",
		`{"services":"tracker"}`:       "services must be an array of strings, not a string",
		`{"services":[1]}`:             "services must be a string, not a number",
		`{"services":["a"],"ttl":"x"}`: `unknown field "ttl"`,
		`{"services":["a"]} {}`:        "the body must hold exactly one JSON object",
	} {
		var v struct {
			Services []string `json:"services"`
		}
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/sessions", strings.NewReader(body))
		if readJSON(w, r, &v) {
			t.Errorf("%q: read", body)
			continue
		}
		got := gjson.Get(w.Body.String(), "error.message").String()
		if got == "" {
			got = w.Body.String()
		}
		if !strings.Contains(got, want) || strings.Contains(got, "Go ") || strings.Contains(got, "struct") || strings.Contains(got, "[]string") {
			t.Errorf("%q: %d %s, want %q", body, w.Code, got, want)
		}
	}
}
