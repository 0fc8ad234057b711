// Package commands holds the engine binary's commands (cobra). It has no
// globals: Execute takes the arguments, the workflows to register and the
// output streams, so programs that define their own workflows build their
// own `engine` with one call:
//
//	os.Exit(commands.Execute(ctx, os.Args[1:], commands.Options{Workflows: []engine.Registration{myWorkflow}}))
//
// Options.Config is the binary's engine.Config, which serve's flags and
// ENGINE_* variables override. A program adds commands of its own with
// Options.Commands and rows of its
// own to engine bench with Options.BenchRows; cmd/engine adds the payment
// example's commands (demo, gateway, chaos) and bench row so, from its
// internal package paymentcmd, which this package does not import.
package commands

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/httpapi"
	"github.com/pgdurable/pgdurable/internal/localpg"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// Options configures the commands.
type Options struct {
	// Workflows are registered by every command that runs or starts runs:
	// workflows, and the queues and rate limits they use
	// (engine.DefineQueue, engine.DefineRateLimit).
	Workflows []engine.Registration
	// Config is the engine configuration of this binary, as engine.New
	// takes it: every command that makes an engine starts from a copy of
	// it (nil: all of engine.Config's defaults). serve and dev work runs
	// with it, and their flags and environment variables override the
	// fields an operator tunes: --retention (ENGINE_RETENTION),
	// --lease-duration (ENGINE_LEASE_DURATION), --heartbeat-interval
	// (ENGINE_HEARTBEAT_INTERVAL), --max-workers (ENGINE_MAX_WORKERS),
	// --max-deliveries (ENGINE_MAX_DELIVERIES) and --version-wait-alert
	// (ENGINE_VERSION_WAIT_ALERT). A flag wins over its
	// variable, the variable over this Config, this Config over the
	// engine's default; serve --help shows this Config's values as the
	// defaults. The operator commands on the database use it too (its
	// MaxPayloadBytes bounds the inputs they start, and runs prune
	// defaults --older-than to its Retention, or ENGINE_RETENTION).
	// Logger, Observer and TracerProvider are the commands' own and are
	// ignored here: serve logs JSON to stderr at --log-level, feeds its
	// /metrics and exports OTLP as OTEL_* says; the other commands log
	// warnings as text to stderr. A value engine.New refuses (a
	// HeartbeatInterval not below the LeaseDuration, ...) fails every such
	// command with engine.New's error.
	Config *engine.Config
	// Migrate applies the application's own migrations (its business
	// tables), after pgdurable's, in `migrate up` and `serve --migrate`.
	Migrate func(ctx context.Context, pool *pgxpool.Pool) error
	// Stdin, Stdout and Stderr default to the process's.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Getenv defaults to os.Getenv (tests inject their own).
	Getenv func(string) string
	// ServeCommand builds the command that runs `engine <args>` as a child
	// process (engine chaos; see Env.ServeCommand); default: this executable.
	ServeCommand func(args ...string) *exec.Cmd
	// Commands add the program's own commands next to the built-in ones
	// (cmd/engine adds paymentcmd.Commands: demo, gateway and chaos). Each
	// function is called once per Execute or NewRoot with the Env the
	// commands share, and the command it returns (nil: none) is added to
	// the root; its name must differ from the built-in commands'. As for
	// those, a wrong number of arguments to it is a usage error (exit 2).
	// Default: none.
	Commands []func(*Env) *cobra.Command
	// BenchRows add rows to engine bench (cmd/engine adds
	// paymentcmd.BenchRow). They are measured in order after the built-in
	// rows, each printed as a progress line when it is done, and placed
	// before the last row (the memory row) in the table and in --json.
	// Default: none.
	BenchRows []BenchRow
	// Dev, when set, is what engine dev adds to serve: it is called once
	// the database is chosen, before the engine starts; the workflows it
	// returns are registered next to Workflows, its Seed runs once the
	// engine has started, and its Hints are printed with the UI's URL.
	// cmd/engine sets paymentcmd.Dev: the payment example on an embedded
	// fake gateway and a signal-waiting example. Default: none.
	Dev func(ctx context.Context, env *Env) (*DevKit, error)
	// DevHelp is what Dev adds, in a sentence or two for engine dev
	// --help, after the list of Workflows (cmd/engine sets
	// paymentcmd.DevHelp). Default: with Dev set, a line saying the
	// program adds examples of its own; without, nothing.
	DevHelp string
	// Invocation is how a person runs this binary, for the commands that
	// engine dev (and a command using Env.Invocation) prints: "./bin/app"
	// gives "./bin/app runs list". Default: "go run <package>" when the
	// binary runs from go run's build cache (the package relative to the
	// working directory when that is its module's root, "go run
	// ./cmd/engine"), else os.Args[0] as it was typed.
	Invocation string
}

