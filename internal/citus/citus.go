// Package citus starts a local Citus cluster for development and tests: a
// coordinator and worker nodes, each a throwaway PostgreSQL with Citus
// preloaded, on loopback ports, the workers registered with the
// coordinator. It needs Citus installed into the local PostgreSQL (its
// citus.so in pg_config --pkglibdir); .ci/build-citus builds it from
// source where no package has it.
package citus

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/internal/localpg"
)

// ErrNotInstalled is Start's error when no local PostgreSQL has Citus.
var ErrNotInstalled = errors.New("citus: Citus is not installed into the local PostgreSQL (no citus.so under /usr/lib/postgresql/*/lib); " +
	"install it from Citus's packages, or build it with .ci/build-citus")

// Installed reports whether the newest local PostgreSQL (the one a
// throwaway server starts from) has Citus.
func Installed() bool {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/lib")
	if len(dirs) == 0 {
		return false
	}
	major := func(d string) int { v, _ := strconv.Atoi(filepath.Base(filepath.Dir(d))); return v }
	sort.Slice(dirs, func(i, j int) bool { return major(dirs[i]) > major(dirs[j]) })
	if p, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(p, "--pkglibdir").Output(); err == nil {
			if _, err := os.Stat(filepath.Join(strings.TrimSpace(string(out)), "citus.so")); err == nil {
				return true
			}
		}
	}
	_, err := os.Stat(filepath.Join(dirs[0], "citus.so"))
	return err == nil
}

// Cluster is a running local cluster.
type Cluster struct {
	Coordinator *localpg.Throwaway
	Workers     []*localpg.Throwaway
}

// Opts sizes a cluster.
type Opts struct {
	// Workers is the number of worker nodes; default 2.
	Workers int
	// Durable keeps fsync on (benchmarks); else it is off.
	Durable bool
}

// settings every node gets: Citus preloaded (first, as it requires),
// pg_stat_statements to count each node's statements, prepared
// transactions for Citus's two-phase commits, and connections for the
// coordinator's to each worker.
var settings = []string{
	"shared_preload_libraries=citus,pg_stat_statements",
	"max_prepared_transactions=200",
	"max_connections=300",
	// Citus runs a maintenance process per database that has it: a test
	// suite pointed at the cluster makes many databases at once.
	"max_worker_processes=64",
	"wal_level=logical", // shard moves (rebalancing) use logical replication
	// Loopback with trust: the nodes talk to each other without TLS.
	"citus.node_conninfo=sslmode=disable",
	// A test suite on a throwaway cluster opens and closes connections
	// all the time, each one a new backend on the coordinator and often
	// on a worker node; short-lived backends took most of a 2-core
	// machine, over half of it in the kernel. Fewer connections to the
	// workers closed after each transaction and fewer shared buffers to
	// map: the engine's tests took 282 s on a cluster with these two
	// settings against 321 with the defaults (one run each, 6 December
	// 2026).
	"citus.max_cached_conns_per_worker=8",
	"shared_buffers=32MB",
}

