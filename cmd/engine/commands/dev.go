package commands

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/internal/citus"
	"github.com/pgdurable/pgdurable/internal/localpg"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

func (g *global) devCmd() *cobra.Command {
	f := &serveFlags{}
	var throwaway, withCitus bool
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Serve with zero configuration: finds or starts a PostgreSQL, migrates, serves the web UI on loopback",
		Long: `Runs serve with --migrate on loopback and prints the web UI's URL and commands to try.

` + g.devWhat() + `

The database is, in order: --database-url or DATABASE_URL; else a reachable local
PostgreSQL (127.0.0.1:5432, database pgdurable_dev, created if missing and kept: every
binary's dev shares it, so give another binary its own with DATABASE_URL); else a throwaway
PostgreSQL started from the local installation (initdb and pg_ctl on PATH or under
/usr/lib/postgresql/*/bin; as the postgres user when run as root) in a
temporary directory that is removed on exit.

With --citus it starts a throwaway Citus cluster instead — a coordinator and 2 worker
nodes on loopback ports, each a PostgreSQL with Citus preloaded, removed on exit — and
serves against the coordinator, with the runs spread over a route per worker node (migrate up
--routes 2; Citus must be installed into the local PostgreSQL: its packages, or
.ci/build-citus in a checkout).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Ctrl-C while a throwaway server or cluster starts stops what
			// started and removes its directories, as it does later.
			ctx, stopSignals := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stopSignals()
			// Bad flags are refused before a database is found or made.
			if err := g.localOnly(cmd.Name()); err != nil {
				return err
			}
			if _, err := g.engineConfig(cmd.Flags(), &f.tune); err != nil {
				return err
			}
			if withCitus && (g.databaseURL != "" || g.opts.Getenv("DATABASE_URL") != "") {
				return errors.New("engine dev: --citus starts a cluster of its own; it takes no --database-url or DATABASE_URL")
			}
			if withCitus {
				url, stop, err := devCitus(ctx, g)
				if err != nil {
					return err
				}
				defer stop()
				g.databaseURL = url
			} else if g.databaseURL == "" && g.opts.Getenv("DATABASE_URL") == "" {
				url, stop, err := devDatabase(ctx, throwaway, g)
				if err != nil {
					return err
				}
				defer stop()
				g.databaseURL = url
			}
			fmt.Fprintf(g.opts.Stderr, "engine dev: database %s\n", localpg.Redact(g.dbURL()))
			f.migrate = true
			f.dev = &DevKit{}
			if g.opts.Dev != nil {
				kit, err := g.opts.Dev(ctx, &Env{g})
				if err != nil {
					return err
				}
				if kit.Stop != nil {
					defer kit.Stop()
				}
				f.dev = kit
			}
			return g.serve(ctx, cmd.Name(), cmd.Flags(), f)
		},
	}
	cmd.Flags().StringVar(&f.listen, "listen", "127.0.0.1:8080", "HTTP listen address")
	g.addTuningFlags(cmd, &f.tune)
	cmd.Flags().Int32Var(&f.poolSize, "pool-size", 20, "PostgreSQL connections")
	cmd.Flags().DurationVar(&f.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long running steps get to finish on shutdown")
	cmd.Flags().StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().BoolVar(&throwaway, "throwaway", false, "always start a throwaway PostgreSQL")
	cmd.Flags().BoolVar(&withCitus, "citus", false, "start a throwaway Citus cluster (a coordinator and 2 worker nodes) and serve against its coordinator")
	return cmd
}

// devCitus starts a throwaway Citus cluster for dev.
func devCitus(ctx context.Context, g *global) (string, func(), error) {
	c, err := citus.Start(ctx, nil)
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintf(g.opts.Stderr, "engine dev: started a throwaway Citus cluster (removed on exit): coordinator 127.0.0.1:%d in %s\n",
		c.Coordinator.Port, c.Coordinator.Dir)
	for i, w := range c.Workers {
		fmt.Fprintf(g.opts.Stderr, "engine dev: worker node %d 127.0.0.1:%d in %s\n", i+1, w.Port, w.Dir)
	}
	// A route of runs per worker node, so that the nodes divide the runs.
	pool, err := pgxpool.New(ctx, c.URL())
	if err != nil {
		c.Stop()
		return "", nil, err
	}
	defer pool.Close()
	res, err := migrations.Migrate(ctx, pool, migrations.Up, &migrations.Opts{Schema: g.schema(), Routes: len(c.Workers)})
	if err != nil {
		c.Stop()
		return "", nil, err
	}
	fmt.Fprintf(g.opts.Stderr, "engine dev: runs spread over %d routes, on worker nodes %s\n", res.Routes, strings.Join(res.Placed, ", "))
	return c.URL(), c.Stop, nil
}

// devDatabase finds a database for dev, or starts a throwaway server.
func devDatabase(ctx context.Context, throwaway bool, g *global) (string, func(), error) {
	if !throwaway {
		if url, err := localpg.EnsureDatabase(ctx, DefaultDatabaseURL, "pgdurable_dev"); err == nil {
			return url, func() {}, nil
		}
	}
	pg, err := localpg.StartThrowaway(ctx)
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintf(g.opts.Stderr, "engine dev: started a throwaway PostgreSQL in %s (removed on exit)\n", pg.Dir)
	return pg.URL, pg.Stop, nil
}

// banner starts the kit's seed runs and prints where the UI is, the
// workflows the process registers and what to try, with the CLI as
// invocation runs it in the environment cliEnv ("DATABASE_URL='...'", and
// the schema when --schema named one).
func (k *DevKit) banner(ctx context.Context, e *engine.Engine, log *slog.Logger, out io.Writer, base, cliEnv, invocation string, workflows []string, ui bool) {
	if k.Seed != nil {
		if err := k.Seed(ctx, e); err != nil {
			log.Warn("engine dev: starting the example runs failed", "error", err)
		}
	}
	fmt.Fprintln(out)
	if ui {
		fmt.Fprintf(out, "  web UI   %s/ui/\n", base)
	}
	fmt.Fprintf(out, "  API      %s/v1/runs  (no token needed on loopback)\n", base)
	fmt.Fprintf(out, "  CLI      %s %s runs list\n", cliEnv, invocation)
	if len(workflows) == 0 {
		fmt.Fprintln(out, "  start    nothing: this process registers no workflows, so it works no runs")
	} else {
		// Over the API: this process registers the workflows, the CLI's own
		// process may not (those dev adds, say).
		wf, id, input := workflows[0], "", "<its input as JSON>"
		if k.StartExample != nil {
			wf, id, input = k.StartExample()
		}
		if id != "" {
			id = " --id " + id
		}
		fmt.Fprintf(out, "  start    %s --address %s start %s%s --input '%s' --wait   (registered: %s)\n",
			invocation, base, wf, id, input, strings.Join(workflows, ", "))
	}
	if k.Hints != nil {
		for _, h := range k.Hints(base) {
			if h != "" {
				h = "  " + h
			}
			fmt.Fprintln(out, h)
		}
	}
	fmt.Fprintln(out, "  Ctrl-C stops it.")
	fmt.Fprintln(out)
}

// devWhat says, for dev's help, what this binary's dev runs: the
// workflows it registers (Options.Workflows), and what Options.Dev adds
// as Options.DevHelp describes it.
func (g *global) devWhat() string {
	names := workflowNames(g.opts.Workflows)
	var b strings.Builder
	switch len(names) {
	case 0:
		b.WriteString("This binary registers no workflows itself.")
	default:
		fmt.Fprintf(&b, "It works the workflows this binary registers (%s).", strings.Join(names, ", "))
	}
	switch {
	case g.opts.DevHelp != "":
		b.WriteString(" " + strings.TrimSpace(g.opts.DevHelp))
	case g.opts.Dev != nil:
		b.WriteString(" It adds the examples its program sets up for dev.")
	}
	return b.String()
}

// workflowNames are the names of ws (the Name of each *engine.Workflow).
func workflowNames(ws []engine.Registration) []string {
	var names []string
	for _, w := range ws {
		if n, ok := w.(interface{ Name() string }); ok {
			names = append(names, n.Name())
		}
	}
	return names
}