// DevKit is what Options.Dev gives engine dev.
type DevKit struct {
	Workflows []engine.Registration
	// StartExample, called after Seed, gives the workflow, workflow ID
	// ("" for none) and input (JSON) of the start command dev prints, one
	// that ends on its own (the command waits for it); nil: the first
	// workflow the process registers, with a placeholder for its input.
	StartExample func() (workflow, workflowID, input string)
	// Seed starts example runs on the started engine (nil: none); an
	// error is logged, not fatal.
	Seed func(ctx context.Context, e *engine.Engine) error
	// Hints returns lines to print for a person once the API listens at
	// base ("http://127.0.0.1:8080"): commands to try.
	Hints func(base string) []string
	// Stop releases what Dev started (nil: nothing), after the engine
	// stopped.
	Stop func()
}

// BenchRow measures one row of engine bench beyond its built-in ones (see
// Options.BenchRows). It gets the bench's database URL, migrated with
// pgdurable's migrations (the row adds any tables of its own), and
// --workflows (default 2000), the size of each throughput row, to size
// itself by. It returns the row as BenchResult describes it, or an
// error that fails the bench (exit 1).
type BenchRow func(ctx context.Context, databaseURL string, workflows int) (BenchResult, error)

// BenchResult is one row of engine bench: a line of its table and an
// element of "rows" in its --json, with the JSON names below. The bench's
// own measurements live in an internal package of cmd/engine, so a
// program's BenchRow returns this type, which has the same fields.
type BenchResult struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"` // "workflows/s", "ms", "ratio", ...
	Note  string  `json:"note,omitempty"`
	// Skipped rows have no value (what they measure does not exist yet);
	// the table shows "-".
	Skipped bool `json:"skipped,omitempty"`
}

// DefaultDatabaseURL is used when neither --database-url nor DATABASE_URL is set.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Execute runs the command line args and returns the exit code: 0 on
// success, 1 on failure (the error is printed to Stderr), 2 on misuse.
func Execute(ctx context.Context, args []string, opts Options) int {
	opts = opts.withDefaults()
	root, g := newRoot(opts)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		// Whatever a library put in the error, a password or token never
		// reaches the terminal.
		msg := scrub(err.Error(), g.secrets())
		var pgErr *pgconn.PgError
		missing := errors.As(err, &pgErr) && pgErr.Code == "42P01" // undefined_table
		if missing {
			// What to do first; PostgreSQL's words after, for the record.
			msg = scrub(g.missingTables(ctx), g.secrets()) + " (" + msg + ")"
		}
		var usage *usageError
		var outcome *runOutcomeError
		code, exit := "usage", 2
		switch {
		case errors.As(err, &outcome) && g.jsonOut:
			return 1 // the run, as it ended, is printed
		case errors.As(err, &outcome):
			code, exit = "run_not_completed", 1
		case errors.Is(err, migrations.ErrCitusWorker):
			code, exit = "invalid_parameter", 1 // the URL names the wrong server
		case errors.Is(err, migrations.ErrCoordinatorNotInMetadata):
			code, exit = "invalid_parameter", 1 // the cluster is not set up as the error says
		case missing, errors.Is(err, errNotMigrated), errors.Is(err, migrations.ErrMoved):
			code, exit = "not_migrated", 1
		case errors.Is(err, migrations.ErrEnginesRunning):
			code, exit = "engines_running", 1
		case errors.Is(err, migrations.ErrRoutesRefused), errors.Is(err, migrations.ErrDistributionRefused):
			code, exit = "invalid_parameter", 1
		case pgErr != nil && pgErr.Code == "42501": // insufficient_privilege
			code, exit = "permission_denied", 1
		case !errors.As(err, &usage):
			_, code = httpapi.ErrorCode(err)
			var api *apiError
			if errors.As(err, &api) && code == "internal" {
				code = api.code // a server's answer keeps its own code (unauthorized, ...)
			}
			exit = 1
		}
		if g.jsonOut {
			// The HTTP API's error shape, on stdout with the other JSON.
			_ = writeJSON(opts.Stdout, httpapi.NewErrorBody(code, msg))
			return exit
		}
		fmt.Fprintln(opts.Stderr, "error:", escapeControls(msg, true))
		return exit
	}
	return 0
}

func (o Options) withDefaults() Options {
	if o.Stdin == nil {
		o.Stdin = os.Stdin
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	return o
}

type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }

// global holds the flags every command shares.
type global struct {
	opts        Options
	databaseURL string
	jsonOut     bool
	apiToken    string // serve's, or the one --address sends, once known: a secret like the database password
	addressFlag string // --address
	schemaFlag  string // --schema
	clientToken string // --api-token on the root: what --address sends
	// otlpPassword is the password of serve's OTLP endpoint URL, if any:
	// a secret like the database password.
	otlpPassword string
}

