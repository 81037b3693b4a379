package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
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
	Runs     int     `json:",omitempty"` // how many were timed (the floor probe's)
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

// The floor under load. The windows above are timed on an idle machine;
// a policy evaluation runs on one that serves the load. While each
// small-call run goes, a process of this program's own (so that the
// measure shares no scheduler with the proxies) times floorProbeUs of
// computation floorProbeRate times a second, as often as toolgate
// evaluates its two policies at 400 calls/s, each after an idle wait, as
// an evaluation comes: how often the machine under that load stretches a
// computation as short as an evaluation past 50 µs. It runs during every
// party's run, so that each bears its 1–2 % of a core.
const (
	floorProbeRate = 800
	floorProbeUs   = 15
)

// runFloorProbe is the probe process (`toolgate-benchcompare floor-probe
// <duration>`): it writes the window it timed to out as JSON.
func runFloorProbe(args []string, out io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: toolgate-benchcompare floor-probe <duration>")
	}
	d, err := time.ParseDuration(args[0])
	if err != nil || d <= 0 {
		return fmt.Errorf("floor-probe: %q is not a duration", args[0])
	}
	n := int(spinRate() * floorProbeUs)
	tick := time.NewTicker(time.Second / floorProbeRate)
	defer tick.Stop()
	var times []float64
	over := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		<-tick.C
		start := time.Now()
		spin(n)
		us := float64(time.Since(start).Nanoseconds()) / 1e3
		times = append(times, us)
		if us > 50 {
			over++
		}
	}
	slices.Sort(times)
	w := noiseWindow{P50: times[len(times)/2], P99: times[len(times)*99/100], Over50: float64(over) / float64(len(times)), Runs: len(times)}
	return json.NewEncoder(out).Encode(w)
}

// floorProbe is a probe process running beside a run.
type floorProbe struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

// startFloorProbe starts this program as a probe for d.
func startFloorProbe(ctx context.Context, d time.Duration) (*floorProbe, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p := &floorProbe{cmd: exec.CommandContext(ctx, exe, "floor-probe", d.String())}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, os.Stderr
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("floor probe: %w", err)
	}
	return p, nil
}

// wait returns what the probe timed.
func (p *floorProbe) wait() (*noiseWindow, error) {
	if err := p.cmd.Wait(); err != nil {
		return nil, fmt.Errorf("floor probe: %w", err)
	}
	var w noiseWindow
	if err := json.Unmarshal(p.out.Bytes(), &w); err != nil || w.Runs == 0 {
		return nil, fmt.Errorf("floor probe: no window in %q", p.out.String())
	}
	return &w, nil
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

// spinSink keeps spin's loop from being optimized away.
//
//lint:ignore U1000 written only, on purpose
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
