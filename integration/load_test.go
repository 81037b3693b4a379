package integration

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkOpenLoop is the load harness of DESIGN.md's performance budget:
// open-loop load (requests start on a fixed schedule, whether or not
// earlier ones finished, and latency counts from the scheduled start, so a
// stall is not hidden) of small tools/call messages, straight to the
// upstream and through toolgate with the default policies, in the same run
// on the same machine. It reports p50/p99 of each and what toolgate adds.
//
//	go test -run '^$' -bench BenchmarkOpenLoop -benchtime 1x ./integration/
func BenchmarkOpenLoop(b *testing.B) {
	const (
		rate     = 400 // requests per second
		duration = 5 * time.Second
	)
	up := startUpstream(b)
	g := startGateway(b, gatewayConfig{Upstream: up.URL, RequestPolicy: "../policies"})
	through := g.raw(b, aliceKey, g.createSession(b, aliceKey, "svc"), "svc")
	through.initialize()
	direct := &rawMCP{t: b, url: up.URL, headers: map[string]string{}}
	direct.initialize()

	for range b.N {
		d := openLoop(b, direct, rate, duration)
		t := openLoop(b, through, rate, duration)
		b.ReportMetric(float64(d.p50.Microseconds()), "direct-p50-µs")
		b.ReportMetric(float64(d.p99.Microseconds()), "direct-p99-µs")
		b.ReportMetric(float64(t.p50.Microseconds()), "toolgate-p50-µs")
		b.ReportMetric(float64(t.p99.Microseconds()), "toolgate-p99-µs")
		b.ReportMetric(float64((t.p50 - d.p50).Microseconds()), "added-p50-µs")
		b.ReportMetric(float64((t.p99 - d.p99).Microseconds()), "added-p99-µs")
	}
}

type latencies struct{ p50, p99 time.Duration }

func openLoop(b *testing.B, m *rawMCP, rate int, duration time.Duration) latencies {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	n := int(duration.Seconds() * float64(rate))
	interval := time.Second / time.Duration(rate)
	results := make([]time.Duration, n)
	var failures int
	var firstFailure string
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		scheduled := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(scheduled))
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Requests in flight together need distinct ids.
			resp, err := client.Do(m.echoRequest(i, "hello"))
			why := ""
			if err != nil {
				why = err.Error()
			} else {
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !bytes.Contains(data, []byte("hello")) {
					why = fmt.Sprintf("HTTP %d: %.300s", resp.StatusCode, data)
				}
			}
			results[i] = time.Since(scheduled)
			if why != "" {
				mu.Lock()
				failures++
				if firstFailure == "" {
					firstFailure = why
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failures > 0 {
		b.Fatalf("%d of %d requests to %s failed; the first: %s", failures, n, m.url, firstFailure)
	}
	slices.Sort(results)
	return latencies{p50: results[n/2], p99: results[n*99/100]}
}
