package integration

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkReloads measures config reloads under load: the real toolgate
// binary, in its own process, serves a gateway site and a plain Caddy
// reverse_proxy site in front of the same upstream; both take 200 calls/s
// (open loop, keep-alive clients that never resend) while the process is
// reloaded through its admin API ten times, once a second (services added,
// allowlists changed, the policy swapped, API keys rotated in, and twice an
// invalid config first, which must be refused). It reports the failed calls
// of each, by kind. It measures; it never fails on figures.
// TOOLGATE_RELOAD_RATE sets the rate, TOOLGATE_RELOAD_H2C=1 makes both
// sites and clients speak HTTP/2 without TLS.
//
//	make reloads [RATE=200] [H2C=1]
func BenchmarkReloads(b *testing.B) {
	rate, reloads, every := 200, 10, time.Second
	if v, err := strconv.Atoi(os.Getenv("TOOLGATE_RELOAD_RATE")); err == nil {
		rate = v
	}
	h2c := os.Getenv("TOOLGATE_RELOAD_H2C") != ""
	bin := toolgateBinary(b)
	up := startUpstream(b)
	for range b.N {
		r := startReloadable(b, bin, up, h2c)
		var wg sync.WaitGroup
		var gw, plain loadResult
		duration := time.Duration(reloads+2) * every
		wg.Add(2)
		go func() { defer wg.Done(); gw = callLoop(r.gateway, rate, duration, h2c) }()
		go func() { defer wg.Done(); plain = callLoop(r.plain, rate, duration, h2c) }()
		time.Sleep(every)
		failedReloads := 0
		var took []time.Duration
		for i := range reloads {
			began := time.Now()
			if err := r.reload(i + 1); err != nil {
				failedReloads++
				b.Logf("reload %d: %v", i+1, err)
			}
			took = append(took, time.Since(began).Round(time.Millisecond))
			time.Sleep(every)
		}
		wg.Wait()
		b.Logf("reloads took %v", took)
		for _, side := range []struct {
			name string
			res  loadResult
		}{{"toolgate", gw}, {"plain Caddy reverse_proxy", plain}} {
			b.Logf("%s: %d calls, %d failed", side.name, side.res.calls, side.res.failed)
			kinds := slices.SortedFunc(maps.Keys(side.res.kinds), func(a, b string) int { return side.res.kinds[b] - side.res.kinds[a] })
			for _, kind := range kinds {
				b.Logf("  %d × %s", side.res.kinds[kind], kind)
			}
		}
		b.ReportMetric(float64(gw.failed), "toolgate-failed")
		b.ReportMetric(float64(plain.failed), "caddy-failed")
		b.ReportMetric(float64(gw.calls), "calls-each")
		b.ReportMetric(float64(failedReloads), "failed-reloads")
	}
}

// reloadable is a toolgate process whose config the test replaces.
type reloadable struct {
	t       testing.TB
	admin   string
	dir     string
	gateway *rawMCP
	plain   *rawMCP
	ports   [2]int
	up      *upstream
	h2c     bool // serve HTTP/2 without TLS besides HTTP/1.1
}

