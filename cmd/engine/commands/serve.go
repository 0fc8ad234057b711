package commands

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginemetrics"
	"github.com/pgdurable/pgdurable/engine/httpapi"
	"github.com/pgdurable/pgdurable/engine/webui"
	"github.com/pgdurable/pgdurable/internal/localpg"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

type serveFlags struct {
	listen          string
	apiToken        string
	tune            tuning
	poolSize        int32
	shutdownTimeout time.Duration
	migrate         bool
	logLevel        string
	noUI            bool
	// dev, set by engine dev, adds its workflows, seed runs and hints.
	dev *DevKit
}

func (g *global) serveCmd() *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run workers and the HTTP API until SIGTERM or SIGINT",
		Long: `Runs this binary's workflows (every registered workflow, on River queue "pgdurable"),
the HTTP API (routes: docs/http-api.md, or GET /v1/openapi.json), the web UI at /ui/ (signing in
with the API token when one is set; --no-ui turns it off), /metrics, /healthz and /readyz. Several serve processes on one
database cooperate. On SIGTERM or SIGINT it stops claiming runs, lets running steps finish
and hands their runs back within --shutdown-timeout, then exits 0.

The API requires a bearer token (--api-token or ENGINE_API_TOKEN, at least 16 bytes) unless it
listens on loopback; without one it answers only requests whose Host is localhost, a loopback IP
or the listen address. Every POST, PUT and DELETE needs Content-Type: application/json and, if it
has an Origin header, this service's own origin.

With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, it exports
OpenTelemetry spans over OTLP/HTTP: one per start, run delivery and step attempt, in the trace
of the caller (an API request's traceparent header included); OTEL_SERVICE_NAME (default
pgdurable), OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and OTEL_EXPORTER_OTLP_HEADERS apply.
Without one it traces nothing. An endpoint must be an http(s)://host[:port][/path] URL (another
is refused, shown with its password redacted); a user:password in it is sent as basic
authentication and never logged.

The engine settings --retention, --lease-duration, --heartbeat-interval, --max-workers,
--max-deliveries and --version-wait-alert may also come from ENGINE_RETENTION,
ENGINE_LEASE_DURATION, ENGINE_HEARTBEAT_INTERVAL, ENGINE_MAX_WORKERS, ENGINE_MAX_DELIVERIES and
ENGINE_VERSION_WAIT_ALERT: a flag wins over its
variable, which wins over the defaults below (this binary's own, where its program sets them
in commands.Options.Config, else the engine's). Durations are Go durations: 90s, 10m, 720h.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return g.serve(cmd.Context(), cmd.Name(), cmd.Flags(), f) },
	}
	cmd.Flags().StringVar(&f.listen, "listen", "127.0.0.1:8080", "HTTP listen address")
	cmd.Flags().StringVar(&f.apiToken, "api-token", "", "bearer token for /v1 and /metrics (default $ENGINE_API_TOKEN)")
	g.addTuningFlags(cmd, &f.tune)
	cmd.Flags().Int32Var(&f.poolSize, "pool-size", 20, "PostgreSQL connections")
	cmd.Flags().DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long running steps get to finish on shutdown")
	cmd.Flags().BoolVar(&f.migrate, "migrate", false, "apply migrations before starting")
	cmd.Flags().StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().BoolVar(&f.noUI, "no-ui", false, "do not serve the web UI at /ui/")
	return cmd
}

// serve is engine serve, and engine dev once it has its database (name
// says which, in messages).
func (g *global) serve(ctx context.Context, name string, fs *pflag.FlagSet, f *serveFlags) error {
	if err := g.localOnly(name); err != nil {
		return err
	}
	cfg, err := g.engineConfig(fs, &f.tune)
	if err != nil {
		return err
	}
	if f.apiToken == "" {
		f.apiToken = g.opts.Getenv("ENGINE_API_TOKEN")
	}
	switch {
	case f.apiToken != "" && (strings.TrimSpace(f.apiToken) != f.apiToken || strings.ContainsFunc(f.apiToken, unicode.IsControl)):
		return &usageError{errors.New("the API token has leading or trailing white space or a control character, which HTTP clients cannot send back intact")}
	case f.apiToken == "" && !localpg.Loopback(f.listen):
		return &usageError{fmt.Errorf("--listen %s is not a loopback address: set --api-token or ENGINE_API_TOKEN", f.listen)}
	case f.apiToken != "" && len(f.apiToken) < minTokenBytes && !localpg.Loopback(f.listen):
		return &usageError{fmt.Errorf("the API token is %d bytes; beyond loopback it must be at least %d (e.g. openssl rand -hex 32)", len(f.apiToken), minTokenBytes)}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return &usageError{fmt.Errorf("--log-level: %w", err)}
	}
	if f.poolSize < 1 {
		return &usageError{fmt.Errorf("--pool-size %d: give at least 1 connection", f.poolSize)}
	}
	if f.shutdownTimeout < 0 {
		return &usageError{fmt.Errorf("--shutdown-timeout %s: give 0 (hand running steps back at once) or more", f.shutdownTimeout)}
	}
	g.apiToken = f.apiToken
	log := g.logger(slog.NewJSONHandler(c1Escaper{g.opts.Stderr}, &slog.HandlerOptions{Level: level}))
	// A bad OTLP endpoint is refused before anything starts.
	tp, stopTracing, err := tracingFromEnv(ctx, g.opts.Getenv, log, func(pw string) { g.otlpPassword = pw })
	if err != nil {
		return err
	}
	defer stopTracing() // after the engine stopped: its last spans are flushed

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// PostgreSQL may be restarting (a deploy, a failover): keep trying for
	// a while before giving up.
	var pool *pgxpool.Pool
	err = retryStartup(ctx, log, func() (err error) {
		pool, err = g.pool(ctx, f.poolSize)
		return err
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	if f.migrate {
		if _, err := migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Schema: cfg.Schema}); err != nil {
			return err
		}
		if g.opts.Migrate != nil {
			if err := g.opts.Migrate(ctx, pool); err != nil {
				return err
			}
		}
	} else if err := retryStartup(ctx, log, func() error { return checkSchema(ctx, pool, cfg.Schema) }); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := enginemetrics.New(reg)
	cfg.Logger, cfg.Observer, cfg.TracerProvider = log, metrics, tp
	e, err := engine.New(pool, &cfg)
	if err != nil {
		return err
	}
	metrics.WatchQueue(e)
	workflows := g.opts.Workflows
	if f.dev != nil {
		workflows = append(slices.Clip(workflows), f.dev.Workflows...)
	}
	if err := e.Register(workflows...); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", f.listen, err)
	}
	var ui http.Handler
	if !f.noUI {
		ui = webui.New(e, &webui.Options{Token: f.apiToken, Pool: pool, Logger: log, APIError: httpapi.ErrorCode})
	}
	srv := &http.Server{
		Handler: httpapi.New(e, &httpapi.Options{Token: f.apiToken, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
			Pool: pool, Logger: log, ListenAddr: ln.Addr().String(), UI: ui}),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second, // a slowly sent body cannot hold a connection (or a shutdown)
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	if err := e.Start(ctx); err != nil {
		ln.Close()
		return err
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	lease := cmp0(cfg.LeaseDuration, engine.DefaultLeaseDuration)
	retention := e.Retention().String()
	if e.Retention() < 0 {
		retention = "forever"
	}
	// Workflows only: the registrations also hold queues and rate limits.
	log.Info("engine serving", "listen", ln.Addr().String(), "schema", e.Schema(), "workflows", len(workflowNames(workflows)),
		"max_workers", cmp0(cfg.MaxWorkers, engine.DefaultMaxWorkers), "lease_duration", lease.String(),
		"heartbeat_interval", cmp0(cfg.HeartbeatInterval, lease/3).String(),
		"max_deliveries", cmp0(cfg.MaxDeliveries, engine.DefaultMaxDeliveries), "retention", retention,
		"version_wait_alert", cmp0(cfg.VersionWaitAlert, engine.DefaultVersionWaitAlert).String())
	if ui != nil {
		log.Info("web UI", "url", "http://"+ln.Addr().String()+"/ui/")
	}
	if f.dev != nil {
		cliEnv := "DATABASE_URL='" + localpg.Redact(g.dbURL()) + "'"
		if g.schemaFlag != "" {
			cliEnv += " ENGINE_SCHEMA=" + g.schemaFlag // validated: no quoting needed
		}
		f.dev.banner(ctx, e, log, g.opts.Stdout, "http://"+ln.Addr().String(), cliEnv, g.invocation(), workflowNames(workflows), ui != nil)
	}
	if len(workflowNames(workflows)) == 0 {
		log.Warn("no workflows registered: this process serves the API but works no runs (a program registers its workflows with commands.Options.Workflows; the repository's binary registers the payment example only when STRIPE_API_KEY is set)")
	}

	select {
	case <-ctx.Done():
		log.Info("shutting down", "timeout", f.shutdownTimeout.String())
	case err := <-serveErr:
		log.Error("http server stopped", "error", err)
	}
	return shutdown(srv, e, f.shutdownTimeout, log)
}

// shutdown stops the workers and the API at once: workers stop claiming
// runs immediately and running steps get the timeout to finish and be
// recorded (their runs are handed back); what still runs then is cancelled
// and handed back too. In-flight API requests get the same timeout.
func shutdown(srv *http.Server, e *engine.Engine, timeout time.Duration, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	httpDone := make(chan struct{})
	go func() {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close() // a client still sending when time ran out
		}
		close(httpDone)
	}()
	defer func() { <-httpDone }()
	if err := e.Stop(ctx); err != nil {
		log.Warn("running steps did not finish in time; cancelling them", "error", err)
		hard, cancelHard := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancelHard()
		if err := e.StopAndCancel(hard); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
	log.Info("stopped")
	return nil
}

// minTokenBytes is the shortest API token accepted beyond loopback: a
// short one can be guessed.
const minTokenBytes = 16

// startupRetryFor bounds how long serve waits for PostgreSQL at start.
const startupRetryFor = 30 * time.Second

// retryStartup retries fn every second for startupRetryFor while it fails
// for want of a database server; a schema that is simply not migrated, a
// database that does not exist on a server that answers (waiting would not
// create it), and a Citus worker node's database or a cluster set up
// wrong (waiting would not change the URL or the cluster) fail at once.
func retryStartup(ctx context.Context, log *slog.Logger, fn func() error) error {
	deadline := time.Now().Add(startupRetryFor)
	for {
		err := fn()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "3D000" { // invalid_catalog_name: no such database
			return fmt.Errorf("%w: create it first (createdb), or name another database with --database-url or DATABASE_URL", err)
		}
		if err == nil || errors.Is(err, errNotMigrated) || errors.Is(err, migrations.ErrCitusWorker) ||
			errors.Is(err, migrations.ErrCoordinatorNotInMetadata) || time.Now().After(deadline) {
			return err
		}
		log.Warn("database not ready; retrying", "error", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}
