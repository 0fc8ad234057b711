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
	"wal_level=logical", // shard moves (rebalancing) use logical replication
	// Loopback with trust: the nodes talk to each other without TLS.
	"citus.node_conninfo=sslmode=disable",
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
