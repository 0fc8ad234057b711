package payment_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/examples/payment"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// blockingGateway holds the first charge request until the client goes
// away (its worker is killed), then serves the fake gateway.
type blockingGateway struct {
	gw      http.Handler
	once    sync.Once
	blocked chan struct{} // closed when the first charge is held
	release chan struct{} // closed when the test ends: nothing stays held
}

func (b *blockingGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	first := false
	if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/payment_intents") {
		b.once.Do(func() { first = true })
	}
	if first {
		close(b.blocked)
		select { // the worker dies holding this request
		case <-r.Context().Done():
		case <-b.release:
		}
		return
	}
	b.gw.ServeHTTP(w, r)
}

// A payment run's trace: the caller's request span, the start, and each
// delivery's claim and step attempts, across a worker SIGKILLed in the
// middle of its charge and the redelivery that finishes it, in one trace.
func TestPaymentTraceSurvivesAKilledWorker(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	require.NoError(t, payment.Migrate(ctx, db.Pool))
	require.NoError(t, payment.Seed(ctx, db.Pool))
	fake := fakegateway.New(fakegateway.Faults{})
	gw := &blockingGateway{gw: fake, blocked: make(chan struct{}), release: make(chan struct{})}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(gw.release) })
	client, err := payment.NewGateway(payment.GatewayConfig{BaseURL: srv.URL, APIKey: "sk_test_fake", Timeout: 5 * time.Second}, func(string) string { return "" })
	require.NoError(t, err)
	wf := payment.New(client, nil)

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	caller := enginetest.NewEngine(t, db, &engine.Config{TracerProvider: tp}, false, wf)
	reqCtx, root := tp.Tracer("shop").Start(ctx, "POST /orders")
	res, err := wf.Start(reqCtx, caller, order("ord_traced", 4999, "pm_card_visa"), &engine.StartOpts{WorkflowID: "ord_traced"})
	require.NoError(t, err)
	root.End()

	// A worker process takes the run and is killed inside its charge.
	file := filepath.Join(t.TempDir(), "worker-spans.jsonl")
	worker := crashtest.StartWorker(t, db, time.Second, "PAYMENT_GATEWAY_URL="+srv.URL, "STRIPE_API_KEY=sk_test_fake",
		crashtest.EnvWorkerTraceFile+"="+file)
	select {
	case <-gw.blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker never charged")
	}
	crashtest.Kill(t, worker)

	// This process redelivers it once the dead worker's lease expires.
	redeliverer := enginetest.NewEngine(t, db, &engine.Config{TracerProvider: tp, LeaseDuration: time.Second,
		RetryPolicy: &engine.RetryPolicy{InitialInterval: 20 * time.Millisecond}}, true, wf)
	deadline := time.Now().Add(30 * time.Second)
	var run *engine.Run
	for {
		run, err = redeliverer.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		if run.Status == engine.StatusCompleted {
			break
		}
		require.True(t, time.Now().Before(deadline), "the run is %s", run.Status)
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, 2, run.Deliveries)
	require.Zero(t, fake.Ledger().DoubleCharges(), "no double charge")

	var here []crashtest.SpanLine
	for deadline := time.Now().Add(10 * time.Second); ; {
		here = here[:0]
		for _, s := range rec.Ended() {
			here = append(here, crashtest.NewSpanLine(s, 0))
		}
		if slices.ContainsFunc(here, func(l crashtest.SpanLine) bool { return strings.HasPrefix(l.Name, "pgdurable.run ") }) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	killed := crashtest.ReadSpanFile(t, file)
	all := append(slices.Clone(here), killed...)
	traceID := root.SpanContext().TraceID().String()
	for _, s := range all {
		require.Equal(t, traceID, s.TraceID, "%s (pid %d) is in the caller's trace", s.Name, s.PID)
	}
	names := func(spans []crashtest.SpanLine) []string {
		var out []string
		for _, s := range spans {
			n := s.Name
			if a := s.Attributes["pgdurable.attempt"]; a != "" {
				n += " #" + a
			}
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	}
	// The killed worker's spans that ended before the kill: its claim and
	// the attempts before the charge it died in (the fraud check's patch
	// is no attempt and has no span).
	require.Equal(t, []string{"pgdurable.claim", "pgdurable.step claim_order #1", "pgdurable.step fraud_check #1",
		"pgdurable.step reserve_item #1", "pgdurable.step validate #1"}, names(killed))
	// The redelivery: its run span, its claim, the charge's second attempt
	// (the first died with its worker), and the steps after it; validate,
	// the fraud check, claim_order and reserve_item replay
	// from their records and are not attempted.
	require.Equal(t, []string{"POST /orders", "pgdurable.claim", "pgdurable.run payment", "pgdurable.start payment",
		"pgdurable.step charge #2", "pgdurable.step record_payment #1", "pgdurable.step send_receipt #1"}, names(here))
	t.Logf("one trace, %s:\n%s", traceID, tree(all))
}

// tree prints spans as an indented tree by parent, for a person to read.
func tree(spans []crashtest.SpanLine) string {
	children := map[string][]crashtest.SpanLine{}
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanID] = true
	}
	for _, s := range spans {
		p := s.ParentSpanID
		if !ids[p] {
			p = "" // a root, or a child of a span that never ended (the killed delivery)
		}
		children[p] = append(children[p], s)
	}
	var b strings.Builder
	var walk func(parent string, depth int)
	walk = func(parent string, depth int) {
		for _, s := range children[parent] {
			fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), s.Name)
			if a := s.Attributes["pgdurable.attempt"]; a != "" {
				fmt.Fprintf(&b, " (attempt %s)", a)
			}
			if s.PID != 0 {
				fmt.Fprintf(&b, " [killed worker pid %d]", s.PID)
			}
			if s.ParentSpanID != "" && !ids[s.ParentSpanID] {
				fmt.Fprintf(&b, " (parent %s: the killed delivery's span, never ended)", s.ParentSpanID)
			}
			b.WriteString("\n")
			walk(s.SpanID, depth+1)
		}
	}
	walk("", 0)
	return b.String()
}
