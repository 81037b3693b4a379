package gateway

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Traces: with Caddy's tracing directive in front of the pipeline, each
// step records its work as a span, a child of the request's span —
// toolgate.policy.request, toolgate.credentials, toolgate.upstream,
// toolgate.policy.result. Spans carry names, ids and outcomes (a decision
// id and action, a refresh outcome, an HTTP status), never payloads,
// tokens or keys. Without tracing they are the no-op spans of the
// request's context and cost nothing.

const tracerName = "github.com/toolgate/toolgate"

// StartSpan starts the span name as a child of ctx's span, when ctx is
// traced; otherwise it returns ctx and its no-op span. End the span.
func StartSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(tracerName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// EndSpan ends span, marking it failed with why when why is not empty.
func EndSpan(span trace.Span, why string) {
	if why != "" {
		span.SetStatus(codes.Error, why)
	}
	span.End()
}

// InjectTrace writes ctx's trace context into an upstream request's
// headers (W3C traceparent), so the upstream's spans join the trace. Only
// the traceparent of toolgate's span: a tracestate is what whoever began
// the trace wrote (a runner, when the route continues runners' traces),
// and no header of a runner's reaches an upstream.
func InjectTrace(ctx context.Context, h http.Header) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return
	}
	ctx = trace.ContextWithSpanContext(ctx, sc.WithTraceState(trace.TraceState{}))
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
}