func startReloadable(t testing.TB, bin string, up *upstream, h2c bool) *reloadable {
	r := &reloadable{t: t, dir: t.TempDir(), up: up, h2c: h2c}
	adminPort := freePort(t)
	r.admin = fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	r.ports = [2]int{freePort(t), freePort(t)}
	for _, d := range []string{"policy-a", "policy-b"} {
		if err := os.MkdirAll(filepath.Join(r.dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
		src, _ := os.ReadFile(testdataPath(t, "policy/request.rego"))
		res, _ := os.ReadFile(testdataPath(t, "policy/result.rego"))
		_ = os.WriteFile(filepath.Join(r.dir, d, "request.rego"), src, 0o600)
		_ = os.WriteFile(filepath.Join(r.dir, d, "result.rego"), res, 0o600)
	}
	cfg := filepath.Join(r.dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(r.caddyfile(0)), 0o600); err != nil {
		t.Fatal(err)
	}
	out := new(lockedBuffer)
	cmd := exec.Command(bin, "run", "--config", cfg, "--adapter", "caddyfile")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "HOME="+r.dir, "XDG_DATA_HOME="+r.dir, "XDG_CONFIG_HOME="+r.dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("toolgate printed (tail):\n%s", out.tail(8<<10))
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", r.ports[0])
	for i := 0; ; i++ {
		if status, err := httpStatus(base + "/.well-known/oauth-protected-resource"); err == nil && status == http.StatusOK {
			break
		}
		if i == 600 {
			t.Fatalf("toolgate did not start:\n%s", out.tail(8<<10))
		}
		time.Sleep(50 * time.Millisecond)
	}
	g := &gateway{URL: base, DataDir: r.dir}
	r.gateway = g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	r.gateway.initialize()
	r.plain = &rawMCP{t: t, url: fmt.Sprintf("http://127.0.0.1:%d/mcp", r.ports[1]), headers: map[string]string{}}
	r.plain.initialize()
	return r
}

// caddyfile is config number n: each one changes something a reload
// must apply without dropping calls.
func (r *reloadable) caddyfile(n int) string {
	tools := "echo progress"
	if n%2 == 1 {
		tools = "echo progress big" // an allowlist changed
	}
	policy := filepath.Join(r.dir, "policy-a")
	if n%3 == 2 {
		policy = filepath.Join(r.dir, "policy-b") // the policy swapped
	}
	extraService := ""
	if n%4 == 3 { // a service added
		extraService = fmt.Sprintf("service added%d {\n\t\t\turl %s\n\t\t\tallow_http\n\t\t\ttools echo\n\t\t}", n, r.up.URL)
	}
	rotated := ""
	if n > 0 { // an API key rotated in
		rotated = fmt.Sprintf("api_key %s rotated%d@example.test", hashKey(fmt.Sprintf("rotated-key-%d", n)), n)
	}
	upstreamHost := strings.TrimSuffix(strings.TrimPrefix(r.up.URL, "http://"), "/mcp")
	protocols := "h1"
	if r.h2c {
		protocols = "h1 h2c"
	}
	return fmt.Sprintf(`{
	admin %[1]s
	servers {
		protocols %[15]s
	}
	auto_https off
	persist_config off
	log {
		level ERROR
	}
	toolgate {
		public_url http://127.0.0.1:%[2]d
		storage file_system %[3]s/data
		cipher local %[3]s/data/cipher.key
		cache_ttl %[9]dms
		auth {
			api_key %[4]s %[5]s
			%[6]s
		}
		service svc {
			url %[7]s
			allow_http
			tools %[8]s
		}
		%[10]s
	}
}

http://127.0.0.1:%[2]d {
	route /v1/mcp/* {
		toolgate_session
		toolgate_registry
		toolgate_policy {
			source %[11]s
		}
		toolgate_credentials
		toolgate_result_policy {
			source %[11]s
		}
		toolgate_proxy
	}
	toolgate_api
}

http://127.0.0.1:%[12]d {
	reverse_proxy %[13]s {
		header_up X-Config %[14]d
	}
}
`, strings.TrimPrefix(r.admin, "http://"), r.ports[0], r.dir, hashKey(aliceKey), alice, rotated, r.up.URL, tools,
		10000+n, extraService, policy, r.ports[1], upstreamHost, n, protocols)
}

// reload loads config n through the admin API, as `toolgate reload`
// does; every fifth one first tries an invalid config, which must be
// refused while the running one keeps serving.
func (r *reloadable) reload(n int) error {
	if n%5 == 0 {
		bad := strings.Replace(r.caddyfile(n), "allow_http", "", 1) // an http upstream without allow_http
		if err := r.load(bad); err == nil {
			return fmt.Errorf("an invalid config was accepted")
		}
	}
	return r.load(r.caddyfile(n))
}

func (r *reloadable) load(caddyfile string) error {
	req, _ := http.NewRequest(http.MethodPost, r.admin+"/load", strings.NewReader(caddyfile))
	req.Header.Set("Content-Type", "text/caddyfile")
	req.Header.Set("Cache-Control", "must-revalidate") // reload even when unchanged
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %.300s", resp.StatusCode, body)
	}
	return nil
}

// loadResult counts an open-loop run's calls and its failures by kind.
type loadResult struct {
	calls, failed int
	kinds         map[string]int
}

// callLoop sends small tools/call messages in m's session at rate per
// second for duration, open loop, over one keep-alive client as runners
// do, and counts the calls that did not get their answer.
func callLoop(m *rawMCP, rate int, duration time.Duration, h2c bool) loadResult {
	transport := &http.Transport{MaxIdleConnsPerHost: 64}
	if h2c {
		transport.Protocols = new(http.Protocols)
		transport.Protocols.SetUnencryptedHTTP2(true)
	}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	n := int(duration.Seconds() * float64(rate))
	interval := time.Second / time.Duration(rate)
	res := loadResult{calls: n, kinds: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			why := ""
			resp, err := client.Do(m.echoRequest(i, "hello"))
			if err != nil {
				why = failureKind(err.Error())
			} else {
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !bytes.Contains(data, []byte(`\"text\":\"hello\"`)) {
					why = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, answerText(data))
				}
			}
			if why != "" {
				mu.Lock()
				res.failed++
				res.kinds[why]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return res
}

// answerText is what an answer that is not the echo says: its JSON-RPC
// error's message or its result's text.
func answerText(data []byte) string {
	for _, field := range []string{`"message":"`, `"text":"`} {
		if i := bytes.Index(data, []byte(field)); i >= 0 {
			rest := data[i+len(field):]
			if j := bytes.IndexByte(rest, '"'); j >= 0 {
				rest = rest[:j]
			}
			return fmt.Sprintf("%.100s", rest)
		}
	}
	return fmt.Sprintf("%.100q", data)
}

// failureKind strips addresses from a client error, so that errors of a
// kind count together.
func failureKind(err string) string {
	for _, marker := range []string{"connection reset by peer", "server closed idle connection", "EOF", "connection refused", "timeout"} {
		if strings.Contains(err, marker) {
			if strings.Contains(err, "dial tcp") {
				return "dial: " + marker
			}
			return marker
		}
	}
	return err
}
