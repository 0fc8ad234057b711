package paymentcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/examples/payment"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
	"github.com/pgdurable/pgdurable/internal/citus"
	"github.com/pgdurable/pgdurable/internal/localpg"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

type chaosFlags struct {
	workflows       int
	latency         time.Duration
	engineWorkers   int
	engines         int
	deadline        time.Duration
	restartPostgres bool
	pgRestartCmd    string
	citus           bool
}

func chaosCmd(env *commands.Env) *cobra.Command {
	f := &chaosFlags{}
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Run payments through engines that keep getting killed, then check every effect",
		Long: `Starts --engines engine serve processes on one database and the fake gateway with faults
(10% 5xx, 5% 429, 5% "charge made, connection cut"), submits --workflows payment runs (normal
orders and declines), and meanwhile SIGKILLs a random engine every 2-5 s and restarts it,
terminates the engines' PostgreSQL backends every ~10 s and, with --restart-postgres, crashes
and restarts PostgreSQL once (immediate mode: no shutdown checkpoint, recovery from the WAL, so
commits not yet flushed are lost as in a real crash). Then it checks: every run finished; no order charged twice; completed orders
charged exactly their amount with one ledger row; compensated ones charged nothing in the end
with their inventory released; every dead job complete. It exits 1 on any violation.
Use a database of its own.

With --citus it starts a throwaway Citus cluster instead (a coordinator and 2 worker nodes on
loopback, from the Citus installed into the local PostgreSQL, removed at the end) and runs against
its coordinator, where migrate spreads the runs over a route per worker node; --restart-postgres
then SIGKILLs the worker node that holds route 0 (the runs' tables in the engine's schema) and
starts it again, instead of running --pg-restart, while the other node's runs carry on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return chaos(cmd.Context(), env, f) },
	}
	cmd.Flags().IntVar(&f.workflows, "workflows", 2000, "payment runs to submit")
	cmd.Flags().DurationVar(&f.latency, "gateway-latency", 50*time.Millisecond, "the fake gateway's latency per request (keeps runs in flight while engines die)")
	cmd.Flags().IntVar(&f.engines, "engines", 2, "engine serve processes")
	cmd.Flags().IntVar(&f.engineWorkers, "engine-workers", 100, "each engine's --max-workers")
	cmd.Flags().DurationVar(&f.deadline, "deadline", 5*time.Minute, "every run must finish within this")
	cmd.Flags().BoolVar(&f.restartPostgres, "restart-postgres", false, "crash and restart PostgreSQL once, mid-run (runs --pg-restart)")
	cmd.Flags().StringVar(&f.pgRestartCmd, "pg-restart", "pg_ctlcluster --skip-systemctl-redirect -m immediate 15 main restart", "the command that crashes and restarts PostgreSQL")
	cmd.Flags().BoolVar(&f.citus, "citus", false, "run on a throwaway Citus cluster (a coordinator and 2 worker nodes, a route of runs on each); --restart-postgres then SIGKILLs the worker node that holds route 0")
	return cmd
}

// engineProc is one engine serve process under chaos.
type engineProc struct {
	listen string
	cmd    *exec.Cmd
}

func chaos(ctx context.Context, env *commands.Env, f *chaosFlags) error {
	// Ctrl-C stops the engines, the gateway and a throwaway cluster, and
	// removes the cluster's directories, even while it starts.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var cluster *citus.Cluster
	if f.citus {
		if env.DatabaseFlag() != "" || env.Getenv("DATABASE_URL") != "" {
			return commands.UsageError(errors.New("--citus starts a cluster of its own; it takes no --database-url or DATABASE_URL"))
		}
		c, err := citus.Start(ctx, nil)
		if err != nil {
			return err
		}
		defer c.Stop()
		cluster = c
		env.SetDatabaseURL(c.URL())
		fmt.Fprintf(env.Stdout(), "chaos: a throwaway Citus cluster: coordinator 127.0.0.1:%d, worker nodes %s\n", c.Coordinator.Port, workerPorts(c))
	} else if err := env.OwnDatabase("chaos"); err != nil {
		return err
	}
	switch {
	case f.workflows < 1:
		return commands.UsageError(fmt.Errorf("--workflows must be at least 1, got %d", f.workflows))
	case f.engines < 1:
		return commands.UsageError(fmt.Errorf("--engines must be at least 1, got %d", f.engines))
	case f.engineWorkers < 1:
		return commands.UsageError(fmt.Errorf("--engine-workers must be at least 1, got %d", f.engineWorkers))
	case f.deadline <= 0:
		return commands.UsageError(fmt.Errorf("--deadline must be positive, got %s", f.deadline))
	}
	out := env.Stdout()
	dbURL := env.DatabaseURL()
	pool, err := env.Pool(ctx, 8)
	if err != nil {
		return err
	}
	defer pool.Close()
	mopts := &migrations.Opts{}
	if cluster != nil {
		mopts.Routes = len(cluster.Workers) // a route per worker node: the runs divide between them
	}
	res, err := migrations.Migrate(ctx, pool, migrations.Up, mopts)
	if err != nil {
		return err
	}
	if cluster != nil {
		fmt.Fprintf(out, "chaos: the runs spread over %d routes, on worker nodes %s\n", res.Routes, strings.Join(res.Placed, ", "))
	}
	if err := payment.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := payment.Seed(ctx, pool); err != nil {
		return err
	}
	// reader reads the runs and dead jobs; never started, it works none.
	reader, err := engine.New(pool, &engine.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	gw := fakegateway.New(fakegateway.Faults{ServerError: 0.10, RateLimit: 0.05, DropAfter: 0.05, Latency: f.latency})
	gwURL, stopGW, err := serveLoopback(gw)
	if err != nil {
		return err
	}
	defer stopGW()

	u, err := url.Parse(dbURL)
	if err != nil {
		return err
	}
	q := u.Query()
	q.Set("application_name", "pgdurable-chaos")
	u.RawQuery = q.Encode()
	engineURL := u.String()
	spawn := func(listen string) (*exec.Cmd, error) {
		cmd := env.ServeCommand("--database-url", engineURL, "serve", "--listen", listen, "--shutdown-timeout", "5s",
			"--log-level", "error", "--max-workers", fmt.Sprint(f.engineWorkers))
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, "PAYMENT_GATEWAY_URL="+gwURL, "STRIPE_API_KEY=sk_test_chaos")
		cmd.Stderr = env.Stderr()
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd, cmd.Start()
	}
	procs := make([]*engineProc, f.engines)
	for i := range procs {
		port, err := localpg.FreeLoopbackPort()
		if err != nil {
			return err
		}
		procs[i] = &engineProc{listen: fmt.Sprintf("127.0.0.1:%d", port)}
		if procs[i].cmd, err = spawn(procs[i].listen); err != nil {
			return err
		}
	}
	defer func() {
		for _, p := range procs {
			_ = p.cmd.Process.Kill()
			_, _ = p.cmd.Process.Wait()
		}
	}()
	for _, p := range procs {
		if err := waitReady(ctx, p.listen); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "chaos: %d engines, gateway %s, %d workflows\n", f.engines, gwURL, f.workflows)

	tag := "chaos" + time.Now().UTC().Format("20060102T150405")
	orders := chaosOrders(tag, f.workflows)
	start := time.Now()
	var mu sync.Mutex // guards procs' cmd fields during restarts
	alive := func(i int) string { mu.Lock(); defer mu.Unlock(); return procs[i%len(procs)].listen }
	// Orders go in while the chaos runs.
	submitted := make(chan error, 1)
	go func() { submitted <- submitChaos(ctx, orders, alive) }()
	submitting := true

	// The chaos, until every run is finished or the deadline passes.
	var kills, terminations, pgRestarts int
	nextKill := time.Now().Add(time.Duration(1000+rand.IntN(1000)) * time.Millisecond)
	nextTerminate := time.Now().Add(10 * time.Second)
	pgRestartAt := time.Now().Add(15 * time.Second)
	deadline := start.Add(f.deadline)
	for {
		if submitting {
			select {
			case err := <-submitted:
				if err != nil {
					return err
				}
				submitting = false
				fmt.Fprintf(out, "submitted %d runs in %s\n", len(orders), time.Since(start).Round(time.Millisecond))
			default:
			}
		}
		open, err := openRuns(ctx, reader, tag)
		if err != nil {
			return err
		}
		if open == 0 && !submitting {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: %d runs unfinished after %s", open, f.deadline)
		}
		now := time.Now()
		if now.After(nextKill) {
			i := rand.IntN(len(procs))
			mu.Lock()
			p := procs[i]
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			_, _ = p.cmd.Process.Wait()
			p.cmd, err = spawn(p.listen)
			mu.Unlock()
			if err != nil {
				return err
			}
			kills++
			nextKill = now.Add(time.Duration(2000+rand.IntN(3000)) * time.Millisecond)
		}
		if now.After(nextTerminate) {
			var n int
			_ = pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE application_name = 'pgdurable-chaos' AND datname = current_database()`).Scan(&n)
			terminations += n
			nextTerminate = now.Add(10 * time.Second)
		}
		if f.restartPostgres && pgRestarts == 0 && now.After(pgRestartAt) {
			if cluster != nil {
				if err := crashRunsNode(ctx, out, cluster, pool, start); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(out, "  %5.1fs: crashing and restarting PostgreSQL: %s\n", time.Since(start).Seconds(), f.pgRestartCmd)
				if out, err := exec.Command("sh", "-c", f.pgRestartCmd).CombinedOutput(); err != nil {
					return fmt.Errorf("restarting PostgreSQL: %w\n%s", err, out)
				}
			}
			pgRestarts++
		}
		fmt.Fprintf(out, "  %5.1fs: %d runs open, %d kills, %d backends terminated, %d PostgreSQL restarts\n",
			time.Since(start).Seconds(), open, kills, terminations, pgRestarts)
		time.Sleep(time.Second)
	}
	elapsed := time.Since(start)
	fmt.Fprintf(out, "all %d runs finished in %s: %d engine kills, %d backends terminated, %d PostgreSQL restarts\n",
		len(orders), elapsed.Round(time.Millisecond), kills, terminations, pgRestarts)
	return verifyChaos(ctx, out, reader, pool, gw, tag, orders)
}

