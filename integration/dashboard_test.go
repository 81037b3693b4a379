package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// oauthMetricNames are the OAuth metrics TestOAuthConnectCallAndRefresh
// sees exported after a connect and a refresh.
var oauthMetricNames = []string{"toolgate_oauth_connects_total", "toolgate_oauth_refreshes_total"}

// refusalMetricName is exported once a bound refused a request:
// TestExhaustionAttackDroppedStreamsKeepTheirRequests sees it then.
const refusalMetricName = "toolgate_limit_refusals_total"

// exportedMetrics returns the metric families g's metrics endpoint lists.
func exportedMetrics(t testing.TB, g *gateway) []string {
	t.Helper()
	resp, err := http.Get(g.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var names []string
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			names = append(names, strings.Fields(rest)[0])
		}
	}
	return names
}

// requireMetrics fails unless g exports every one of names.
func requireMetrics(t testing.TB, g *gateway, names ...string) {
	t.Helper()
	got := exportedMetrics(t, g)
	for _, n := range names {
		if !slices.Contains(got, n) {
			t.Errorf("the gateway does not export %s", n)
		}
	}
}

// Every toolgate metric the Grafana dashboard in deploy/ charts is one the
// gateway exports, by that name: a renamed metric cannot leave a panel
// silently empty.
func TestDashboardChartsExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "grafana", "toolgate.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil || dash.Title == "" || len(dash.Panels) == 0 {
		t.Fatalf("the dashboard is not a Grafana dashboard: %v", err)
	}
	metricName := regexp.MustCompile(`\btoolgate_[a-z_]+`)
	var charted []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				m = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if !slices.Contains(charted, m) {
					charted = append(charted, m)
				}
			}
		}
	}

	// A gateway that decided, asked for an approval and failed to load a
	// policy edit exports everything but the OAuth metrics.
	dir := copyPolicies(t, testdataPath(t, "approvals"))
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: dir, PolicyOptions: "reload_interval 50ms"})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	mustPend(t, m.call(1, "gated_tool", `{"text":"charted"}`))
	if err := os.WriteFile(filepath.Join(dir, "request.rego"), []byte("package toolgate.request\n\ndecision := {\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var exported []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if exported = exportedMetrics(t, g); slices.Contains(exported, "toolgate_policy_load_failures_total") {
			break
		}
	}
	for _, name := range charted {
		if !slices.Contains(exported, name) && !slices.Contains(oauthMetricNames, name) && name != refusalMetricName {
			t.Errorf("the dashboard charts %s, which the gateway does not export", name)
		}
	}
	if len(charted) < 7 {
		t.Errorf("the dashboard charts only %v", charted)
	}
}

// boundGauges are the values of the two gauges of the bounds.
type boundGauges struct {
	streams float64 // toolgate_streams_open
	bytes   float64 // toolgate_request_bytes_in_flight
}

func (a boundGauges) String() string {
	return fmt.Sprintf("streams_open %g, request_bytes_in_flight %g", a.streams, a.bytes)
}

// readBoundGauges reads the gauges from g's /metrics.
func readBoundGauges(t testing.TB, g *gateway) boundGauges {
	t.Helper()
	resp, err := (&http.Client{Transport: g.transport(), Timeout: 10 * time.Second}).Get(g.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out boundGauges
	found := 0
	for _, line := range strings.Split(string(body), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch name {
		case "toolgate_streams_open":
			out.streams, found = v, found+1
		case "toolgate_request_bytes_in_flight":
			out.bytes, found = v, found+1
		}
	}
	if found != 2 {
		t.Fatalf("/metrics lacks toolgate_streams_open or toolgate_request_bytes_in_flight:\n%.2000s", body)
	}
	return out
}

// settleBoundGauges polls the gauges until both are back at (or under) before,
// for at most within, and returns the last reading and whether they came
// back.
func settleBoundGauges(t testing.TB, g *gateway, before boundGauges, within time.Duration) (boundGauges, bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		now := readBoundGauges(t, g)
		if now.streams <= before.streams && now.bytes <= before.bytes {
			return now, true
		}
		if time.Now().After(deadline) {
			return now, false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// gaugesBackWithin fails t unless the bounds' gauges come back to (or
// under) before within the time given.
func gaugesBackWithin(t testing.TB, g *gateway, before boundGauges, within time.Duration) {
	t.Helper()
	if now, back := settleBoundGauges(t, g, before, within); !back {
		t.Errorf("at the end, the gauges stay at %v (before: %v)", now, before)
	}
}
