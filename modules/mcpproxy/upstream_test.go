package mcpproxy

import (
	"mime"
	"net/http"
	"testing"
)

// mediaTypeIs reads a Content-Type as mime.ParseMediaType does, without
// its allocations: the same verdict for every value below.
func TestMediaTypeIsAsMimeReadsIt(t *testing.T) {
	values := []string{
		"text/event-stream", "TEXT/Event-Stream", " text/event-stream ; charset=utf-8", "text/event-stream;",
		"text/event-stream; =bad", "text/event-streams", "text/event-strea", "text/ event-stream",
		"text/event-ſtream", "text/event\u212Astream", "application/json", "application/JSON;charset=UTF-8",
		"application/json-seq", "application/problem+json", "", ";", "application/json\x00", "\ttext/event-stream\t",
	}
	for _, v := range values {
		for _, want := range []string{"text/event-stream", "application/json"} {
			mt, _, _ := mime.ParseMediaType(v)
			if got := mediaTypeIs(http.Header{"Content-Type": {v}}, want); got != (mt == want) {
				t.Errorf("mediaTypeIs(%q, %q) = %v; mime reads %q", v, want, got, mt)
			}
		}
	}
	if mediaTypeIs(http.Header{}, "application/json") {
		t.Error("no Content-Type is application/json")
	}
}
