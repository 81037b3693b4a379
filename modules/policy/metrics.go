package policy

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the policy collectors, created once per process and
// registered with each config's registry. Labels are bounded: stage,
// service, action — never user or session.
type metrics struct {
	decisions    *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	recalled     *prometheus.CounterVec
	loadFailures *prometheus.CounterVec

	// The children of decisions (by decisionLabels) and duration (by
	// stage) found so far. A vector finds a child by hashing and checking
	// its label values, under a lock, which two decisions per call would
	// do at every call (1.6 % of the gateway's CPU in a profile under
	// small calls, its caches cold); a child is never deleted from its vector.
	counters  sync.Map
	observers sync.Map
	recalls   sync.Map
}

type decisionLabels struct{ stage, service, action string }

// decided counts a decision of stage on service, the time its evaluation
// took, and whether its value was recalled.
func (m *metrics) decided(stage, service, action string, took time.Duration, recalled bool) {
	k := decisionLabels{stage, service, action}
	c, ok := m.counters.Load(k)
	if !ok {
		c, _ = m.counters.LoadOrStore(k, m.decisions.WithLabelValues(stage, service, action))
	}
	c.(prometheus.Counter).Inc()
	o, ok := m.observers.Load(stage)
	if !ok {
		o, _ = m.observers.LoadOrStore(stage, m.duration.WithLabelValues(stage))
	}
	o.(prometheus.Observer).Observe(took.Seconds())
	if recalled {
		r, ok := m.recalls.Load(stage)
		if !ok {
			r, _ = m.recalls.LoadOrStore(stage, m.recalled.WithLabelValues(stage))
		}
		r.(prometheus.Counter).Inc()
	}
}

var policyMetrics = &metrics{
	decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Subsystem: "policy", Name: "decisions_total",
		Help: "Policy decisions by stage, service and action.",
	}, []string{"stage", "service", "action"}),
	duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "toolgate", Subsystem: "policy", Name: "evaluation_seconds",
		Help:    "Time to evaluate a policy decision.",
		Buckets: []float64{5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 5e-3, 25e-3, 100e-3},
	}, []string{"stage"}),
	recalled: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Subsystem: "policy", Name: "recalled_total",
		Help: "Policy decisions given the value of an earlier evaluation whose input read the same, instead of being evaluated.",
	}, []string{"stage"}),
	loadFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Subsystem: "policy", Name: "load_failures_total",
		Help: "Policy (re)loads that failed; the last good policy stays in force.",
	}, []string{"stage"}),
}

func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.decisions, m.duration, m.recalled, m.loadFailures} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}
