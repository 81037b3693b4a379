package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/pgtest"
	"github.com/toolgate/toolgate/internal/sseref"
)

// Three replicas on one PostgreSQL database behind a round-robin load
// balancer carry calls of several runners at 200 calls a second; one
// replica is killed (SIGKILL) in the middle. Only calls in flight at that
// moment may fail, each in a way a runner retries (the balancer's 502, or
// the connection cut before the answer); no call fails that started
// later than staleWindow after the replica was gone; every session, wherever it was initialized,
// continues on the others; and every call that succeeded ran upstream
// exactly once, a failed one at most once.
func TestReplicaKilledUnderLoad(t *testing.T) {
	// staleWindow: the balancer learns that a kept-alive connection to the
	// dead replica is closed when its reader next runs; a call it sends on
	// one before that fails like a call in flight (the write meets a reset
	// connection: 502). On a loaded machine (make test runs packages side
	// by side) that took a few milliseconds.
	const staleWindow = 250 * time.Millisecond
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	const (
		runners  = 12
		rate     = 200 // calls a second, open loop
		duration = 4 * time.Second
		killAt   = 1500 * time.Millisecond
		work     = 40 // milliseconds each call takes upstream, so that some are in flight
	)
	began := time.Now()
	bin := toolgateBinary(t)
	up := startUpstream(t)
	data := t.TempDir()
	storage := postgresStorage(t)
	lbPort := freePort(t)
	lb := &gateway{URL: fmt.Sprintf("http://127.0.0.1:%d", lbPort), DataDir: data}
	block := replicaBlock(storage, data, up.URL, "slow_echo", "")
	var replicas []*replica
	var backends []string
	for range 3 { // one after the other: the first creates the cipher key
		r := startReplicaAt(t, bin, freePort(t), lb.URL, block, data, testdataPath(t, "policy"), "")
		replicas = append(replicas, r)
		backends = append(backends, strings.TrimPrefix(r.URL, "http://"))
	}
	startBalancer(t, bin, lbPort, backends)
	t.Logf("three replicas and the balancer started in %v", time.Since(began).Round(time.Millisecond))

	// The runners initialize through the balancer: round robin spreads
	// their sessions over the three replicas.
	sess := lb.createSession(t, aliceKey, "svc")
	var ms []*rawMCP
	for range runners {
		m := lb.raw(t, aliceKey, sess, "svc")
		m.initialize()
		ms = append(ms, m)
	}
	call := func(m *rawMCP, text string) callOutcome {
		return slowEcho(m, text, work)
	}
	// Every session works on every replica before the kill.
	for i, m := range ms {
		for j := range 3 {
			if o := call(m, fmt.Sprintf("warm-%d-%d", i, j)); o.err != "" {
				t.Fatalf("runner %d before the kill: %s", i, o.err)
			}
		}
	}

	var (
		mu       sync.Mutex
		outcomes []callOutcome
		wg       sync.WaitGroup
	)
	victim := replicas[1]
	var killed, gone time.Time
	killDone := make(chan struct{})
	start := time.Now()
	time.AfterFunc(killAt, func() {
		defer close(killDone)
		killed = time.Now()
		victim.kill(t)
		gone = time.Now() // reaped: its sockets are closed
	})
	// Open loop: call n is due at start + n/rate, whatever the answers.
	total := int(duration.Seconds() * rate)
	for n := range total {
		time.Sleep(time.Until(start.Add(time.Duration(n) * time.Second / rate)))
		m, text := ms[n%runners], fmt.Sprintf("call-%d", n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := call(m, text)
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
		}()
	}
	sent := time.Since(start)
	wg.Wait()
	<-killDone

	// After the kill every runner's session continues, whichever replica
	// initialized it.
	for i, m := range ms {
		if o := call(m, fmt.Sprintf("after-%d", i)); o.err != "" {
			t.Errorf("runner %d after the kill: %s", i, o.err)
		}
	}

	var failed, inFlight, ok int
	kinds := map[string]int{}
	for _, o := range outcomes {
		if o.start.Before(killed) && o.end.After(killed) {
			inFlight++
		}
		if o.err == "" {
			ok++
			continue
		}
		failed++
		kind, _, _ := strings.Cut(o.err, ":")
		kinds[kind]++
		switch {
		case !o.retryable:
			t.Errorf("%s failed without a retryable error: %s", o.text, o.err)
		case !o.start.Before(gone.Add(staleWindow)):
			t.Errorf("%s started %v after the replica was gone and failed: %s", o.text, o.start.Sub(gone), o.err)
		case !o.end.After(killed):
			t.Errorf("%s failed before the kill: %s", o.text, o.err)
		}
	}
	t.Logf("%d calls sent in %v (due at %d/s); %d in flight at the kill, %d failed %v, %d succeeded; the replica took %v to die",
		len(outcomes), sent.Round(time.Millisecond), rate, inFlight, failed, kinds, ok, gone.Sub(killed).Round(time.Millisecond))
	if ok == 0 || inFlight == 0 {
		t.Fatalf("the test exercised nothing: %d succeeded, %d in flight at the kill", ok, inFlight)
	}

	// Nothing ran twice; nothing that succeeded went missing upstream.
	runs := up.slowRuns()
	for _, o := range outcomes {
		switch n := runs[o.text]; {
		case o.err == "" && n != 1:
			t.Errorf("%s succeeded and ran upstream %d times", o.text, n)
		case o.err != "" && n > 1:
			t.Errorf("%s failed and ran upstream %d times", o.text, n)
		}
	}
}

