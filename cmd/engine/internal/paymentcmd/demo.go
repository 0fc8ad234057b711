package paymentcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/httpapi"
	"github.com/pgdurable/pgdurable/examples/payment"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
	"github.com/pgdurable/pgdurable/internal/localpg"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

type demoFlags struct {
	timeout   time.Duration
	faults    bool
	workers   int
	logEngine bool
}

func demoCmd(env *commands.Env) *cobra.Command {
	f := &demoFlags{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the payment example end to end against a fake Stripe with faults, and print a summary",
		Long: `Migrates the database, seeds the example's inventory, starts a fake Stripe-compatible
gateway on loopback (about 10% 5xx, 5% 429, 5% "charge made, then the connection cut"),
starts the engine (workers + HTTP API on loopback), submits examples/payment/testdata/orders.jsonl
through the HTTP API, waits for every run to finish and prints what happened, including the
gateway's count of double charges (there must be none).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return demo(cmd.Context(), env, f) },
	}
	cmd.Flags().DurationVar(&f.timeout, "timeout", 3*time.Minute, "give up waiting for runs after this long")
	cmd.Flags().BoolVar(&f.faults, "faults", true, "inject gateway faults")
	cmd.Flags().IntVar(&f.workers, "max-workers", 100, "concurrent deliveries")
	cmd.Flags().BoolVar(&f.logEngine, "log", false, "print the engine's logs (JSON) to stderr")
	return cmd
}

func demo(ctx context.Context, env *commands.Env, f *demoFlags) error {
	out := env.Stdout()
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if env.DatabaseFlag() == "" && env.Getenv("DATABASE_URL") == "" {
		// Keep the demo's tables out of the server's default database; with
		// no local server, start a throwaway one as engine dev does.
		url, err := localpg.EnsureDatabase(ctx, commands.DefaultDatabaseURL, "pgdurable_demo")
		if err != nil {
			pg, perr := localpg.StartThrowaway(ctx)
			if perr != nil {
				return fmt.Errorf("no PostgreSQL at %s (%v) and none to start: %w\n(set DATABASE_URL or --database-url)", localpg.Redact(commands.DefaultDatabaseURL), err, perr)
			}
			defer pg.Stop()
			fmt.Fprintf(out, "started a throwaway PostgreSQL in %s (removed on exit)\n", pg.Dir)
			url = pg.URL
		}
		env.SetDatabaseURL(url)
	}
	pool, err := env.Pool(ctx, 20)
	if err != nil {
		return fmt.Errorf("%w\n(engine demo uses the database that --database-url or DATABASE_URL names, which must exist: "+
			"createdb it, or unset both and the demo creates pgdurable_demo on the local server)", err)
	}
	defer pool.Close()
	fmt.Fprintf(out, "database     %s\n", localpg.Redact(env.DatabaseURL()))
	if _, err := migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Schema: env.Schema()}); err != nil {
		return err
	}
	if err := payment.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := payment.Seed(ctx, pool); err != nil {
		return err
	}

	faults := fakegateway.Faults{}
	if f.faults {
		faults = fakegateway.Faults{ServerError: 0.10, RateLimit: 0.05, DropAfter: 0.05, Latency: 2 * time.Millisecond}
	}
	gw := fakegateway.New(faults)
	gwURL, stopGW, err := serveLoopback(gw)
	if err != nil {
		return err
	}
	defer stopGW()
	fmt.Fprintf(out, "gateway      %s (fake Stripe; faults: %v)\n", gwURL, f.faults)

	client, err := payment.NewGateway(payment.GatewayConfig{BaseURL: gwURL, APIKey: "sk_test_demo", Timeout: 10 * time.Second}, env.Getenv)
	if err != nil {
		return err
	}
	logOut := io.Discard
	if f.logEngine {
		logOut = env.Stderr()
	}
	log := slog.New(slog.NewJSONHandler(logOut, nil))
	e, err := engine.New(pool, &engine.Config{Schema: env.Schema(), Logger: log, MaxWorkers: f.workers,
		RetryPolicy: &engine.RetryPolicy{InitialInterval: 50 * time.Millisecond, MaximumInterval: 2 * time.Second}})
	if err != nil {
		return err
	}
	if err := e.Register(payment.Registrations(client, nil)...); err != nil {
		return err
	}
	if err := e.Start(ctx); err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.StopAndCancel(sctx)
		}
	}()
	apiURL, stopAPI, err := serveLoopback(httpapi.New(e, &httpapi.Options{Pool: pool, Logger: log}))
	if err != nil {
		return err
	}
	defer stopAPI()
	fmt.Fprintf(out, "engine API   %s\n\n", apiURL)

	start := time.Now()
	tag := "demo" + start.UTC().Format("20060102T150405")
	fmt.Fprintf(out, "order IDs    prefixed %s_ so demos can repeat on one database\n", tag)
	sub := submitOrders(ctx, apiURL, tagOrders(tag, payment.DemoOrders()))
	fmt.Fprintf(out, "submitted %d orders: %d new runs, %d duplicates answered with the existing run, %d rejected (400), %d conflicting reuses of an order ID (409)\n",
		sub.total, len(sub.runs), sub.existing, sub.rejected, sub.conflicts)

	statuses, err := waitRuns(ctx, e, sub.runs, f.timeout, out)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.Stop(sctx)
	stopped = true
	return printSummary(ctx, out, env.DatabaseFlag(), env.Getenv("DATABASE_URL") != "", pool, gw, tag, statuses, elapsed)
}

// tagOrders prefixes each order's ID with tag, so a demo run never meets
// the orders (and ledger rows) of an earlier one.
func tagOrders(tag string, orders [][]byte) [][]byte {
	out := make([][]byte, len(orders))
	for i, raw := range orders {
		var m map[string]any
		if json.Unmarshal(raw, &m) != nil {
			out[i] = raw // not JSON: sent as is, and rejected
			continue
		}
		if id, ok := m["order_id"].(string); ok {
			m["order_id"] = tag + "_" + id
		}
		out[i], _ = json.Marshal(m)
	}
	return out
}

type submitted struct {
	total, existing, rejected, conflicts int
	runs                                 map[string]string // run ID -> order ID
}

func submitOrders(ctx context.Context, apiURL string, orders [][]byte) submitted {
	s := submitted{total: len(orders), runs: map[string]string{}}
	hc := &http.Client{Timeout: 30 * time.Second}
	for _, raw := range orders {
		var probe struct {
			OrderID string `json:"order_id"`
		}
		_ = json.Unmarshal(raw, &probe)
		body, _ := json.Marshal(map[string]any{"id": probe.OrderID, "input": json.RawMessage(raw)})
		if !json.Valid(raw) {
			body = []byte(`{"id": "` + probe.OrderID + `", "input": ` + string(raw) + `}`) // sent as is: the API rejects it
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/v1/workflows/"+payment.WorkflowName+"/runs", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			s.rejected++
			continue
		}
		var r struct {
			RunID string `json:"run_id"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusCreated:
			s.runs[r.RunID] = probe.OrderID
		case http.StatusOK:
			s.existing++
		case http.StatusConflict:
			s.conflicts++
		default:
			s.rejected++
		}
	}
	return s
}

// waitRuns polls until every run is terminal, printing progress each second.
func waitRuns(ctx context.Context, e *engine.Engine, runs map[string]string, timeout time.Duration, out io.Writer) (map[string]*engine.Run, error) {
	final := map[string]*engine.Run{}
	deadline := time.Now().Add(timeout)
	lastPrint := time.Time{}
	for {
		for id := range runs {
			if _, done := final[id]; done {
				continue
			}
			run, err := e.GetRun(ctx, uuidMust(id))
			if err != nil {
				return nil, err
			}
			if run.Status.Terminal() {
				final[id] = run
			}
		}
		if time.Since(lastPrint) >= time.Second || len(final) == len(runs) {
			lastPrint = time.Now()
			counts := map[engine.RunStatus]int{}
			for _, r := range final {
				counts[r.Status]++
			}
			fmt.Fprintf(out, "  %3d/%d finished %v\n", len(final), len(runs), counts)
		}
		if len(final) == len(runs) {
			return final, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d runs still unfinished after %s", len(runs)-len(final), timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
