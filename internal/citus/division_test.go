package citus_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/examples/payment"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
	"github.com/pgdurable/pgdurable/internal/citus/citustest"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// With routes, the worker nodes divide the per-run work: in a run of
// 3-step workflows and one of payments (whose tx steps also write the
// example's tables, on the coordinator), each of the 2 worker nodes runs
// 50% ± 10% of the statements on the per-run tables, counted by
// pg_stat_statements on each node; the coordinator's own work per
// workflow is logged (go test -v) and kept small.
func TestWorkDividesOverTheWorkers(t *testing.T) {
	t.Parallel()
	c := citustest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pool := coordinatorPool(ctx, t, c)
	_, err := migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Routes: 2})
	require.NoError(t, err)
	require.NoError(t, payment.Migrate(ctx, pool))
	require.NoError(t, payment.Seed(ctx, pool))
	gw := httptest.NewServer(fakegateway.New(fakegateway.Faults{}))
	defer gw.Close()
	client, err := payment.NewGateway(payment.GatewayConfig{BaseURL: gw.URL, APIKey: "sk_test_division"}, func(string) string { return "" })
	require.NoError(t, err)

	steps := engine.Define("division-3-steps", func(ctx *engine.Context, in int) (int, error) {
		for i := range 3 {
			if _, err := engine.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) { return i, nil }, nil); err != nil {
				return 0, err
			}
		}
		return in, nil
	}, nil)
	pcfg := &payment.Config{ChargeRate: engine.Rate{Limit: 100_000, Period: time.Second, Burst: 1000}}
	pay := payment.New(client, pcfg)
	e, err := engine.New(pool, &engine.Config{MaxWorkers: 50})
	require.NoError(t, err)
	require.NoError(t, e.Register(steps))
	require.NoError(t, e.Register(append([]engine.Registration{pay}, payment.Definitions(pcfg)...)...))
	require.NoError(t, e.Start(ctx))
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		require.NoError(t, e.Stop(sctx))
	}()

	measure := func(what string, n int, start func(i int) (*engine.StartResult, error), wait func(*engine.StartResult) error) {
		require.NoError(t, c.ResetStatements(ctx))
		began := time.Now()
		res := make([]*engine.StartResult, n)
		for i := range n {
			r, err := start(i)
			require.NoError(t, err)
			res[i] = r
		}
		for _, r := range res {
			require.NoError(t, wait(r))
		}
		took := time.Since(began)

		work, err := c.Work(ctx)
		require.NoError(t, err)
		coord, workers := work[0], work[1:]
		var total int64
		for _, w := range workers {
			total += w.RunCalls
		}
		require.Positive(t, total)
		for _, w := range workers {
			share := float64(w.RunCalls) / float64(total)
			t.Logf("%s: worker node %s ran %d statements on per-run tables (%.1f%%, %.2f per workflow, %.2f rows), %.2f transaction control per workflow (%.2f two-phase commits)",
				what, w.Node, w.RunCalls, 100*share, float64(w.RunCalls)/float64(n), float64(w.RunRows)/float64(n), float64(w.ControlCalls)/float64(n),
				float64(w.Prepared)/float64(n))
			require.InDelta(t, 0.5, share, 0.1, "%s: worker node %s's share of the per-run statements", what, w.Node)
		}
		t.Logf("%s: %d workflows in %s; coordinator: %.2f statements per workflow on per-run tables (each forwarded whole to a worker node), %.2f on its own tables (%.2f rows), %.2f transaction control",
			what, n, took.Round(time.Millisecond), float64(coord.RunCalls)/float64(n), float64(coord.OtherCalls)/float64(n),
			float64(coord.OtherRows)/float64(n), float64(coord.ControlCalls)/float64(n))
	}
	measure("3-step workflow", 400, func(i int) (*engine.StartResult, error) {
		return steps.Start(ctx, e, i, nil)
	}, func(r *engine.StartResult) error {
		_, err := steps.Wait(ctx, e, r.RunID, 10*time.Millisecond)
		return err
	})
	measure("payment workflow", 200, func(i int) (*engine.StartResult, error) {
		o := payment.Order{OrderID: fmt.Sprint("division_", i), CustomerID: fmt.Sprint("cus_division_", i%100), Amount: 1000,
			Currency: "usd", PaymentMethod: "pm_card_visa", Items: []payment.Item{{SKU: "sku_tee", Qty: 1}}}
		return pay.Start(ctx, e, o, &engine.StartOpts{WorkflowID: o.OrderID})
	}, func(r *engine.StartResult) error {
		_, err := pay.Wait(ctx, e, r.RunID, 10*time.Millisecond)
		return err
	})
}
