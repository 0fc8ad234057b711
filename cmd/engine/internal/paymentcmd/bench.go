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
	"github.com/pgdurable/pgdurable/cmd/engine/internal/steady"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/examples/payment"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
)

// BenchRow is engine bench's payment row, a commands.BenchRow: the
// payment workflow against the fake gateway with its faults off, on the
// bench's database (it adds the example's tables and seeds its
// inventory), with max(workflows/4, 10) runs started from 8 goroutines on
// queue bench_payment, in workflows/s from the first start to the commit
// of the last run's end. Every order reserves the same SKU, so the row
// measures that row's lock as much as the engine; BenchRowManySKUs
// spreads them. It lives here, not in the bench, because the engine must
// not import the example.
func BenchRow(ctx context.Context, url string, workflows int) (commands.BenchResult, error) {
	return benchPayment(ctx, url, workflows, 1)
}

// BenchSKUs is how many SKUs BenchRowManySKUs spreads its orders over.
const BenchSKUs = 1000

// BenchRowManySKUs is BenchRow with order i reserving SKU i mod BenchSKUs
// (seeded as sku_bench_0 and on): orders seldom wait for one another's
// inventory row, as in a shop with a catalog.
func BenchRowManySKUs(ctx context.Context, url string, workflows int) (commands.BenchResult, error) {
	return benchPayment(ctx, url, workflows, BenchSKUs)
}

// benchPayment measures the payment row with orders over skus SKUs.
func benchPayment(ctx context.Context, url string, workflows, skus int) (commands.BenchResult, error) {
	n := max(workflows/4, 10)
	row := commands.BenchResult{Name: "payment workflow, fake gateway without faults", Unit: "workflows/s"}
	if skus > 1 {
		row.Name = fmt.Sprintf("payment workflow over %s SKUs, fake gateway without faults", thousands(skus))
	}
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
	if skus > 1 {
		if _, err := pool.Exec(ctx, `INSERT INTO payment_inventory (sku, stock)
			SELECT 'sku_bench_' || g, 1000000 FROM generate_series(0, $1::int - 1) g
			ON CONFLICT (sku) DO UPDATE SET stock = excluded.stock, reserved = 0`, skus); err != nil {
			return row, fmt.Errorf("seeding the bench's SKUs: %w", err)
		}
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
	var runIDs []uuid.UUID
	timed, err := steady.While(ctx, &ends.count, n, func() (err error) {
		runIDs, err = startAll(n, func(i int) (uuid.UUID, error) {
			sku := "sku_mug"
			if skus > 1 {
				sku = fmt.Sprintf("sku_bench_%d", i%skus)
			}
			o := payment.Order{OrderID: fmt.Sprintf("%s_%d", tag, i), CustomerID: fmt.Sprintf("cus_bench_%d", i%100), Amount: 1000, Currency: "usd",
				PaymentMethod: "pm_card_visa", Items: []payment.Item{{SKU: sku, Qty: 1}}}
			res, err := wf.Start(ctx, e, o, &engine.StartOpts{WorkflowID: o.OrderID})
			return res.RunID, err
		})
		return err
	})
	if err != nil {
		return row, err
	}
	if err := ends.wait(ctx, runIDs); err != nil {
		return row, err
	}
	row.Value = timed.Rate()
	row.Note = fmt.Sprintf("%d runs: validate, fraud check, 3 tx steps, 2 HTTP activities", n)
	return row, nil
}

// startAll calls start(i) for i in 1..n from 8 goroutines and returns
// the run IDs in order, or the first error.
func startAll(n int, start func(i int) (uuid.UUID, error)) ([]uuid.UUID, error) {
	runIDs := make([]uuid.UUID, n)
	var next atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n) && firstErr.Load() == nil; i = next.Add(1) {
				id, err := start(int(i))
				if err != nil {
					firstErr.Store(&err)
					return
				}
				runIDs[i-1] = id
			}
		})
	}
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return nil, *p
	}
	return runIDs, nil
}

// runEnds is an engine.Observer that remembers the runs whose end this
// process committed: the payment row waits for its runs so, without
// reading workflow_runs. Only the row's engine works its queue (engine
// bench runs alone on its database), so every run of the row ends here.
type runEnds struct {
	engine.NopObserver
	count  atomic.Int64 // runs ended
	mu     sync.Mutex
	ended  map[uuid.UUID]bool
	notify chan struct{} // one token: some run ended since the last wait
}

func (o *runEnds) RunEnded(ev engine.RunEndedEvent) {
	o.mu.Lock()
	o.ended[ev.RunID] = true
	o.mu.Unlock()
	o.count.Add(1)
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

// thousands renders n with comma separators: 1000 -> "1,000".
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
