package main

import (
	"crypto/sha256"
	"os"
	"strings"
	"testing"
)

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       uint64
		err        string
	}{
		{"plain", "1234 (toolgate) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 500 0 0", 325, ""},
		{"a name with spaces and parentheses", "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 5", 7, ""},
		{"no name", "1234 toolgate S 1", 0, "no command name"},
		{"cut short", "1234 (toolgate) S 1 2 3", 0, "fields after the command name"},
		{"not a number", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 4 0", 0, "utime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU([]byte(tc.stat))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// The running test process has CPU time and resident memory to read.
func TestProcReadsOfThisProcess(t *testing.T) {
	var (
		cpu  float64
		err  error
		work = make([]byte, 1<<20)
	)
	// Burn CPU (at most about a second) until a clock tick is counted.
	for i := 0; i < 1000 && cpu == 0; i++ {
		sha256.Sum256(work)
		if cpu, err = cpuSeconds(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if cpu == 0 {
		t.Fatal("no CPU time counted")
	}
	rss, err := rssBytes(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Fatalf("rss %d, %v", rss, err)
	}
}

func TestParseStatusRSS(t *testing.T) {
	got, err := parseStatusRSS([]byte("Name:\ttoolgate\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nThreads:\t8\n"))
	if err != nil || got != 12345*1024 {
		t.Fatalf("got %d, %v", got, err)
	}
	if _, err := parseStatusRSS([]byte("Name:\tx\n")); err == nil {
		t.Fatal("no error without a VmRSS line")
	}
	if _, err := parseStatusRSS([]byte("VmRSS:\t12 MB\n")); err == nil {
		t.Fatal("no error for an unexpected unit")
	}
}
