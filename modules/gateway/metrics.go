package gateway

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// oauthMetrics are the OAuth collectors, created once per process and
// registered with each config's registry. Labels are bounded: service and
// outcome, never user.
var oauthMetrics = struct {
	refreshes   *prometheus.CounterVec
	connects    *prometheus.CounterVec
	revocations *prometheus.CounterVec
}{
	refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Subsystem: "oauth", Name: "refreshes_total",
		Help: "OAuth token refreshes by service and outcome: refreshed; already_refreshed (another replica or call did it, no provider call); rejected (the grant was deleted); failed (provider, cipher or storage unavailable; the grant is kept).",
	}, []string{"service", "outcome"}),
	connects: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Subsystem: "oauth", Name: "connects_total",
		Help: "OAuth sign-ins completed at the callback by service and outcome: connected, denied (the provider answered with an error), invalid_state, rejected (the provider refused the code), failed.",
	}, []string{"service", "outcome"}),
	revocations: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Subsystem: "oauth", Name: "revocations_total",
		Help: "Grants revoked at the provider (RFC 7009) when people disconnect, by service and outcome: revoked, failed (the provider did not confirm; the credential is forgotten all the same).",
	}, []string{"service", "outcome"}),
}

func registerOAuthMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{oauthMetrics.refreshes, oauthMetrics.connects, oauthMetrics.revocations} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}

func countRefresh(service, outcome string) {
	oauthMetrics.refreshes.WithLabelValues(service, outcome).Inc()
}

func countConnect(service, outcome string) {
	oauthMetrics.connects.WithLabelValues(service, outcome).Inc()
}
