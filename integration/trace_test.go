package integration

import (
	"cmp"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// With Caddy's tracing directive in front of the pipeline, a tools/call is
// exported (OTLP over HTTP, to a receiver here) as the request's span with
// children for the request policy (decision id and action), the
// credentials, the upstream exchange (status) and the result policy; the
// upstream gets the trace context; no span carries the arguments, the
// result or a credential.
func TestTraceSpans(t *testing.T) {
	var (
		mu    sync.Mutex
		spans []*tracepb.Span
		raw   strings.Builder
	)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		raw.Write(body)
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				spans = append(spans, ss.Spans...)
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(recv.Close)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", recv.URL+"/v1/traces")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")

	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RouteFirst: "tracing {\n\t\t\tspan toolgate\n\t\t}",
		Auth: "header X-Upstream-Key very-secret-upstream-key"})
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", nil)
	if text, isErr := toolError(t, cs, "echo", map[string]any{"text": "secret-argument-text"}); isErr {
		t.Fatalf("echo: %q", text)
	}

	byName := func() map[string]*tracepb.Span {
		mu.Lock()
		defer mu.Unlock()
		m := map[string]*tracepb.Span{}
		for _, s := range spans {
			if s.Name != "toolgate" || m["toolgate"] == nil || strings.Contains(attr(s, "toolgate.tool"), "echo") {
				m[s.Name] = s
			}
		}
		return m
	}
	want := []string{"toolgate.policy.request", "toolgate.credentials", "toolgate.upstream", "toolgate.policy.result"}
	var got map[string]*tracepb.Span
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got = byName()
		complete := true
		for _, n := range want {
			complete = complete && got[n] != nil
		}
		if complete && attr(got["toolgate.policy.result"], "toolgate.tool") == "echo" {
			break
		}
	}
	call := got["toolgate.policy.result"]
	if call == nil {
		t.Fatalf("spans exported: %v", got)
	}
	parent := call.ParentSpanId
	for _, n := range want {
		s := got[n]
		if s == nil {
			t.Fatalf("no %s span among %v", n, got)
		}
		if string(s.TraceId) != string(call.TraceId) {
			t.Errorf("%s is in another trace", n)
		}
		if n != "toolgate.upstream" && string(s.ParentSpanId) != string(parent) {
			t.Errorf("%s is not a child of the request's span", n)
		}
	}
	req := got["toolgate.policy.request"]
	if attr(req, "toolgate.decision.action") != "allow" || len(attr(req, "toolgate.decision.id")) < 16 {
		t.Errorf("request policy span attributes: %v", req.Attributes)
	}
	if attr(got["toolgate.upstream"], "http.response.status_code") != "200" {
		t.Errorf("upstream span attributes: %v", got["toolgate.upstream"].Attributes)
	}
	// The upstream request carried the trace.
	var traced bool
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, "secret-argument-text") && strings.Contains(r.Header.Get("Traceparent"), hex.EncodeToString(call.TraceId)) {
			traced = true
		}
	}
	if !traced {
		t.Error("the upstream's tools/call carried no traceparent of the call's trace")
	}
	mu.Lock()
	defer mu.Unlock()
	logTrace(t, spans, call.TraceId)
	for _, secret := range []string{"secret-argument-text", "very-secret-upstream-key", aliceKey} {
		if strings.Contains(raw.String(), secret) {
			t.Errorf("an exported span holds %q", secret)
		}
	}
}

// logTrace logs the spans of one trace in the order they started, with
// their durations and attributes (go test -v -run TestTraceSpans shows a
// call's trace, as the README does).
func logTrace(t *testing.T, spans []*tracepb.Span, trace []byte) {
	var in []*tracepb.Span
	for _, s := range spans {
		if string(s.TraceId) == string(trace) {
			in = append(in, s)
		}
	}
	slices.SortFunc(in, func(a, b *tracepb.Span) int { return cmp.Compare(a.StartTimeUnixNano, b.StartTimeUnixNano) })
	for _, s := range in {
		var attrs []string
		for _, a := range s.Attributes {
			attrs = append(attrs, a.Key+"="+attr(s, a.Key))
		}
		t.Logf("%-24s %8s  %s", s.Name, time.Duration(s.EndTimeUnixNano-s.StartTimeUnixNano).Round(time.Microsecond), strings.Join(attrs, " "))
	}
}

func attr(s *tracepb.Span, key string) string {
	if s == nil {
		return ""
	}
	for _, a := range s.Attributes {
		if a.Key == key {
			switch v := a.Value.Value.(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue
			case *commonpb.AnyValue_IntValue:
				return strconv.FormatInt(v.IntValue, 10)
			}
		}
	}
	return ""
}
