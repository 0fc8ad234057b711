package commands

import (
	"context"
	"io"
	"os"
	"os/exec"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Env is what the commands of Options.Commands share with the built-in
// ones: the streams and environment of Options, and the global flags,
// whose values its methods read when the command runs (not when it is
// built). One Env serves one Execute or NewRoot.
type Env struct{ g *global }

// Stdout is where a command prints its output: Options.Stdout (default
// os.Stdout).
func (e *Env) Stdout() io.Writer { return e.g.opts.Stdout }

// Stderr is where a command prints logs and notes for people:
// Options.Stderr (default os.Stderr).
func (e *Env) Stderr() io.Writer { return e.g.opts.Stderr }

// Getenv reads an environment variable through Options.Getenv (default
// os.Getenv).
func (e *Env) Getenv(key string) string { return e.g.opts.Getenv(key) }

// DatabaseURL is the database the command works on: --database-url (or
// what SetDatabaseURL set), else $DATABASE_URL, else DefaultDatabaseURL,
// with a URL's scheme lower-cased. It may hold a password: Execute scrubs
// it from the errors a command returns, but not from what the command
// prints itself.
func (e *Env) DatabaseURL() string { return e.g.dbURL() }

// Schema is the PostgreSQL schema of pgdurable's tables the commands use:
// --schema, else $ENGINE_SCHEMA, else Options.Config.Schema, else
// engine.DefaultSchema. Pass it as engine.Config.Schema and
// migrations.Opts.Schema.
func (e *Env) Schema() string { return e.g.schema() }

// DatabaseFlag is --database-url as given, or what SetDatabaseURL set; ""
// when neither (the database then comes from $DATABASE_URL or the
// default).
func (e *Env) DatabaseFlag() string { return e.g.databaseURL }

// SetDatabaseURL points the rest of the command at url as if it had been
// given with --database-url: DatabaseURL, DatabaseFlag, Pool and the
// scrubbing of the password from errors use it. engine demo uses it for
// the database it creates, or starts, when none is named.
func (e *Env) SetDatabaseURL(url string) { e.g.databaseURL = url }

// Pool connects to DatabaseURL with at most size connections (0: pgx's
// default) and pings it, within 10 s in all; the caller closes the pool.
// Errors: a usage error for a URL with more than one @ before its query
// (its parsers disagree on where the password ends), "parsing the
// database URL: ...", or "connecting to PostgreSQL at <the URL without its
// password>: ...".
func (e *Env) Pool(ctx context.Context, size int32) (*pgxpool.Pool, error) {
	return e.g.pool(ctx, size)
}

// OwnDatabase is for a command that fills its database with tables, runs
// and jobs (engine bench, engine chaos): nil when the database was named
// with --database-url or $DATABASE_URL, otherwise a usage error asking
// for a database of its own, so that a forgotten flag cannot fill the
// server's postgres database. command names it in the message.
func (e *Env) OwnDatabase(command string) error { return e.g.ownDatabase(command) }

// ServeCommand returns the command that runs this binary as
// `engine <args>` in a child process (engine chaos starts its engines so),
// not yet started: Options.ServeCommand(args...) when it is set, else this
// executable (os.Executable, else os.Args[0]) with args.
func (e *Env) ServeCommand(args ...string) *exec.Cmd {
	if e.g.opts.ServeCommand != nil {
		return e.g.opts.ServeCommand(args...)
	}
	self, err := os.Executable()
	if err != nil {
		self = os.Args[0]
	}
	return exec.Command(self, args...)
}

// UsageError marks err as a misuse of the command line (a flag value out
// of range, a listen address not allowed): Execute prints err's message
// and exits 2 instead of 1, and with --json reports the code "usage".
func UsageError(err error) error { return &usageError{err} }

// Invocation is how a person runs this binary, for the commands a command
// prints for them to try ("<Invocation> runs show <id>"): Options.Invocation
// when set; else "go run <package>" when the binary runs from go run's build
// cache ("go run ./cmd/engine" from its module's root, the import path
// elsewhere); else os.Args[0] as it was typed ("./bin/engine", "engine").
func (e *Env) Invocation() string { return e.g.invocation() }
