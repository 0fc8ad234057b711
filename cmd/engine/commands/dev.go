package commands

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
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
			fmt.Fprintf(g.opts.Stderr, "engine dev: database %s\n", redact(g.dbURL()))
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
		if url, err := ensureDatabase(ctx, DefaultDatabaseURL, "pgdurable_dev"); err == nil {
			return url, func() {}, nil
		}
	}
	pg, err := startThrowaway(ctx)
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintf(g.opts.Stderr, "engine dev: started a throwaway PostgreSQL in %s (removed on exit)\n", pg.dir)
	return pg.url, pg.stop, nil
}

type throwawayPG struct {
	dir, url string
	pgctl    string
	cred     *syscall.Credential
}

// findPostgresBin looks for name on PATH, then in the newest
// /usr/lib/postgresql/*/bin.
func findPostgresBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no %s on PATH or under /usr/lib/postgresql/*/bin: install PostgreSQL or set DATABASE_URL", name)
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// startThrowaway initialises and starts a PostgreSQL server on a free
// loopback port in a temporary directory. PostgreSQL refuses to run as
// root, so as root it runs as the postgres user (or nobody).
func startThrowaway(ctx context.Context) (*throwawayPG, error) {
	initdb, err := findPostgresBin("initdb")
	if err != nil {
		return nil, err
	}
	pgctl, err := findPostgresBin("pg_ctl")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgdurable-dev-")
	if err != nil {
		return nil, err
	}
	pg := &throwawayPG{dir: dir, pgctl: pgctl}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, errors.New("running as root and no postgres or nobody user to run PostgreSQL as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		pg.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	port, err := freeLoopbackPort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if out, err := pg.run(ctx, initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		pg.stop()
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", port, dir)
	if out, err := pg.run(ctx, pgctl, "-D", data, "-o", opts, "-l", filepath.Join(dir, "postgres.log"), "-w", "start"); err != nil {
		pg.stop()
		return nil, fmt.Errorf("pg_ctl start: %w\n%s", err, out)
	}
	pg.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return pg, nil
}

func (pg *throwawayPG) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	if pg.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: pg.cred}
	}
	cmd.Dir = pg.dir
	return cmd.CombinedOutput()
}

// stop shuts the server down and removes its directory.
func (pg *throwawayPG) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, _ = pg.run(ctx, pg.pgctl, "-D", filepath.Join(pg.dir, "data"), "-m", "fast", "-w", "stop")
	_ = os.RemoveAll(pg.dir)
}

func freeLoopbackPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
