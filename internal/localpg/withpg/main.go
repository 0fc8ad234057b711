// Command withpg runs a command against a throwaway local PostgreSQL: it
// initialises and starts a server on a free loopback port in a temporary
// directory, runs the command with TEST_DATABASE_URL set to the server's
// postgres database, stops the server (removing its directory) and exits
// with the command's exit status. The README's test command runs its
// plain-PostgreSQL passes this way:
//
//	go run ./internal/localpg/withpg go test -trimpath -race -count=1 ./...
//
// Why a server of its own: with 4 tests at once in each of 2 packages at
// once, the tests' pools (each test's database, its engines and its child
// processes) need more connections than a default server allows (100);
// this one allows 300 (max_connections). It runs with fsync off, like
// every throwaway server here: the tests' crashes kill processes, not the
// machine's power. Nothing is left on the machine's own server. Since the
// server goes away with the command, each test binary reuses its finished
// tests' databases (localpg.ReuseTestDatabases): emptying one costs less
// than making one.
//
// It needs PostgreSQL's server programs (initdb and pg_ctl, on PATH or in
// /usr/lib/postgresql/*/bin). Without them it says so and runs the command
// with TEST_DATABASE_URL as it was, when it is set: that server then needs
// room for the connections, or the command fewer tests at once; when it
// is not set, it exits 1. Any other failure to start the server exits 1
// without running the command. Its exit status is the command's (128 plus
// the signal's number when a signal ended it); on SIGINT or SIGTERM the
// command's whole process group gets SIGINT (see localpg.RunWith) before
// the server stops.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pgdurable/pgdurable/internal/localpg"
)

// maxConnections is the throwaway server's max_connections: 4 tests at
// once in each of 2 packages, with up to about 35 connections each (a
// test's pool of 20, its engines' and child processes' own), and room for
// the packages that start several engines per test.
const maxConnections = 300

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: withpg COMMAND [ARG...]")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	pg, err := localpg.StartThrowawayWith(startCtx, &localpg.ThrowawayOpts{
		Settings: []string{fmt.Sprintf("max_connections=%d", maxConnections)},
	})
	cancel()
	switch {
	case errors.Is(err, localpg.ErrNoServerPrograms) && os.Getenv("TEST_DATABASE_URL") != "":
		fmt.Fprintln(os.Stderr, "withpg:", err)
		fmt.Fprintf(os.Stderr, "withpg: running %v against TEST_DATABASE_URL as set (%s)\n",
			args, localpg.Redact(os.Getenv("TEST_DATABASE_URL")))
		return localpg.RunWith(ctx, nil, args)
	case err != nil && ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "withpg: interrupted while starting PostgreSQL; not running", args)
		return 1
	case errors.Is(err, localpg.ErrNoServerPrograms):
		fmt.Fprintln(os.Stderr, "withpg:", err)
		fmt.Fprintln(os.Stderr, "withpg: and TEST_DATABASE_URL is not set: nothing to run", args, "against")
		return 1
	case err != nil:
		fmt.Fprintln(os.Stderr, "withpg: starting a throwaway PostgreSQL:", err)
		return 1
	}
	defer pg.Stop()
	fmt.Fprintf(os.Stderr, "withpg: PostgreSQL on port %d (max_connections=%d)\n", pg.Port, maxConnections)
	return localpg.RunWith(ctx, []string{"TEST_DATABASE_URL=" + pg.URL, localpg.ReuseTestDatabases}, args)
}
