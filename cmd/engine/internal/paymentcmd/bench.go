package paymentcmd

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/examples/payment"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
)

// BenchRow is engine bench's payment row, a commands.BenchRow: the
// payment workflow against the fake gateway with its faults off, on the
// bench's database (it adds the example's tables and seeds its
// inventory), with max(workflows/4, 10) runs started from 8 goroutines on
// queue bench_payment, in workflows/s from the first start to the commit
// of the last run's end. It lives here, not in the bench, because the
// engine must not import the example.
func BenchRow(ctx context.Context, url string, workflows int) (commands.BenchResult, error) {
	n := max(workflows/4, 10)
	row := commands.BenchResult{Name: "payment workflow, fake gateway without faults", Unit: "workflows/s"}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return row, err
	}
	cfg.MaxConns = 20 // the bench's other rows' pool size
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return row, err
	}
	defer pool.Close()
	if err := payment.Migrate(ctx, pool); err != nil {
		return row, err
	}
	if err := payment.Seed(ctx, pool); err != nil {
		return row, err
	}
	gwURL, stop, err := serveLoopback(fakegateway.New(fakegateway.Faults{}))
	if err != nil {
		return row, err
	}
	defer stop()
	client, err := payment.NewGateway(payment.GatewayConfig{BaseURL: gwURL, APIKey: "sk_test_bench"}, func(string) string { return "" })
	if err != nil {
		return row, err
	}
	// The charge rate limit is set far above what the row reaches: the row
	// measures the engine (a turn of the limit per charge included), not
	// the card processor's limit.
	pcfg := &payment.Config{ChargeRate: engine.Rate{Limit: 100_000, Period: time.Second, Burst: 1000}}
	wf := payment.New(client, pcfg)
	ends := &runEnds{ended: map[uuid.UUID]bool{}, notify: make(chan struct{}, 1)}
	e, err := engine.New(pool, &engine.Config{Logger: slog.New(slog.DiscardHandler), Queue: "bench_payment", Observer: ends})
	if err != nil {
		return row, err
	}
	if err := e.Register(append([]engine.Registration{wf}, payment.Definitions(pcfg)...)...); err != nil {
		return row, err
	}
	if err := e.Start(ctx); err != nil {
		return row, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Stop(sctx)
	}()
	tag := "bench" + strconv.FormatInt(time.Now().UnixNano(), 36)
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	runIDs := make([]uuid.UUID, n)
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				o := payment.Order{OrderID: fmt.Sprintf("%s_%d", tag, i), CustomerID: fmt.Sprintf("cus_bench_%d", i%100), Amount: 1000, Currency: "usd",
					PaymentMethod: "pm_card_visa", Items: []payment.Item{{SKU: "sku_mug", Qty: 1}}}
				res, err := wf.Start(ctx, e, o, &engine.StartOpts{WorkflowID: o.OrderID})
				if err != nil {
					firstErr.Store(&err)
					return
				}
				runIDs[i-1] = res.RunID
			}
		})
	}
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return row, *p
	}
	if err := ends.wait(ctx, runIDs); err != nil {
		return row, err
	}
	row.Value = float64(n) / time.Since(start).Seconds()
	row.Note = fmt.Sprintf("%d runs: validate, fraud check, 2 tx steps, 2 HTTP activities", n)
	return row, nil
}

// runEnds is an engine.Observer that remembers the runs whose end this
// process committed: the payment row waits for its runs so, without
// reading workflow_runs. Only the row's engine works its queue (engine
// bench runs alone on its database), so every run of the row ends here.
type runEnds struct {
	engine.NopObserver
	mu     sync.Mutex
	ended  map[uuid.UUID]bool
	notify chan struct{} // one token: some run ended since the last wait
}

func (o *runEnds) RunEnded(ev engine.RunEndedEvent) {
	o.mu.Lock()
	o.ended[ev.RunID] = true
	o.mu.Unlock()
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

// wait returns once every run of runIDs has ended (completed, failed,
// compensated, cancelled or dead), or ctx's error.
func (o *runEnds) wait(ctx context.Context, runIDs []uuid.UUID) error {
	done := 0 // runIDs[:done] have ended
	for {
		o.mu.Lock()
		for done < len(runIDs) && o.ended[runIDs[done]] {
			done++
		}
		o.mu.Unlock()
		if done == len(runIDs) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-o.notify:
		}
	}
}
