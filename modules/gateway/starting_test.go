package gateway

import (
	"context"
	"net/http/httptest"
	"testing"
)

// A request taken before Start finished waits for it: served once Start
// succeeded, refused once it failed or the configuration was unloaded
// before it, and refused when its runner gave up meanwhile.
func TestStartedWaitsForStart(t *testing.T) {
	waiting := func(a *App, ctx context.Context) chan bool {
		got := make(chan bool, 1)
		go func() { got <- a.Started(ctx) }()
		return got
	}

	ok := &App{starting: newStartGate()}
	got := waiting(ok, context.Background())
	ok.starting.end(true)
	ok.starting.end(false) // Cleanup after a successful Start changes nothing
	if !<-got || !ok.Started(context.Background()) {
		t.Fatal("Started after Start succeeded: false")
	}

	failed := &App{starting: newStartGate()}
	got = waiting(failed, context.Background())
	failed.starting.end(false)
	if <-got || failed.Started(context.Background()) {
		t.Fatal("Started after Start failed (or the config was unloaded before it): true")
	}

	ctx, cancel := context.WithCancel(context.Background())
	slow := &App{starting: newStartGate()}
	got = waiting(slow, ctx)
	cancel()
	if <-got {
		t.Fatal("Started for a request whose runner gave up before Start finished: true")
	}

	if !(&App{}).Started(context.Background()) {
		t.Fatal("Started of an App never provisioned (a handler tested alone): false")
	}
}

func TestWriteStartingIsRetryable(t *testing.T) {
	w := httptest.NewRecorder()
	WriteStarting(w)
	if w.Code != 503 || w.Header().Get("Retry-After") != "1" ||
		w.Body.String() != `{"jsonrpc":"2.0","id":null,"error":{"code":-32011,"message":"`+StartingText+`","data":{"retryable":true}}}` {
		t.Fatalf("WriteStarting: %d %v %s", w.Code, w.Header(), w.Body)
	}
}