// NewRoot builds the command tree.
func NewRoot(opts Options) *cobra.Command {
	root, _ := newRoot(opts)
	return root
}

func newRoot(opts Options) (*cobra.Command, *global) {
	opts = opts.withDefaults()
	g := &global{opts: opts}
	root := &cobra.Command{
		Use:           "engine",
		Short:         "pgdurable: durable workflows on PostgreSQL",
		Version:       version(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(opts.Stdout)
	root.SetErr(opts.Stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &usageError{err} })
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		// A bad schema name is a usage mistake, told before anything
		// connects (bench and chaos use databases of their own).
		if name := cmd.Name(); name == "bench" || name == "chaos" || name == "help" {
			return nil
		}
		if err := migrations.ValidSchemaName(g.schema()); err != nil {
			return &usageError{fmt.Errorf("--schema (or $%s): %w", envSchema, err)}
		}
		return nil
	}
	root.PersistentFlags().StringVar(&g.databaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL, else "+DefaultDatabaseURL+")")
	root.PersistentFlags().StringVar(&g.addressFlag, "address", "", "talk to a running engine's HTTP API at host:port or http(s)://host:port instead of the database (default $ENGINE_ADDRESS, unless --database-url is given; a redirect is an error, never followed)")
	root.PersistentFlags().StringVar(&g.clientToken, "api-token", "", "the bearer token --address sends (default $ENGINE_API_TOKEN); serve: the token it requires")
	root.PersistentFlags().StringVar(&g.schemaFlag, "schema", "", "PostgreSQL schema of pgdurable's tables and River's, for every command that uses the database except bench and chaos, whose databases are their own; refused with --address, where the server's own schema is used (default $"+envSchema+", else the binary's engine.Config.Schema, else "+engine.DefaultSchema+")")
	root.PersistentFlags().BoolVar(&g.jsonOut, "json", false, "print JSON instead of tables (the HTTP API's shapes; errors as {\"error\": {\"code\", \"message\"}} on stdout)")
	root.AddCommand(g.serveCmd(), g.migrateCmd(), g.runsCmd(), g.deadCmd(), g.startCmd(), g.startNowCmd(), g.cancelCmd(), g.terminateCmd(), g.workflowsCmd(), g.queuesCmd(), g.signalCmd(), g.schedulesCmd(), g.uiSessionsCmd(), g.devCmd(), g.benchCmd())
	env := &Env{g: g}
	for _, newCmd := range opts.Commands {
		if c := newCmd(env); c != nil {
			root.AddCommand(c)
		}
	}
	usageArgs(root)
	return root, g
}

// usageArgs makes a wrong number of arguments a usage error (exit 2), like
// a bad flag, on every command.
func usageArgs(c *cobra.Command) {
	if c.HasSubCommands() && c.Run == nil && c.RunE == nil {
		// A group (migrate, runs, dead, schedules): an unknown subcommand
		// is a usage error, not a help page and exit 0.
		c.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &usageError{fmt.Errorf("unknown command %q for %q; see %s --help", args[0], cmd.CommandPath(), cmd.CommandPath())}
			}
			return nil
		}
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return &usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		usageArgs(sub)
	}
}

// missingTables says why a statement found no table: the schema is
// empty, its tables were moved, or they are still in public.
func (g *global) missingTables(ctx context.Context) string {
	generic := "the database has no pgdurable tables in schema " + g.schema() + ": run `engine migrate up` first"
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pool, err := g.pool(ctx, 1)
	if err != nil {
		return generic
	}
	defer pool.Close()
	st, err := migrations.GetStatus(ctx, pool, &migrations.Opts{Schema: g.schema()})
	switch {
	case errors.Is(err, migrations.ErrMoved):
		return err.Error()
	case err == nil && st.InPublic:
		return inPublic(g.schema())
	}
	if err == nil {
		if elsewhere := otherSchemas(g.schema(), st.OtherSchemas); elsewhere != "" {
			return "the database has no pgdurable tables in schema " + g.schema() + "; " + elsewhere
		}
	}
	return generic
}

// otherSchemas names others, the schemas other than schema that hold
// pgdurable's tables, as a hint for a mistyped --schema ("" if none).
func otherSchemas(schema string, others []string) string {
	switch len(others) {
	case 0:
		return ""
	case 1:
		return "schema " + others[0] + " holds them: pass --schema " + others[0] + " (or ENGINE_SCHEMA), or run `engine migrate up` to create them in " + schema
	}
	return "schemas " + strings.Join(others, ", ") + " hold them: pass --schema with one of these (or ENGINE_SCHEMA), or run `engine migrate up` to create them in " + schema
}

// envSchema names the variable --schema defaults to.
const envSchema = "ENGINE_SCHEMA"

