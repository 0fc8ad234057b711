// Command withcluster runs a command against a throwaway local Citus
// cluster: it starts a coordinator and 2 worker nodes on loopback (see
// package citus), runs the command with TEST_DATABASE_URL set to the
// coordinator's postgres database, stops the cluster and exits with the
// command's exit status. The README's test command runs the engine's and
// the CLI's tests this way:
//
//	go run ./internal/citus/withcluster go test -count=1 ./engine/ ./cmd/engine/commands/
//
// Since the cluster goes away with the command, each test binary reuses
// its finished tests' databases (localpg.ReuseTestDatabases): making one
// on every node costs most of a short test's time on a cluster.
//
// Without Citus installed it prints why and exits 0 without running the
// command, except under PGDURABLE_REQUIRE_CITUS=1 (CI, which builds Citus
// first), where it exits 1.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pgdurable/pgdurable/internal/citus"
	"github.com/pgdurable/pgdurable/internal/localpg"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: withcluster COMMAND [ARG...]")
		return 2
	}
	if !citus.Installed() {
		fmt.Fprintln(os.Stderr, "withcluster:", citus.ErrNotInstalled)
		if os.Getenv("PGDURABLE_REQUIRE_CITUS") == "1" {
			return 1
		}
		fmt.Fprintln(os.Stderr, "withcluster: not running", args)
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	c, err := citus.Start(startCtx, nil)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "withcluster: starting the cluster:", err)
		return 1
	}
	defer c.Stop()
	fmt.Fprintf(os.Stderr, "withcluster: Citus coordinator on port %d, worker nodes on %d and %d\n",
		c.Coordinator.Port, c.Workers[0].Port, c.Workers[1].Port)
	return localpg.RunWith(ctx, []string{"TEST_DATABASE_URL=" + c.URL(), localpg.ReuseTestDatabases}, args)
}
