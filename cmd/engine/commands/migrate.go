package commands

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/storage/migrations"
)

func (g *global) migrateCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "migrate", Short: "Apply, roll back or show the schema (pgdurable's and River's)"}
	var steps, routes int
	var river bool
	up := &cobra.Command{
		Use: "up", Short: "Apply every pending migration (idempotent)", Args: cobra.NoArgs,
		Long: `Applies every pending migration of pgdurable and of River, in the schema --schema names.

On a Citus coordinator with active worker nodes it then puts the per-run tables (workflow_runs,
workflow_steps, workflow_signals, dead_jobs) on one worker node that Citus picks, with their rows,
as co-located distributed tables; every other table stays on the coordinator. It says so, naming
the node, the one time it does it.

--routes N spreads runs over N routes: route 0 is the per-run tables in --schema, route k the same
tables in schema <schema>_r<k>, which migrate up makes and migrates with --schema from then on. A
run's route follows from its workflow ID (a run without one goes to a route at random) and is
carried in its run ID. On a Citus coordinator each route's tables go whole to one worker node,
the routes in turn over the nodes, so that the nodes divide the runs' work; on one PostgreSQL
routes only spread the rows over more tables. A schema of one route that holds runs (an existing
database) can be given routes: its runs stay in route 0, and their workflow IDs, deduplication IDs
and debounce keys stay pinned there, so later starts of them find them. Once a schema has routes,
more are refused while it holds a run (a workflow ID's route follows from the number of routes),
and routes never shrink. Stop every engine on the schema first (refused otherwise: engines read
the routes when they start). 0 keeps what the schema has (1 for a new schema).

A Citus coordinator is a database with the citus extension in which worker nodes are registered.
When migrate up says "not a Citus coordinator with worker nodes", in that database run CREATE
EXTENSION citus (and in the same-named database of every worker node), then SELECT
citus_set_coordinator_host('<coordinator host>', <port>) and SELECT citus_add_node('<worker
host>', <port>) for each node, and run migrate up again. Point every command at the coordinator's
database: a worker node's is refused.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.migrate(cmd.Context(), migrations.Up, &migrations.Opts{Routes: routes})
		},
	}
	up.Flags().Var((*decimalInt)(&routes), "routes", fmt.Sprintf("spread runs over this many routes, 1 to %d (0: keep the schema's)", migrations.MaxRoutes))
	down := &cobra.Command{
		Use: "down", Short: "Roll back pgdurable's migrations (all, or --steps)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if steps < 0 {
				return &usageError{fmt.Errorf("--steps %d: give how many versions to roll back, or 0 for all", steps)}
			}
			return g.migrate(cmd.Context(), migrations.Down, &migrations.Opts{Steps: steps, IncludeRiver: river})
		},
	}
	down.Flags().IntVar(&steps, "steps", 0, "how many versions to roll back (0: all)")
	down.Flags().BoolVar(&river, "include-river", false, "also drop River's tables once pgdurable's are gone")
	status := &cobra.Command{
		Use: "status", Short: "Show which migrations are applied", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.localOnly("migrate"); err != nil {
				return err
			}
			pool, err := g.pool(cmd.Context(), 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := migrations.GetStatus(cmd.Context(), pool, &migrations.Opts{Schema: g.schema()})
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, st)
			}
			fmt.Fprintf(g.opts.Stdout, "schema: %s\n", st.Schema)
			t := newTable(g.opts.Stdout, "VERSION", "NAME", "APPLIED")
			for _, m := range st.Migrations {
				t.row(m.Version, m.Name, m.Applied)
			}
			t.flush()
			fmt.Fprintf(g.opts.Stdout, "river schema version: %d\n", st.RiverVersion)
			if st.Routes > 1 {
				fmt.Fprintln(g.opts.Stdout, routesLine(st.Schema, st.Routes))
			}
			if len(st.RoutesBehind) > 0 {
				fmt.Fprintf(g.opts.Stdout, "routes missing a migration: %v (run `engine migrate up`)\n", st.RoutesBehind)
			}
			if st.InPublic {
				fmt.Fprintln(g.opts.Stdout, inPublic(st.Schema))
			} else if len(st.Migrations) > 0 && !st.Migrations[0].Applied {
				if elsewhere := otherSchemas(st.Schema, st.OtherSchemas); elsewhere != "" {
					fmt.Fprintf(g.opts.Stdout, "schema %s holds no pgdurable tables; %s\n", st.Schema, elsewhere)
				}
			}
			return nil
		},
	}
	cmd.AddCommand(up, down, status)
	return cmd
}

func (g *global) migrate(ctx context.Context, dir migrations.Direction, opts *migrations.Opts) error {
	if err := g.localOnly("migrate"); err != nil {
		return err
	}
	pool, err := g.pool(ctx, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	opts.Schema = g.schema()
	res, err := migrations.Migrate(ctx, pool, dir, opts)
	if err != nil {
		return err
	}
	if dir == migrations.Up && g.opts.Migrate != nil {
		if err := g.opts.Migrate(ctx, pool); err != nil {
			// Say what did happen: the engine's part is done and stays.
			return fmt.Errorf("pgdurable's tables in schema %s are migrated (pgdurable versions %v applied now), but this binary's own migration (Options.Migrate) failed: %w",
				res.Schema, res.Applied, err)
		}
	}
	if g.jsonOut {
		return writeJSON(g.opts.Stdout, res)
	}
	if m := res.Moved; m != nil {
		fmt.Fprintf(g.opts.Stdout, "moved from schema public to schema %s: tables %s, %d River jobs (River's own tables stay in public for any other River client)\n",
			res.Schema, strings.Join(m.Tables, ", "), m.RiverJobs)
	}
	fmt.Fprintf(g.opts.Stdout, "migrate %s (schema %s): pgdurable versions %v, river versions %v\n", dir, res.Schema, res.Applied, res.River)
	if res.Distributed != "" {
		fmt.Fprintf(g.opts.Stdout, "distributed the per-run tables (%s) to Citus worker node %s\n", strings.Join(migrations.RunTables, ", "), res.Distributed)
	}
	if res.Routes > 1 {
		fmt.Fprintln(g.opts.Stdout, routesLine(res.Schema, res.Routes))
		if len(res.Placed) == 0 {
			fmt.Fprintln(g.opts.Stdout, "not a Citus coordinator with worker nodes: the routes' tables are all in this one database (see `engine migrate up --help`)")
		}
	}
	for k, node := range res.Placed {
		if res.Routes > 1 && node != "" {
			fmt.Fprintf(g.opts.Stdout, "route %d's per-run tables on Citus worker node %s\n", k, node)
		}
	}
	return nil
}

// routesLine says where schema's routes keep their per-run tables.
func routesLine(schema string, routes int) string {
	last := migrations.RouteSchema(schema, routes-1)
	if routes == 2 {
		return fmt.Sprintf("routes: 2 (per-run tables in %s and %s)", schema, last)
	}
	return fmt.Sprintf("routes: %d (per-run tables in %s, and %s_r1 to %s)", routes, schema, schema, last)
}

// errNotMigrated: the database answers but lacks the schema.
var errNotMigrated = errors.New("schema not migrated")

// checkSchema fails with a clear message when migrations are pending.
func checkSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	st, err := migrations.GetStatus(ctx, pool, &migrations.Opts{Schema: schema})
	if errors.Is(err, migrations.ErrMoved) || errors.Is(err, migrations.ErrCitusWorker) {
		return err
	}
	if err != nil {
		return fmt.Errorf("reading the schema version: %w (run `engine migrate up`)", err)
	}
	if st.InPublic {
		return fmt.Errorf("%w: %s", errNotMigrated, inPublic(schema))
	}
	for i, m := range st.Migrations {
		if m.Applied {
			continue
		}
		if i == 0 {
			if elsewhere := otherSchemas(schema, st.OtherSchemas); elsewhere != "" {
				return fmt.Errorf("%w: schema %s holds no pgdurable tables; %s", errNotMigrated, schema, elsewhere)
			}
		}
		return fmt.Errorf("%w: migration %d (%s) is not applied in schema %s: run `engine migrate up` or pass --migrate", errNotMigrated, m.Version, m.Name, schema)
	}
	if len(st.RoutesBehind) > 0 {
		return fmt.Errorf("%w: routes %v of schema %s lack a migration the schema has: run `engine migrate up` or pass --migrate", errNotMigrated, st.RoutesBehind, schema)
	}
	if st.RiverVersion == 0 {
		return fmt.Errorf("%w: the River tables are missing: run `engine migrate up` or pass --migrate", errNotMigrated)
	}
	return nil
}

// inPublic is what to do about tables an earlier version kept in public.
func inPublic(schema string) string {
	return "pgdurable's tables are in schema public, where an earlier version kept them: stop every engine of that version and run `engine migrate up` to move them to schema " +
		schema + " (or pass --schema public, to every command, to keep them there)"
}

// decimalInt is an int flag read in base 10 only: an int flag also reads
// 0x10 as 16 and 010 as 8, and a schema's routes never shrink, so a
// mistyped number would stay.
type decimalInt int

func (d *decimalInt) String() string { return strconv.Itoa(int(*d)) }

func (d *decimalInt) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 0)
	if err != nil {
		return fmt.Errorf("%q is not a whole number in base 10", s)
	}
	*d = decimalInt(n)
	return nil
}

func (*decimalInt) Type() string { return "int" }
