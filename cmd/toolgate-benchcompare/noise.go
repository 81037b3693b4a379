package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// noiseWindow is how one length of pure computation fared on the machine:
// a loop of arithmetic that touches no memory, timed many times, with a
// system call every few runs as a server makes them. What stretches it is
// the machine (interrupts, the hypervisor, other processes), not the code:
// it is the floor under any latency budget of microseconds, such as the
// policy evaluations' p99 ≤ 50 µs.
type noiseWindow struct {
	P50, P99 float64 // µs
	Over50   float64 // share of runs that took more than 50 µs
}

// noiseRuns is how many times each window is timed.
const noiseRuns = 20000

// machineNoise times windows of about 5, 10, 15 and 20 µs of computation
// (the measured p50 says how long each was), before the load starts.
func machineNoise() []noiseWindow {
	perUs := spinRate()
	var out []noiseWindow
	for _, us := range []float64{5, 10, 15, 20} {
		n := int(perUs * us)
		d := make([]float64, noiseRuns)
		over := 0
		for i := range d {
			start := time.Now()
			spin(n)
			d[i] = float64(time.Since(start).Nanoseconds()) / 1e3
			if d[i] > 50 {
				over++
			}
			if i%8 == 0 {
				_, _ = os.Stat(".")
			}
		}
		slices.Sort(d)
		out = append(out, noiseWindow{P50: d[len(d)/2], P99: d[len(d)*99/100], Over50: float64(over) / float64(len(d))})
	}
	return out
}

// spinRate is how many iterations of spin run in a microsecond: the best
// of a few timings, so that a stretched one does not shorten the windows.
func spinRate() float64 {
	best := time.Duration(1 << 62)
	for range 5 {
		start := time.Now()
		spin(1 << 20)
		best = min(best, time.Since(start))
	}
	return float64(1<<20) / (float64(best.Nanoseconds()) / 1e3)
}

var spinSink uint64

// spin is n steps of a linear congruential generator: arithmetic only.
func spin(n int) {
	x := uint64(1)
	for range n {
		x = x*6364136223846793005 + 1442695040888963407
	}
	spinSink += x
}

// noiseTable prints the windows.
func noiseTable(w io.Writer, windows []noiseWindow) {
	if len(windows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n### The machine's floor: pure computation, timed %d times per length before the load\n\n", noiseRuns)
	fmt.Fprintln(w, "A loop of arithmetic that touches no memory, with a system call every 8 runs; what stretches it is the machine, "+
		"not code. A policy evaluation can have its p99 within 50 µs only if it is short enough that the machine stretches "+
		"it past 50 µs in less than 1 % of calls.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| computation (p50) | p99 | runs over 50 µs |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, n := range windows {
		fmt.Fprintf(w, "| %.1f µs | %.1f µs | %.2f %% |\n", n.P50, n.P99, 100*n.Over50)
	}
}
