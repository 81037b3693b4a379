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
	before := observed()
	for range 3 {
		policyMetrics.decided(stageResult, service, "allow", 7*time.Microsecond)
	}
	policyMetrics.decided(stageResult, service, "deny", time.Millisecond)
	policyMetrics.decided(stageListing, service, "allow", time.Microsecond)
	if got := count("allow"); got != 3 {
		t.Errorf("allow decisions counted: %v, want 3", got)
	}
	if got := count("deny"); got != 1 {
		t.Errorf("deny decisions counted: %v, want 1", got)
	}
	if got := observed() - before; got != 1 {
		t.Errorf("listing evaluations observed: %d, want 1", got)
	}
}
