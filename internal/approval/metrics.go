package approval

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are created once and registered with every config's registry.
var metrics = struct {
	total   *prometheus.CounterVec
	pending prometheus.Gauge
}{
	total: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Name: "approvals_total",
		Help: "Approval events by service and outcome: requested, approved, denied, expired, consumed, released.",
	}, []string{"service", "outcome"}),
	pending: prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "toolgate", Name: "approvals_pending",
		Help: "Approvals waiting for a decision (recounted from the storage every minute).",
	}),
}

func registerMetrics(reg *prometheus.Registry) error {
	for _, c := range []prometheus.Collector{metrics.total, metrics.pending} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}
