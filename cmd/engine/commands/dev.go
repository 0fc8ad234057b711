package commands

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/cmd/engine/internal/localpg"
)

func (g *global) devCmd() *cobra.Command {
	f := &serveFlags{}
	var throwaway bool
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "serve with zero configuration: finds or starts a PostgreSQL, migrates, serves on loopback",
		Long: `Runs serve with --migrate on loopback. The database is, in order: --database-url or
DATABASE_URL; else a reachable local PostgreSQL (127.0.0.1:5432, database pgdurable_dev, created
if missing); else a throwaway PostgreSQL started from the local installation (initdb and pg_ctl
on PATH or under /usr/lib/postgresql/*/bin; as the postgres user when run as root) in a
temporary directory that is removed on exit.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if g.databaseURL == "" && g.opts.Getenv("DATABASE_URL") == "" {
				url, stop, err := devDatabase(ctx, throwaway, g)
				if err != nil {
					return err
				}
				defer stop()
				g.databaseURL = url
			}
			fmt.Fprintf(g.opts.Stderr, "engine dev: database %s\n", localpg.Redact(g.dbURL()))
			f.migrate = true
			return g.serve(ctx, f)
		},
	}
	cmd.Flags().StringVar(&f.listen, "listen", "127.0.0.1:8080", "HTTP listen address")
	cmd.Flags().IntVar(&f.maxWorkers, "max-workers", 100, "concurrent deliveries in this process")
	cmd.Flags().Int32Var(&f.poolSize, "pool-size", 20, "PostgreSQL connections")
	cmd.Flags().DurationVar(&f.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long running steps get to finish on shutdown")
	cmd.Flags().StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().BoolVar(&throwaway, "throwaway", false, "always start a throwaway PostgreSQL")
	return cmd
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
