package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// TracerName is the instrumentation scope of the engine's spans.
const TracerName = "github.com/pgdurable/pgdurable/engine"

// Span names and attributes. The attributes are the keys of the engine's
// log lines under "pgdurable.", so a span and a log line of one attempt
// carry the same names.
const (
	spanStart   = "pgdurable.start " // + workflow: Start, in the caller's trace
	spanRun     = "pgdurable.run "   // + workflow: one delivery of a run
	spanClaim   = "pgdurable.claim"  // the claim of a delivery's lease
	spanAttempt = "pgdurable.step "  // + step name: one attempt of a step
	attrPrefix  = "pgdurable."
)

// tracing makes the engine's spans (Config.TracerProvider) and carries a
// run's trace context from its start to each of its deliveries
// (Config.Propagator), through the run's row.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

func newTracing(tp trace.TracerProvider, prop propagation.TextMapPropagator) tracing {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	return tracing{tracer: tp.Tracer(TracerName), prop: prop}
}

func attr(key, v string) attribute.KeyValue { return attribute.String(attrPrefix+key, v) }

// start begins the span of a start of workflow under the caller's span in
// ctx, and returns it with the trace context to store with the run: nil
// when there is no trace to continue (no provider records spans and the
// caller's context carries none), so untraced runs store nothing.
func (t tracing) start(ctx context.Context, workflow, workflowID string) (trace.Span, []byte) {
	ctx, span := t.tracer.Start(ctx, spanStart+workflow, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attr("workflow", workflow), attr("workflow_id", workflowID)))
	return span, t.inject(ctx)
}

// inject is ctx's trace context as the JSON object stored with a run.
func (t tracing) inject(ctx context.Context) []byte {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := propagation.MapCarrier{}
	t.prop.Inject(ctx, c)
	if len(c) == 0 {
		return nil
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil
	}
	return b
}

// started ends a start's span with what the start did.
func started(span trace.Span, res *StartResult, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attr("run_id", res.RunID.String()), attribute.Bool(attrPrefix+"existing", res.Existing))
	}
	span.End()
}

// deliver begins a delivery's span, as a child of the span that started
// the run (its stored trace context), from the moment the delivery began
// to claim the lease at sent, with the claim as its first child: every
// delivery of a run, in whatever process, joins the start's trace.
func (t tracing) deliver(ctx context.Context, c *store.ClaimedRun, sent time.Time) (context.Context, trace.Span) {
	if len(c.TraceContext) > 0 {
		var carrier propagation.MapCarrier
		if json.Unmarshal(c.TraceContext, &carrier) == nil {
			ctx = t.prop.Extract(ctx, carrier)
		}
	}
	ctx, span := t.tracer.Start(ctx, spanRun+c.WorkflowName, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(sent),
		trace.WithAttributes(attr("run_id", c.RunID.String()), attr("workflow", c.WorkflowName), attr("workflow_id", c.WorkflowID),
			attribute.Int(attrPrefix+"delivery", c.Deliveries), attribute.Int(attrPrefix+"recorded_steps", len(c.Steps))))
	if span.IsRecording() {
		_, claim := t.tracer.Start(ctx, spanClaim, trace.WithTimestamp(sent),
			trace.WithAttributes(attr("run_id", c.RunID.String()), attribute.Int(attrPrefix+"delivery", c.Deliveries)))
		claim.End()
	}
	return ctx, span
}

// attempt begins the span of one attempt of a step, under the delivery's.
// (A parallel step's attempts too, on its own goroutine, under the
// delivery's span: compensationOf is nil for a forward step.)
func (t tracing) attempt(ctx context.Context, name string, kind StepKind, compensationOf *int, seq, attempt int, requestID uuid.UUID) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, trace.SpanFromContext(ctx) // an untraced delivery: nothing to record, nothing to allocate
	}
	attrs := []attribute.KeyValue{attr("step", name), attribute.Int(attrPrefix+"seq", seq),
		attribute.Int(attrPrefix+"attempt", attempt), attr("kind", string(kind))}
	if requestID != uuid.Nil {
		attrs = append(attrs, attr("request_id", requestID.String()))
	}
	if compensationOf != nil {
		attrs = append(attrs, attribute.Int(attrPrefix+"compensation_of", *compensationOf))
	}
	return t.tracer.Start(ctx, spanAttempt+name, trace.WithAttributes(attrs...))
}

// attempted ends an attempt's span with its outcome.
func attempted(span trace.Span, p *panicInfo, err error) {
	if !span.IsRecording() {
		return
	}
	switch {
	case p != nil:
		span.SetAttributes(attr("error_class", string(ClassPanic)))
		span.SetStatus(codes.Error, fmt.Sprintf("panic: %v", p.value))
	case err != nil:
		span.SetAttributes(attr("error_class", string(classOf(err, ClassTransient))))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