// callOutcome is what a runner saw of one call.
type callOutcome struct {
	text       string
	start, end time.Time
	err        string // "" for a result with the text
	retryable  bool   // the error is one a runner retries
}

// slowEcho calls slow_echo in m's session, as a runner does (a JSON or SSE
// answer), and classifies what came back.
func slowEcho(m *rawMCP, text string, ms int) (o callOutcome) {
	o = callOutcome{text: text, start: time.Now()}
	defer func() { o.end = time.Now() }()
	id := fmt.Sprintf("%q", text)
	body := `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"slow_echo","arguments":{"text":` + id + `,"ms":` + fmt.Sprint(ms) + `}}}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream", body, "")
	if err != nil {
		o.err, o.retryable = "no answer: "+err.Error(), true // the connection failed: nothing came back
		return o
	}
	defer resp.Body.Close()
	data, readErr := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		o.err, o.retryable = fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, data), true
		return o
	default:
		o.err = fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, data)
		return o
	}
	var answer []byte
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for _, ev := range sseref.Parse(string(data)).Events {
			if ev.Type == "message" && strings.Contains(ev.Data, `"id":`+id) {
				answer = []byte(ev.Data)
			}
		}
	} else if len(bytes.TrimSpace(data)) > 0 {
		answer = data
	}
	if answer == nil {
		// The stream was cut before the answer: the replica went away
		// with the call.
		o.err, o.retryable = fmt.Sprintf("stream cut before the answer: %v", readErr), true
		return o
	}
	var a struct {
		Result *struct {
			Content []struct{ Text string }
			IsError bool
		}
		Error *struct {
			Code    int
			Message string
			Data    struct{ Retryable bool }
		}
	}
	if err := json.Unmarshal(answer, &a); err != nil {
		o.err = fmt.Sprintf("undecodable answer %.200s: %v", answer, err)
		return o
	}
	switch {
	case a.Error != nil:
		o.err, o.retryable = fmt.Sprintf("JSON-RPC %d %s", a.Error.Code, a.Error.Message), a.Error.Data.Retryable
	case a.Result == nil || a.Result.IsError || len(a.Result.Content) != 1 || a.Result.Content[0].Text != text:
		o.err = fmt.Sprintf("unexpected result %.200s", answer)
	}
	return o
}

// PostgreSQL stops under two replicas and comes back: meanwhile runners
// get answers or retryable errors, never a lost session; what needs the
// database (a new MCP session, a new toolgate session, ending one) fails
// retryably and changes nothing; once it is back the replicas work again
// without a restart, and an end on one replica reaches the other.
func TestPostgresDownAndBack(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	srv := pgtest.Start(t)
	up := startUpstream(t)
	data := t.TempDir()
	block := replicaBlock("storage postgres "+srv.DSN("postgres"), data, up.URL, "slow_echo", "")
	a := startReplica(t, bin, block, data)
	b := startReplica(t, bin, block, data)
	sess := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.initialize()
	mb := b.raw(t, aliceKey, sess, "svc")
	mb.sessionID = ma.sessionID // initialized on a, continued on b
	for _, m := range []*rawMCP{ma, mb} {
		if o := slowEcho(m, "before", 0); o.err != "" {
			t.Fatalf("before the outage: %s", o.err)
		}
	}

	srv.Stop(t)
	for i, m := range []*rawMCP{ma, mb, ma, mb} {
		if o := slowEcho(m, fmt.Sprintf("down-%d", i), 0); o.err != "" && !o.retryable {
			t.Errorf("a call while PostgreSQL is down: %s, not retryable", o.err)
		} else {
			t.Logf("a call while PostgreSQL is down: %q", o.err) // "" is an answer: nothing needed the database
		}
	}
	fresh := a.raw(t, aliceKey, sess, "svc")
	status, _, msgs := fresh.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if !retryableAnswer(status, msgs) {
		t.Errorf("initialize while PostgreSQL is down: %d %s, want a retryable error", status, msgs)
	}
	if status := mb.delete(); status == http.StatusNoContent || status == http.StatusNotFound {
		t.Errorf("DELETE while PostgreSQL is down answered %d, as if the session were ended", status)
	}
	if r := a.api(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"services":["svc"]}`)); r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("POST /v1/sessions while PostgreSQL is down: %d %s, want 503", r.StatusCode, r.Body)
	}

	srv.Restart(t)
	// Back without a restart of either replica: new sessions work (the
	// pools reconnect on demand, at once), and so does the old one,
	// which the failed DELETE did not end.
	deadline := time.Now().Add(30 * time.Second)
	for {
		fresh := a.raw(t, aliceKey, sess, "svc")
		status, hdr, _ := fresh.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
		if status == http.StatusOK && hdr.Get("Mcp-Session-Id") != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("initialize still fails 30s after PostgreSQL came back: %d", status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, m := range []*rawMCP{ma, mb} {
		if o := slowEcho(m, "after", 0); o.err != "" {
			t.Errorf("the session after the outage: %s", o.err)
		}
	}
	// An end on b reaches a once a's listener is back (it reconnects
	// within seconds and drops what it kept).
	if status := mb.delete(); status != http.StatusNoContent {
		t.Fatalf("DELETE after the outage: %d", status)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		status, _, _ := ma.post(`{"jsonrpc":"2.0","id":9,"method":"ping"}`)
		if status == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session ended on b still answers %d on a 30s later", status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// retryableAnswer reports whether an answer is an error a runner retries:
// HTTP 502, 503 or 504, or a JSON-RPC error with data.retryable.
func retryableAnswer(status int, msgs []json.RawMessage) bool {
	switch status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	for _, m := range msgs {
		var a struct {
			Error *struct{ Data struct{ Retryable bool } }
		}
		if json.Unmarshal(m, &a) == nil && a.Error != nil && a.Error.Data.Retryable {
			return true
		}
	}
	return false
}

// DELETE on one replica ends the MCP session on every replica: requests
// elsewhere get 404 as soon as that replica hears of it (DELETE is
// answered once PostgreSQL sent the news to every replica), a GET stream
// another replica holds for it ends, and the upstream session is ended
// once.
func TestDeleteOnOneReplicaEndsItEverywhere(t *testing.T) {
	up, a, b := twoReplicas(t, "echo", testdataPath(t, "policy"))
	sess := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.initialize()
	mb := b.raw(t, aliceKey, sess, "svc")
	mb.sessionID = ma.sessionID
	if _, err := mb.callEcho("on b"); err != nil {
		t.Fatal(err)
	}
	stream, err := ma.send(t.Context(), http.MethodGet, "text/event-stream", "", "")
	if err != nil || stream.StatusCode != http.StatusOK {
		t.Fatalf("GET stream on a: %v %v", err, stream)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, stream.Body)
		ended <- err
	}()

	if status := mb.delete(); status != http.StatusNoContent {
		t.Fatalf("DELETE on b: %d", status)
	}
	// DELETE is answered once PostgreSQL sent the end to every replica;
	// a's listener takes it a moment later.
	waitFor(t, "the session to be unknown on a after DELETE on b (404)", func() bool {
		status, _, _ := ma.post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		return status == http.StatusNotFound
	})
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Error("the GET stream on a outlived the session's end on b by 10s")
	}
	stream.Body.Close()
	waitFor(t, "the upstream session to be ended", func() bool { return len(up.openSessions()) == 0 })
	deletes := 0
	for _, r := range up.requestLog() {
		if r.Method == http.MethodDelete {
			deletes++
		}
	}
	if deletes != 1 {
		t.Errorf("the upstream got %d DELETEs, want 1", deletes)
	}
}
