package stdio

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// stdioMetrics are created once per process and registered with each
// config's registry. Labels are bounded: service and reason, never user.
var stdioMetrics = struct {
	processes *prometheus.GaugeVec
	restarts  *prometheus.CounterVec
}{
	processes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "toolgate", Subsystem: "stdio", Name: "processes",
		Help: "Programs running for stdio services, by service.",
	}, []string{"service"}),
	restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Subsystem: "stdio", Name: "restarts_total",
		Help: "Restarts scheduled after a stdio service's program ended, by service and reason: exited (by itself), start_failed, init_failed (no initialize answer in time), line_too_long, stopped_reading (its stdin), stdout_closed (it ran on after closing its stdout).",
	}, []string{"service", "reason"}),
}

func registerMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{stdioMetrics.processes, stdioMetrics.restarts} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}
