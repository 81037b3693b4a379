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

// limitMetrics show how close the process is to the bounds on what it
// holds at once (streams, request bytes), and how often a bound refused a
// request. The gauges read the counts at each scrape, so a call pays
// nothing for them; labels name the option, never a caller.
var limitMetrics = struct {
	refusals     *prometheus.CounterVec
	streams      prometheus.GaugeFunc
	requestBytes prometheus.GaugeFunc
}{
	refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "toolgate", Name: "limit_refusals_total",
		Help: "Requests refused with a retryable 503 because a bound was reached, by the option that sets it: max_streams, max_streams_per_caller, max_request_bytes_in_flight, max_request_bytes_in_flight_per_caller.",
	}, []string{"limit"}),
	streams: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "toolgate", Name: "streams_open",
		Help: "Responses this process relays now, all callers together (what max_streams bounds): calls waiting for their answer, open SSE streams, calls held between rounds.",
	}, func() float64 {
		openStreams.Lock()
		defer openStreams.Unlock()
		return float64(openStreams.all)
	}),
	requestBytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "toolgate", Name: "request_bytes_in_flight",
		Help: "Bytes of runners' request bodies this process holds now, all callers together (what max_request_bytes_in_flight bounds).",
	}, func() float64 {
		heldRequestBytes.Lock()
		defer heldRequestBytes.Unlock()
		return float64(heldRequestBytes.all)
	}),
}

// countRefusal counts a request refused by the bound option.
func countRefusal(option string) { limitMetrics.refusals.WithLabelValues(option).Inc() }

// registerMetrics registers the gateway's collectors with a config's
// registry (each config's own; the collectors are the process's).
func registerMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{oauthMetrics.refreshes, oauthMetrics.connects, oauthMetrics.revocations,
		limitMetrics.refusals, limitMetrics.streams, limitMetrics.requestBytes} {
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
