package policy

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// The children decided keeps are the vectors' own: what it counts is what
// the gateway's /metrics shows.
func TestDecidedCountsInTheVectors(t *testing.T) {
	service := t.Name()
	count := func(action string) float64 {
		return testutil.ToFloat64(policyMetrics.decisions.WithLabelValues(stageResult, service, action))
	}
	observed := func() uint64 {
		var m dto.Metric
		if err := policyMetrics.duration.WithLabelValues(stageListing).(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}
	// The vectors are the process's: another run of this test (-count)
	// counted in them before, so what this one adds is compared.
	allowBefore, denyBefore, before := count("allow"), count("deny"), observed()
	recalled := func() float64 { return testutil.ToFloat64(policyMetrics.recalled.WithLabelValues(stageResult)) }
	recalledBefore := recalled()
	for i := range 3 {
		policyMetrics.decided(stageResult, service, "allow", 7*time.Microsecond, i > 0)
	}
	policyMetrics.decided(stageResult, service, "deny", time.Millisecond, false)
	policyMetrics.decided(stageListing, service, "allow", time.Microsecond, true)
	if got := count("allow") - allowBefore; got != 3 {
		t.Errorf("allow decisions counted: %v, want 3", got)
	}
	if got := count("deny") - denyBefore; got != 1 {
		t.Errorf("deny decisions counted: %v, want 1", got)
	}
	if got := observed() - before; got != 1 {
		t.Errorf("listing evaluations observed: %d, want 1", got)
	}
	if got := recalled() - recalledBefore; got != 2 {
		t.Errorf("recalled result decisions counted: %v, want 2", got)
	}
}
