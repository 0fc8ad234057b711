package engine_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/engine"
)

// spansNamed returns the ended spans whose name starts with prefix.
func spansNamed(spans []sdktrace.ReadOnlySpan, prefix string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if strings.HasPrefix(s.Name(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

func attrOf(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// A run's spans join the trace of its caller: start → run (a delivery) →
// claim and each step attempt, with the log keys as attributes; the
// activities HTTP helper sends the attempt's span downstream.
func TestTracingJoinsTheCallersTrace(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	var mu sync.Mutex
	var traceparents []string
	downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		traceparents = append(traceparents, r.Header.Get("traceparent"))
		n := len(traceparents)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // the first attempt fails: a retry
			return
		}
		_, _ = w.Write([]byte(`{"id": "ch_1"}`))
	}))
	t.Cleanup(downstream.Close)
	client := activities.NewHTTPClient(5 * time.Second)
	wf := engine.Define("traced", func(ctx *engine.Context, in int) (string, error) {
		if _, err := engine.Step(ctx, "reserve", func(context.Context) (int, error) { return in, nil }, nil); err != nil {
			return "", err
		}
		return engine.RunActivity(ctx, "charge", func(actx context.Context, a *engine.ActivityAttempt) (string, error) {
			req, _ := http.NewRequestWithContext(actx, "POST", downstream.URL, nil)
			resp, err := client.Do(req)
			if err != nil {
				return "", err
			}
			resp.Body.Close()
			if resp.StatusCode >= 500 {
				return "", errors.New(resp.Status)
			}
			return "charged", nil
		}, &engine.ActivityOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: time.Millisecond}})
	}, nil)
	b := setup(t, &engine.Config{TracerProvider: tp}, wf)
	ctx, root := tp.Tracer("test").Start(testCtx(t), "POST /checkout")
	res, err := wf.Start(ctx, b.engine, 7, nil)
	require.NoError(t, err)
	root.End()
	waitStatus(t, b.engine, res.RunID, engine.StatusCompleted, 20*time.Second)

	var spans []sdktrace.ReadOnlySpan
	eventually(t, 10*time.Second, "the delivery's span to end", func() bool {
		spans = rec.Ended()
		return len(spansNamed(spans, "pgdurable.run ")) == 1
	})
	traceID := root.SpanContext().TraceID()
	for _, s := range spans {
		require.Equal(t, traceID, s.SpanContext().TraceID(), "span %s is in the caller's trace", s.Name())
	}
	start := spansNamed(spans, "pgdurable.start traced")
	require.Len(t, start, 1)
	require.Equal(t, root.SpanContext().SpanID(), start[0].Parent().SpanID())
	require.Equal(t, res.RunID.String(), attrOf(start[0], "pgdurable.run_id").AsString())
	run := spansNamed(spans, "pgdurable.run traced")[0]
	require.Equal(t, start[0].SpanContext().SpanID(), run.Parent().SpanID())
	require.Equal(t, "traced", attrOf(run, "pgdurable.workflow").AsString())
	require.Equal(t, res.RunID.String(), attrOf(run, "pgdurable.run_id").AsString())
	claim := spansNamed(spans, "pgdurable.claim")
	require.Len(t, claim, 1)
	require.Equal(t, run.SpanContext().SpanID(), claim[0].Parent().SpanID())

	reserve := spansNamed(spans, "pgdurable.step reserve")
	require.Len(t, reserve, 1)
	charges := spansNamed(spans, "pgdurable.step charge")
	require.Len(t, charges, 2, "one span per attempt")
	for i, s := range append(reserve, charges...) {
		require.Equal(t, run.SpanContext().SpanID(), s.Parent().SpanID(), "attempt %d is a child of the delivery", i)
	}
	require.EqualValues(t, 1, attrOf(charges[0], "pgdurable.attempt").AsInt64())
	require.EqualValues(t, 2, attrOf(charges[1], "pgdurable.attempt").AsInt64())
	require.Equal(t, codes.Error, charges[0].Status().Code)
	require.Equal(t, "transient", attrOf(charges[0], "pgdurable.error_class").AsString())
	require.Equal(t, codes.Unset, charges[1].Status().Code)
	requestID := attrOf(charges[0], "pgdurable.request_id").AsString()
	require.NotEmpty(t, requestID)
	require.Equal(t, requestID, attrOf(charges[1], "pgdurable.request_id").AsString(), "the attempts share the request ID")

	// Downstream got each attempt's span as its parent.
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, traceparents, 2)
	for i, tp := range traceparents {
		require.Equal(t, "00-"+traceID.String()+"-"+charges[i].SpanContext().SpanID().String()+"-01", tp)
	}
}

