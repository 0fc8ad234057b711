// Package localpg is what the engine's two command packages (commands and
// paymentcmd) share about this machine: a database found or created on the
// local PostgreSQL, a throwaway PostgreSQL (engine dev, engine demo),
// loopback addresses and free ports, and connection strings made fit to
// print.
package localpg

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnsureDatabase creates database name on the server at base if missing
// and returns its URL (base with its path replaced).
func EnsureDatabase(ctx context.Context, base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connecting to PostgreSQL at %s: %w", Redact(base), err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return "", fmt.Errorf("creating database %s: %w", name, err)
		}
	}
	u.Path = "/" + name
	return u.String(), nil
}

// Throwaway is a PostgreSQL server started by StartThrowaway.
type Throwaway struct {
	Dir  string // its temporary directory (data, socket, log), removed by Stop
	URL  string // its postgres database, as user postgres without a password
	Port int    // its loopback port
	// pgctl is pg_ctl's path; cred the user it runs as (nil: this one);
	// options the server's command-line options.
	pgctl   string
	cred    *syscall.Credential
	options string
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
	return "", fmt.Errorf("%w: no %s on PATH or under /usr/lib/postgresql/*/bin: install PostgreSQL or set DATABASE_URL", ErrNoServerPrograms, name)
}

// ErrNoServerPrograms is StartThrowaway's error when PostgreSQL's server
// programs (initdb, pg_ctl) are not installed.
var ErrNoServerPrograms = errors.New("PostgreSQL's server programs are not installed")

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// StartThrowaway initialises and starts a PostgreSQL server on a free
// loopback port in a temporary directory, without fsync. PostgreSQL
// refuses to run as root, so as root it runs as the postgres user (or
// nobody).
func StartThrowaway(ctx context.Context) (*Throwaway, error) {
	return StartThrowawayWith(ctx, nil)
}

// ThrowawayOpts adds to what StartThrowaway starts.
type ThrowawayOpts struct {
	// Settings are server settings, as name=value, each passed as -c
	// (shared_preload_libraries=citus, max_prepared_transactions=100).
	Settings []string
	// Durable keeps fsync on (benchmarks); else it is off (tests, dev).
	Durable bool
}

// StartThrowawayWith is StartThrowaway with opts (nil: none).
func StartThrowawayWith(ctx context.Context, opts *ThrowawayOpts) (*Throwaway, error) {
	if opts == nil {
		opts = &ThrowawayOpts{}
	}
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
	pg := &Throwaway{Dir: dir, pgctl: pgctl}
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
	port, err := FreeLoopbackPort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if out, err := pg.run(ctx, initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		pg.Stop()
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	pg.Port = port
	pg.options = fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", port, dir)
	if !opts.Durable {
		pg.options += " -c fsync=off"
	}
	for _, kv := range opts.Settings {
		if strings.ContainsAny(kv, " '\"\\") || !strings.Contains(kv, "=") {
			pg.Stop()
			return nil, fmt.Errorf("setting %q: want name=value without spaces or quotes", kv)
		}
		pg.options += " -c " + kv
	}
	if err := pg.Start(ctx); err != nil {
		pg.Stop()
		return nil, err
	}
	pg.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return pg, nil
}

// Start starts the server on its port and data, and waits until it
// accepts connections.
func (pg *Throwaway) Start(ctx context.Context) error {
	data := filepath.Join(pg.Dir, "data")
	if out, err := pg.run(ctx, pg.pgctl, "-D", data, "-o", pg.options, "-l", filepath.Join(pg.Dir, "postgres.log"), "-w", "start"); err != nil {
		return fmt.Errorf("pg_ctl start: %w\n%s", err, out)
	}
	return nil
}

func (pg *Throwaway) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	if pg.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: pg.cred}
		// Not root's home: the server's own connections (Citus's to
		// other nodes) read ~/.postgresql, which the user cannot.
		cmd.Env = append(os.Environ(), "HOME="+pg.Dir)
	}
	cmd.Dir = pg.Dir
	return cmd.CombinedOutput()
}

// Crash SIGKILLs the server's postmaster, as a machine that loses power
// would stop it (its backends end when they see it gone), and starts it
// again on the same data, which it recovers from the WAL: what it had
// committed stays, what was in flight is lost. It retries the start for up
// to 20 s while the dead server's backends still hold its shared memory.
func (pg *Throwaway) Crash(ctx context.Context) error {
	raw, err := os.ReadFile(filepath.Join(pg.Dir, "data", "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("reading the server's pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0]))
	if err != nil {
		return fmt.Errorf("reading the server's pid: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing the server (pid %d): %w", pid, err)
	}
	for gone := time.Now().Add(10 * time.Second); alive(pid) && time.Now().Before(gone); {
		time.Sleep(50 * time.Millisecond)
	}
	// Where nothing reaps the dead postmaster, its zombie keeps its pid,
	// and the new server would take the lock file for a live one's.
	if !alive(pid) {
		_ = os.Remove(filepath.Join(pg.Dir, "data", "postmaster.pid"))
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		err = pg.Start(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// alive reports whether process pid runs: it exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name's closing parenthesis.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// Stop shuts the server down (fast mode, up to 20 s) and removes its
// directory.
func (pg *Throwaway) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, _ = pg.run(ctx, pg.pgctl, "-D", filepath.Join(pg.Dir, "data"), "-m", "fast", "-w", "stop")
	_ = os.RemoveAll(pg.Dir)
}