func waitReady(ctx context.Context, listen string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + listen + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("engine on %s never became ready", listen)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// chaosOrders: normal orders and about 1 in 8 declined.
func chaosOrders(tag string, n int) []payment.Order {
	out := make([]payment.Order, n)
	for i := range out {
		method := "pm_card_visa"
		if i%8 == 5 {
			method = fakegateway.DeclineMethod
		}
		out[i] = payment.Order{OrderID: fmt.Sprintf("%s_%05d", tag, i), CustomerID: fmt.Sprintf("cus_chaos_%d", i%50), Amount: int64(500 + i%1000),
			Currency: "usd", PaymentMethod: method, Items: []payment.Item{{SKU: "sku_tee", Qty: 1 + i%3}}}
	}
	return out
}

// submitChaos starts every order through the API, retrying on another
// engine when one is down; a retry of an accepted start answers 200.
func submitChaos(ctx context.Context, orders []payment.Order, engineAt func(int) string) error {
	hc := &http.Client{Timeout: 10 * time.Second}
	for i, o := range orders {
		body, _ := json.Marshal(map[string]any{"id": o.OrderID, "input": o})
		for try := 0; ; try++ {
			resp, err := hc.Post("http://"+engineAt(i+try)+"/v1/workflows/"+payment.WorkflowName+"/runs", "application/json", bytes.NewReader(body))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusOK {
					break
				}
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			if try > 50 {
				return fmt.Errorf("submitting %s: %w", o.OrderID, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

var errViolations = errors.New("chaos found violations")

// workerPorts lists c's worker nodes' ports.
func workerPorts(c *citus.Cluster) string {
	ports := make([]string, len(c.Workers))
	for i, w := range c.Workers {
		ports[i] = fmt.Sprint(w.Port)
	}
	return strings.Join(ports, ", ")
}

// crashRunsNode SIGKILLs the worker node of c that holds route 0's runs
// table and starts it again (localpg.Throwaway.Crash).
func crashRunsNode(ctx context.Context, out io.Writer, c *citus.Cluster, pool *pgxpool.Pool, start time.Time) error {
	var port int
	if err := pool.QueryRow(ctx, `SELECT nodeport FROM citus_shards WHERE table_name = 'pgdurable.workflow_runs'::regclass LIMIT 1`).Scan(&port); err != nil {
		return fmt.Errorf("finding the worker node that holds the runs: %w", err)
	}
	for _, w := range c.Workers {
		if w.Port == port {
			fmt.Fprintf(out, "  %5.1fs: crashing and restarting the worker node that holds route 0's runs: 127.0.0.1:%d (SIGKILL)\n", time.Since(start).Seconds(), port)
			return w.Crash(ctx)
		}
	}
	return fmt.Errorf("the runs are on 127.0.0.1:%d, which is none of the cluster's worker nodes", port)
}
