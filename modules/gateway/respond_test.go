package gateway

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A result response written in pieces (its envelope around the result) is
// the response RPCResult builds, with the length of the whole.
func TestResultResponseInPieces(t *testing.T) {
	id, result := []byte(`"req-7"`), []byte(`{"content":[{"type":"text","text":"hello"}],"isError":false}`)
	whole := RPCResult(id, result)
	rec := httptest.NewRecorder()
	WriteRPC(rec, http.StatusOK, RPCResultPrefix(id), result, []byte("}"))
	if rec.Body.String() != string(whole) || rec.Header().Get("Content-Length") != "100" || len(whole) != 100 {
		t.Errorf("in pieces: %q (Content-Length %s); whole: %q (%d bytes)", rec.Body.String(), rec.Header().Get("Content-Length"), whole, len(whole))
	}
	if rec.Header().Get("Content-Type") != "application/json" || rec.Code != http.StatusOK {
		t.Errorf("headers %v, status %d", rec.Header(), rec.Code)
	}
}

// API answers are one caller's (their sessions, approvals and the results
// withheld for them): no cache keeps them unless the handler said it may.
func TestWriteJSONIsNotStored(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteJSON(rec, http.StatusOK, map[string]string{"result": "withheld for review"})
	if got := rec.Header().Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", got)
	}
	rec = httptest.NewRecorder()
	rec.Header().Set("Cache-Control", "max-age=3600")
	WriteJSON(rec, http.StatusOK, map[string]string{"resource": "https://gw.example.com"})
	if got := rec.Header().Get("Cache-Control"); got != "max-age=3600" {
		t.Errorf("Cache-Control %q: the handler's own was replaced", got)
	}
}
