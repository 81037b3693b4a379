package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/activity"
	tg "github.com/toolgate/toolgate/modules/gateway"
)

// Config reloads under load: a service added, an allowlist changed, the
// policy swapped, an API key rotated in, and an invalid config refused,
// while calls run and an SSE stream is open. Every call gets its answer
// and none runs twice upstream; the stream finishes; each change applies.
//
// Calls whose connection the reload closed before any answer (Go's HTTP
// server, under every Caddy site alike, drops requests that arrive on
// keep-alive connections once its graceful shutdown began, and the kernel
// resets connections queued on the listening socket a reload closes; see
// BenchmarkReloads and the README) are sent again once on a new
// connection (up to three times), as an HTTP client may when it got no
// answer: the test counts them and asserts that no call reached the
// upstream twice.
func TestReloadsUnderLoad(t *testing.T) {
	up := startUpstream(t)
	port := freePort(t)
	swapped := copyPolicies(t, testdataPath(t, "policy"))
	request, err := os.ReadFile(filepath.Join(swapped, "request.rego"))
	if err != nil {
		t.Fatal(err)
	}
	// The swapped policy forbids leak instead of forbidden_tool.
	if err := os.WriteFile(filepath.Join(swapped, "request.rego"),
		[]byte(strings.ReplaceAll(string(request), `input.tool.name == "forbidden_tool"`, `input.tool.name == "leak"`)), 0o644); err != nil {
		t.Fatal(err)
	}
	base := gatewayConfig{Upstream: up.URL}
	g := startGatewayOnPort(t, port, base)
	base.DataDir = g.DataDir
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()

	// An SSE stream open across the reloads: 100 progress steps, 2 s.
	streamDone := make(chan string, 1)
	go func() {
		resp, err := m.send(context.Background(), http.MethodPost, "application/json, text/event-stream",
			`{"jsonrpc":"2.0","id":"stream","method":"tools/call","params":{"name":"progress","arguments":{"steps":100},"_meta":{"progressToken":"p"}}}`, "")
		if err != nil {
			streamDone <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		msgs := readSSE(resp.Body)
		if len(msgs) == 0 {
			streamDone <- "no message"
			return
		}
		streamDone <- string(msgs[len(msgs)-1])
	}()

	stop := make(chan struct{})
	loadDone := make(chan reloadLoad, 1)
	go func() { loadDone <- runReloadLoad(m, 40, stop) }()

	steps := []struct {
		what string
		cfg  func(gatewayConfig) gatewayConfig
	}{
		{"a service added", func(c gatewayConfig) gatewayConfig {
			c.Services = "service added {\n\t\t\turl " + up.URL + "\n\t\t\tallow_http\n\t\t\ttools echo\n\t\t}"
			return c
		}},
		{"an allowlist changed", func(c gatewayConfig) gatewayConfig { c.Tools = "echo progress leak"; return c }},
		{"the policy swapped", func(c gatewayConfig) gatewayConfig { c.RequestPolicy = swapped; return c }},
		{"a key rotated in", func(c gatewayConfig) gatewayConfig {
			c.AuthExtra = "api_key " + hashKey("rotated-key") + " " + alice
			return c
		}},
	}
	cfg := base
	for _, step := range steps {
		time.Sleep(300 * time.Millisecond)
		cfg = step.cfg(cfg)
		startGatewayOnPort(t, port, cfg)
		// An invalid config between two good ones is refused; the last good
		// one keeps serving.
		bad := cfg
		bad.Services += "\n\t\tservice broken {\n\t\t\turl http://127.0.0.1:1/mcp\n\t\t\ttools echo\n\t\t}"
		if err := tryLoadGateway(t, port, bad); err == nil || !strings.Contains(err.Error(), "broken") {
			t.Fatalf("after %s, an invalid config: %v; want it refused, naming the service", step.what, err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	load := <-loadDone

	t.Logf("%d calls across %d reloads; %d lost their connection before an answer and were sent again", load.calls, len(steps), load.resent)
	for _, f := range load.failures {
		t.Errorf("call failed: %s", f)
	}
	if load.calls < 60 {
		t.Errorf("only %d calls ran", load.calls)
	}
	// No call ran twice upstream.
	seen := map[string]int{}
	for _, r := range up.requestLog() {
		if call := callTextRE.FindString(r.Body); call != "" {
			seen[call]++
		}
	}
	for call, n := range seen {
		if n > 1 {
			t.Errorf("%s reached the upstream %d times", call, n)
		}
	}
	select {
	case last := <-streamDone:
		if !strings.Contains(last, `"text":"done"`) && !strings.Contains(last, `"error"`) {
			t.Errorf("the stream open across the reloads ended with %s; want its result or a JSON-RPC error", last)
		}
		if strings.Contains(last, `"text":"done"`) {
			// Its result was decided on the configuration the first reload
			// replaced, whose activity record had stopped: the decision is
			// on the Activity page all the same.
			waitForActivity(t, g.DataDir, alice, func(d tg.DecisionRecord) bool {
				return d.Tool == "progress" && d.Stage == "result" && d.Channel == "result"
			})
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stream open across the reloads never ended")
	}

	// Every change applies.
	call := func(m *rawMCP, tool string) string {
		t.Helper()
		_, _, msgs := m.post(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"` + tool + `","arguments":{"text":"x"}}}`)
		return string(lastMessage(t, msgs))
	}
	if got := call(m, "big"); !strings.Contains(got, "Unknown tool") {
		t.Errorf("big after the allowlist dropped it: %s", got)
	}
	if got := call(m, "leak"); !strings.Contains(got, "forbidden in tests") {
		t.Errorf("leak under the swapped policy: %s", got)
	}
	rotated := g.raw(t, "rotated-key", g.createSession(t, "rotated-key", "added"), "added")
	rotated.initialize()
	if got := call(rotated, "echo"); !strings.Contains(got, `\"text\":\"x\"`) {
		t.Errorf("the added service with the rotated key: %s", got)
	}
}

var callTextRE = regexp.MustCompile(`"text":"call-\d+"`)

// waitForActivity waits until user's activity record, in the storage of
// the gateway at dataDir, holds a decision that matches.
func waitForActivity(t testing.TB, dataDir, user string, match func(tg.DecisionRecord) bool) {
	t.Helper()
	record := activity.New(&certmagic.FileStorage{Path: dataDir}, time.Hour, 0, zap.NewNop())
	var got []tg.DecisionRecord
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var err error
		if got, err = record.Recent(context.Background(), user, 1000); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(got, match) {
			return
		}
	}
	t.Errorf("the activity record of %s lacks the decision; it holds %d: %+v", user, len(got), got)
}

// tryLoadGateway loads a gateway config as a reload does and returns the
// error that refused it.
func tryLoadGateway(t testing.TB, port int, cfg gatewayConfig) error {
	t.Helper()
	caddyfile, _ := gatewayCaddyfile(t, port, cfg)
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		return err
	}
	caddyMu.Lock()
	defer caddyMu.Unlock()
	return caddy.Load(cfgJSON, true)
}

// reloadLoad is what runReloadLoad saw.
type reloadLoad struct {
	calls    int
	resent   int      // calls sent again after their connection closed unanswered
	failures []string // calls that did not get their answer
}

// runReloadLoad sends tools/call messages in m's session, rate per second
// (open loop, one keep-alive client), until stop is closed.
func runReloadLoad(m *rawMCP, rate int, stop <-chan struct{}) reloadLoad {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: 20 * time.Second}
	var (
		mu  sync.Mutex
		out reloadLoad
		wg  sync.WaitGroup
	)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			wg.Wait()
			return out
		case <-tick.C:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			text := fmt.Sprintf("call-%d", i)
			answer, err := reloadCall(client, m, i, text)
			resent := false
			for attempt := 0; attempt < 3 && errors.Is(err, errUnanswered); attempt++ {
				// Again, on a connection of its own.
				resent = true
				fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
				answer, err = reloadCall(fresh, m, i, text)
			}
			mu.Lock()
			defer mu.Unlock()
			out.calls++
			if resent {
				out.resent++
			}
			switch {
			case err != nil:
				out.failures = append(out.failures, fmt.Sprintf("%s: %v", text, err))
			case !strings.Contains(answer, `\"text\":\"`+text+`\"`):
				out.failures = append(out.failures, fmt.Sprintf("%s: %.300s", text, answer))
			}
		}()
	}
}

// errUnanswered reports a call whose connection ended before any byte of
// an answer.
var errUnanswered = errors.New("the connection ended before an answer")

func reloadCall(client *http.Client, m *rawMCP, id int, text string) (string, error) {
	req := m.echoRequest(id, text)
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w: %v", errUnanswered, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	var msg json.RawMessage
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &msg) != nil {
		return "", fmt.Errorf("HTTP %d: %.300s", resp.StatusCode, data)
	}
	return string(data), nil
}
