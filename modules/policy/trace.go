package policy

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolgate/toolgate/modules/gateway"
)

// startDecisionSpan starts the span of a decision about call when ctx is
// traced; its attributes are built only then (every call makes two
// decisions, and most gateways trace none of them).
func startDecisionSpan(ctx context.Context, name string, call *gateway.Call) (context.Context, trace.Span) {
	if span := trace.SpanFromContext(ctx); !span.SpanContext().IsValid() {
		return ctx, span
	}
	return gateway.StartSpan(ctx, name, traceAttributes(call)...)
}

// traceAttributes name what a decision span is about: service, method and
// tool, never arguments or results.
func traceAttributes(call *gateway.Call) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attribute.String("toolgate.service", call.Service.ID), attribute.String("mcp.method", call.Method)}
	if call.Message.Name != "" {
		attrs = append(attrs, attribute.String("toolgate.tool", call.Message.Name))
	}
	return attrs
}

// endDecisionSpan records d's id and action and the policy revision of o
// on span and ends it; a deny the policy did not make (an evaluation
// failure) marks the span failed.
func endDecisionSpan(span trace.Span, d *gateway.Decision, o outcome) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String("toolgate.decision.id", d.ID), attribute.String("toolgate.decision.action", d.Action),
		attribute.String("toolgate.policy.revision", o.Revision))
	gateway.EndSpan(span, o.Failure)
}
