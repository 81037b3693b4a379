package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Both proxies serve Caddy's admin endpoint on a loopback port. It has the
// Go runtime's memory statistics (/debug/vars) and the profiles
// (/debug/pprof/).

// memStats are the Go runtime's memory statistics of a Caddy process, as
// its admin endpoint's /debug/vars shows them.
type memStats struct {
	TotalAlloc uint64 // bytes allocated, ever
	Mallocs    uint64 // objects allocated, ever
	NumGC      uint32
	HeapAlloc  uint64 // bytes of live and not yet collected objects
	StackInuse uint64 // bytes of goroutine stacks
}

// readMemStats reads admin's /debug/vars.
func readMemStats(ctx context.Context, client *http.Client, admin string) (memStats, error) {
	var v struct{ Memstats memStats }
	err := getJSON(ctx, client, admin+"/debug/vars", &v)
	return v.Memstats, err
}

// collectGarbage makes the process behind admin run a full garbage
// collection (the heap profile endpoint's gc=1) and waits for it.
func collectGarbage(ctx context.Context, client *http.Client, admin string) error {
	_, err := getBytes(ctx, client, admin+"/debug/pprof/heap?gc=1", 30*time.Second)
	return err
}

// goroutines returns how many goroutines the process behind admin has.
func goroutines(ctx context.Context, client *http.Client, admin string) (int, error) {
	data, err := getBytes(ctx, client, admin+"/debug/pprof/goroutine?debug=1", 30*time.Second)
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(data), "\n")
	var n int
	if _, err := fmt.Sscanf(first, "goroutine profile: total %d", &n); err != nil {
		return 0, fmt.Errorf("goroutine profile: %q: %v", first, err)
	}
	return n, nil
}

func getJSON(ctx context.Context, client *http.Client, url string, v any) error {
	data, err := getBytes(ctx, client, url, 10*time.Second)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("GET %s: %v", url, err)
	}
	return nil
}

// getBytes GETs url and returns its body, failing on any status but 200.
func getBytes(ctx context.Context, client *http.Client, url string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d: %.300s", url, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return data, nil
}

// profileSet names the profiles captureProfiles saves, by file suffix.
var profileSet = []struct{ file, path string }{
	{"cpu", "/debug/pprof/profile"},
	{"allocs", "/debug/pprof/allocs"}, // a delta: what was allocated during the load
}

// captureProfiles profiles the process behind admin while load runs: it
// starts load, and half a second later fetches a CPU profile and the
// allocations of the next seconds (both at once), then the heap in use.
// load must last at least seconds+1 seconds. The profiles are saved as
// dir/<name>-cpu.pprof, <name>-allocs.pprof and <name>-heap.pprof.
//
// The Go runtime publishes allocations to the heap profiles only at the
// end of a garbage collection, so a delta profile also holds what was
// allocated between the last collection before the window and its start:
// a full collection first keeps earlier runs out of it.
func captureProfiles(ctx context.Context, client *http.Client, admin, dir, name string, seconds int, load func()) ([]string, error) {
	if err := collectGarbage(ctx, client, admin); err != nil {
		return nil, err
	}
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		load()
	}()
	time.Sleep(500 * time.Millisecond)
	type fetched struct {
		data []byte
		err  error
	}
	results := make([]fetched, len(profileSet))
	done := make(chan int)
	for i, p := range profileSet {
		go func() {
			url := fmt.Sprintf("%s%s?seconds=%d", admin, p.path, seconds)
			data, err := getBytes(ctx, client, url, time.Duration(seconds+30)*time.Second)
			results[i] = fetched{data, err}
			done <- i
		}()
	}
	for range profileSet {
		<-done
	}
	<-loaded
	heap, err := getBytes(ctx, client, admin+"/debug/pprof/heap", 30*time.Second)
	if err != nil {
		return nil, err
	}
	var files []string
	save := func(suffix string, data []byte) error {
		path := filepath.Join(dir, name+"-"+suffix+".pprof")
		files = append(files, path)
		return os.WriteFile(path, data, 0o644)
	}
	for i, p := range profileSet {
		if results[i].err != nil {
			return nil, results[i].err
		}
		if err := save(p.file, results[i].data); err != nil {
			return nil, err
		}
	}
	return files, save("heap", heap)
}