// schema is the schema of the engine's tables: --schema, else
// $ENGINE_SCHEMA, else Options.Config.Schema, else the engine's default.
func (g *global) schema() string {
	switch {
	case g.schemaFlag != "":
		return g.schemaFlag
	case g.opts.Getenv(envSchema) != "":
		return g.opts.Getenv(envSchema)
	case g.opts.Config != nil && g.opts.Config.Schema != "":
		return g.opts.Config.Schema
	}
	return engine.DefaultSchema
}

func (g *global) dbURL() string {
	if g.databaseURL != "" {
		return normalizeScheme(g.databaseURL)
	}
	if v := g.opts.Getenv("DATABASE_URL"); v != "" {
		return normalizeScheme(v)
	}
	return DefaultDatabaseURL
}

// ownDatabase returns the database URL for a command that fills and
// alters its database (chaos, bench): it must be named explicitly, never
// the default, so a forgotten flag cannot fill the postgres database.
func (g *global) ownDatabase(command string) error {
	if g.databaseURL != "" || g.opts.Getenv("DATABASE_URL") != "" {
		return nil
	}
	return &usageError{fmt.Errorf("engine %s fills its database with tables, runs and jobs: name a database of its own "+
		"with --database-url or DATABASE_URL (createdb %s; then --database-url 'postgres://postgres@127.0.0.1:5432/%s?sslmode=disable')",
		command, command, command)}
}

// pool connects with size connections (0: pgx's default).
func (g *global) pool(ctx context.Context, size int32) (*pgxpool.Pool, error) {
	if err := checkConnString(g.dbURL()); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(g.dbURL())
	if err != nil {
		return nil, fmt.Errorf("parsing the database URL: %w", err)
	}
	if size > 0 {
		cfg.MaxConns = size
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to PostgreSQL at %s: %w", localpg.Redact(g.dbURL()), err)
	}
	// A worker node's database holds a share of the runs under other
	// tables' names: every command refuses it, not only those that
	// migrate, rather than show part of the runs as all of them.
	if err := migrations.RefuseCitusWorker(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// client is an engine that starts and inspects runs without working them.
// client is what the operator commands work through: with --address (or
// ENGINE_ADDRESS), a running server's HTTP API with --api-token (or
// ENGINE_API_TOKEN); otherwise an engine client on the database, which
// registers this binary's workflows to check starts' inputs. done
// releases it.
func (g *global) client(ctx context.Context) (b backend, done func(), err error) {
	if g.address() != "" {
		c, err := g.apiClient()
		if err != nil {
			return nil, nil, err
		}
		return c, func() {}, nil
	}
	pool, err := g.pool(ctx, 4)
	if err != nil {
		return nil, nil, err
	}
	cfg := g.baseConfig() // an engine that starts and reads runs, and works none
	cfg.Logger = g.logger(slog.NewTextHandler(g.opts.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := engine.New(pool, &cfg)
	if err == nil {
		err = e.Register(g.opts.Workflows...)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return e, pool.Close, nil
}

// apiClient is the client of the server at address(), with --api-token,
// else ENGINE_API_TOKEN.
func (g *global) apiClient() (*apiClient, error) {
	if g.schemaFlag != "" {
		// The server reads its own schema; a flag that changed nothing
		// would let an operator believe they were looking at another
		// installation.
		return nil, &usageError{fmt.Errorf("--schema names where the tables are in the database; over the HTTP API (%s) the server's own schema is used: drop --schema, or --address to work on the database", g.address())}
	}
	token := g.clientToken
	if token == "" {
		token = g.opts.Getenv("ENGINE_API_TOKEN")
	}
	g.apiToken = token // scrubbed from errors like a password
	return newAPIClient(g.address(), token)
}

// address is --address, else $ENGINE_ADDRESS unless --database-url is
// given ("" for the database): a flag on the command line wins over the
// environment.
func (g *global) address() string {
	if g.addressFlag != "" {
		return g.addressFlag
	}
	if g.databaseURL != "" {
		return ""
	}
	return g.opts.Getenv("ENGINE_ADDRESS")
}

// withClient runs fn with the command's client (see client).
func (g *global) withClient(fn func(ctx context.Context, e backend, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		e, done, err := g.client(cmd.Context())
		if err != nil {
			return err
		}
		defer done()
		return fn(cmd.Context(), e, args)
	}
}

// localOnly refuses --address for a command that works on the database
// itself (ENGINE_ADDRESS, set for a shell's operator commands, is
// ignored by these).
func (g *global) localOnly(command string) error {
	if g.addressFlag != "" {
		return &usageError{fmt.Errorf("engine %s works on the database, not over the HTTP API: drop --address", command)}
	}
	return nil
}

// version is the binary's module version and VCS revision, from the build
// info Go embeds.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += " " + rev + dirty
	}
	return v + " " + bi.GoVersion
}