// Without a tracer provider and without a caller's trace, nothing is
// stored with the run.
func TestUntracedRunsStoreNoTraceContext(t *testing.T) {
	t.Parallel()
	wf := engine.Define("untraced", func(ctx *engine.Context, in int) (int, error) { return in, nil }, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusCompleted, 20*time.Second)
	var stored *string
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT trace_context::text FROM pgdurable.workflow_runs WHERE run_id = $1`), res.RunID).Scan(&stored))
	require.Nil(t, stored)
}

// Every way to start a run joins the caller's trace, and a
// continue-as-new chain stays in it from its runs' first deliveries (found
// by an attack pass: signal-with-start and StartMany stored no trace, and
// a continued run's first delivery began a new one).
func TestTracingCoversEveryStartPath(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	chain := engine.Define("traced-chain", func(ctx *engine.Context, n int) (int, error) {
		if _, err := engine.Step(ctx, "tick", func(context.Context) (int, error) { return n, nil }, nil); err != nil {
			return 0, err
		}
		if n < 3 {
			return 0, engine.ContinueAsNew(ctx, n+1)
		}
		return n, nil
	}, nil)
	waiter := engine.Define("traced-waiter", func(ctx *engine.Context, _ int) (string, error) {
		return engine.AwaitSignal[string](ctx, "go", 0)
	}, nil)
	b := setup(t, &engine.Config{TracerProvider: tp}, chain, waiter)
	ctx, root := tp.Tracer("test").Start(testCtx(t), "caller")
	_, err := chain.Start(ctx, b.engine, 1, &engine.StartOpts{WorkflowID: "chain"})
	require.NoError(t, err)
	sws, err := b.engine.SignalWithStartJSON(ctx, engine.SignalWithStartJSONParams{Workflow: "traced-waiter", Input: []byte(`0`), Opts: &engine.StartOpts{WorkflowID: "sws"}, Signal: "go", Payload: []byte(`"now"`), SignalOpts: nil})
	require.NoError(t, err)
	many, err := chain.StartMany(ctx, b.engine, []engine.StartParams[int]{{Input: 3}, {Input: 3}})
	require.NoError(t, err)
	root.End()
	waitStatus(t, b.engine, sws.RunID, engine.StatusCompleted, 20*time.Second)
	for _, r := range many {
		waitStatus(t, b.engine, r.RunID, engine.StatusCompleted, 20*time.Second)
	}
	eventually(t, 20*time.Second, "the chain's three runs and the others to be delivered", func() bool {
		return len(spansNamed(rec.Ended(), "pgdurable.run ")) == 3+1+2
	})
	for _, s := range rec.Ended() {
		require.Equal(t, root.SpanContext().TraceID(), s.SpanContext().TraceID(), "%s %v", s.Name(), s.Attributes())
	}
}

// Parallel steps and activities have a span per attempt too, under the
// delivery's (found by a fresh-user pass: they had none).
func TestTracingParallelSteps(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	wf := engine.Define("traced-parallel", func(ctx *engine.Context, _ int) (int, error) {
		a := engine.Go(ctx, "left", func(context.Context) (int, error) { return 1, nil }, nil)
		b := engine.Go(ctx, "right", func(context.Context) (int, error) { return 2, nil }, nil)
		c := engine.GoActivity(ctx, "call", func(context.Context, *engine.ActivityAttempt) (int, error) { return 3, nil }, nil)
		out, err := engine.All(ctx, []*engine.Future[int]{a, b, c})
		if err != nil {
			return 0, err
		}
		return out[0] + out[1] + out[2], nil
	}, nil)
	bn := setup(t, &engine.Config{TracerProvider: tp}, wf)
	ctx, root := tp.Tracer("test").Start(testCtx(t), "caller")
	res, err := wf.Start(ctx, bn.engine, 0, nil)
	require.NoError(t, err)
	root.End()
	waitStatus(t, bn.engine, res.RunID, engine.StatusCompleted, 20*time.Second)
	var spans []sdktrace.ReadOnlySpan
	eventually(t, 10*time.Second, "the delivery's span", func() bool {
		spans = rec.Ended()
		return len(spansNamed(spans, "pgdurable.run ")) == 1
	})
	run := spansNamed(spans, "pgdurable.run ")[0]
	for _, name := range []string{"left", "right", "call"} {
		s := spansNamed(spans, "pgdurable.step "+name)
		require.Len(t, s, 1, name)
		require.Equal(t, run.SpanContext().SpanID(), s[0].Parent().SpanID(), name)
	}
	require.NotEmpty(t, attrOf(spansNamed(spans, "pgdurable.step call")[0], "pgdurable.request_id").AsString())
}