// Start initialises and starts the coordinator and opts.Workers worker
// nodes, creates the citus extension in each one's postgres database and
// registers the workers; Stop removes it all. ErrNotInstalled when Citus
// is not installed.
func Start(ctx context.Context, opts *Opts) (c *Cluster, err error) {
	if opts == nil {
		opts = &Opts{}
	}
	if opts.Workers <= 0 {
		opts.Workers = 2
	}
	if !Installed() {
		return nil, ErrNotInstalled
	}
	c = &Cluster{}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	start := func() (*localpg.Throwaway, error) {
		pg, err := localpg.StartThrowawayWith(ctx, &localpg.ThrowawayOpts{Settings: settings, Durable: opts.Durable})
		if err != nil {
			return nil, err
		}
		if err := exec1(ctx, pg.URL, `CREATE EXTENSION IF NOT EXISTS citus`); err != nil {
			return pg, err
		}
		return pg, exec1(ctx, pg.URL, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	}
	if c.Coordinator, err = start(); err != nil {
		return c, fmt.Errorf("starting the coordinator: %w", err)
	}
	for i := range opts.Workers {
		w, err := start()
		if w != nil {
			c.Workers = append(c.Workers, w)
		}
		if err != nil {
			return c, fmt.Errorf("starting worker node %d: %w", i+1, err)
		}
	}
	if err := exec1(ctx, c.Coordinator.URL, `SELECT citus_set_coordinator_host('127.0.0.1', $1)`, c.Coordinator.Port); err != nil {
		return c, err
	}
	for _, w := range c.Workers {
		if err := exec1(ctx, c.Coordinator.URL, `SELECT citus_add_node('127.0.0.1', $1)`, w.Port); err != nil {
			return c, err
		}
	}
	return c, nil
}

// URL is the coordinator's postgres database: what the engine, the CLI
// and the tests connect to.
func (c *Cluster) URL() string { return c.Coordinator.URL }

// Stop stops every node and removes their directories.
func (c *Cluster) Stop() {
	for _, w := range c.Workers {
		w.Stop()
	}
	if c.Coordinator != nil {
		c.Coordinator.Stop()
	}
}

func exec1(ctx context.Context, url, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// NodeWork is what pg_stat_statements counted on one node of a cluster
// since ResetStatements: the calls and rows of the statements that name
// one of the engine's per-run tables (on a worker node, its shards of
// them), of Citus's and PostgreSQL's transaction control (BEGIN, COMMIT,
// two-phase commit, Citus's distributed transaction IDs), and of the
// rest (on the coordinator: River's tables and the engine's others).
type NodeWork struct {
	Node                  string // host:port
	RunCalls, RunRows     int64
	ControlCalls          int64
	OtherCalls, OtherRows int64
	// Prepared counts the PREPARE TRANSACTIONs among ControlCalls: the
	// first phase of each two-phase commit that wrote on this node.
	Prepared int64
}

// ResetStatements empties pg_stat_statements on every node (creating the
// extension where missing: on the coordinator, which Citus propagates to
// the worker nodes): what Work reads counts from here.
func (c *Cluster) ResetStatements(ctx context.Context) error {
	if err := exec1(ctx, c.Coordinator.URL, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return err
	}
	for _, n := range c.nodes() {
		if err := exec1(ctx, n.URL, `SELECT pg_stat_statements_reset()`); err != nil {
			return err
		}
	}
	return nil
}

// Work reads each node's NodeWork, the coordinator's first.
func (c *Cluster) Work(ctx context.Context) ([]NodeWork, error) {
	var out []NodeWork
	for _, n := range c.nodes() {
		w := NodeWork{Node: fmt.Sprintf("127.0.0.1:%d", n.Port)}
		conn, err := pgx.Connect(ctx, n.URL)
		if err != nil {
			return nil, err
		}
		err = conn.QueryRow(ctx, `
WITH s AS (
    SELECT query, calls, rows,
           query ~* '(workflow_runs|workflow_steps|workflow_signals|dead_jobs)' AS run,
           query ~* '^\s*(begin|commit|rollback|prepare transaction|commit prepared|rollback prepared|savepoint|release|set |select assign_distributed_transaction_id|select set_config)' AS control
    FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND query !~* 'pg_stat_statements'
)
SELECT coalesce(sum(calls) FILTER (WHERE run AND NOT control), 0), coalesce(sum(rows) FILTER (WHERE run AND NOT control), 0),
       coalesce(sum(calls) FILTER (WHERE control), 0),
       coalesce(sum(calls) FILTER (WHERE NOT run AND NOT control), 0), coalesce(sum(rows) FILTER (WHERE NOT run AND NOT control), 0),
       coalesce(sum(calls) FILTER (WHERE query ~* '^\s*prepare transaction'), 0)
FROM s`).Scan(&w.RunCalls, &w.RunRows, &w.ControlCalls, &w.OtherCalls, &w.OtherRows, &w.Prepared)
		conn.Close(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the statements of node %s: %w", w.Node, err)
		}
		out = append(out, w)
	}
	return out, nil
}

// nodes are the coordinator and the worker nodes, in that order.
func (c *Cluster) nodes() []*localpg.Throwaway {
	return append([]*localpg.Throwaway{c.Coordinator}, c.Workers...)
}
