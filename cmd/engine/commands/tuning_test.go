package commands_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// serveInProcess runs `engine serve` (with args) on db with opts and the
// environment env, in-process, until the test ends; it returns the listen
// address and serve's stderr once it answers /healthz.
func serveInProcess(t *testing.T, db *enginetest.DB, opts commands.Options, env map[string]string, args ...string) (string, *syncBuffer) {
	t.Helper()
	return serveOn(t, freePort(t), db, opts, env, args...)
}

// serveOn is serveInProcess listening on listen.
func serveOn(t *testing.T, listen string, db *enginetest.DB, opts commands.Options, env map[string]string, args ...string) (string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errOut := &syncBuffer{}
	opts.Stdout, opts.Stderr = &bytes.Buffer{}, errOut
	opts.Getenv = func(k string) string { return env[k] }
	done := make(chan int, 1)
	go func() {
		done <- commands.Execute(ctx, append([]string{"--database-url", db.URL, "serve", "--listen", listen, "--log-level", "info"}, args...), opts)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		if resp, err := http.Get("http://" + listen + "/healthz"); err == nil {
			resp.Body.Close()
			return listen, errOut
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d: %s", code, errOut.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "serve never listened: %s", errOut.String())
		time.Sleep(50 * time.Millisecond)
	}
}

// insertEnded inserts a completed run of workflow "double" created and
// ended ago (its run ID a UUID v7 of that time, as the engine's are).
func insertEnded(t *testing.T, db *enginetest.DB, workflowID string, ago time.Duration) {
	t.Helper()
	id, err := uuid.NewV7()
	require.NoError(t, err)
	ms := uint64(time.Now().Add(-ago).UnixMilli())
	for i := range 6 {
		id[i] = byte(ms >> (40 - 8*i))
	}
	_, err = db.Pool.Exec(context.Background(), db.SQL(`
INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input, created_at, completed_at)
VALUES ($1, 'double', $2, 'completed', '1', now() - $3 * interval '1 second', now() - $3 * interval '1 second')`), id, workflowID, ago.Seconds())
	require.NoError(t, err)
}

func runExists(t *testing.T, db *enginetest.DB, workflowID string) bool {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE workflow_id = $1`), workflowID).Scan(&n))
	return n > 0
}

// serve's retention comes from --retention, else ENGINE_RETENTION, else
// Options.Config.Retention, else the engine's 7 days: each serve prunes at
// once with the retention it resolved, which the runs it keeps and deletes
// show.
func TestServeRetentionFromFlagEnvAndOptionsConfig(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		config    *engine.Config
		env       map[string]string
		args      []string
		kept, cut []time.Duration // ended this long ago
	}{
		{"options config", &engine.Config{Retention: 3 * time.Hour}, nil, nil,
			[]time.Duration{2 * time.Hour}, []time.Duration{4 * time.Hour}},
		{"env over options config", &engine.Config{Retention: time.Hour}, map[string]string{"ENGINE_RETENTION": "3h"}, nil,
			[]time.Duration{2 * time.Hour}, []time.Duration{4 * time.Hour}},
		{"flag over env", nil, map[string]string{"ENGINE_RETENTION": "3h"}, []string{"--retention", "90m"},
			[]time.Duration{time.Hour}, []time.Duration{2 * time.Hour}},
		{"default", nil, nil, nil,
			[]time.Duration{6 * 24 * time.Hour}, []time.Duration{8 * 24 * time.Hour}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := enginetest.NewDB(t)
			id := func(prefix string, d time.Duration) string { return prefix + d.String() }
			for _, d := range c.kept {
				insertEnded(t, db, id("kept-", d), d)
			}
			for _, d := range c.cut {
				insertEnded(t, db, id("cut-", d), d)
			}
			_, errOut := serveInProcess(t, db, commands.Options{Workflows: workflows(), Config: c.config}, c.env, c.args...)
			deadline := time.Now().Add(30 * time.Second)
			for _, d := range c.cut {
				for runExists(t, db, id("cut-", d)) {
					require.True(t, time.Now().Before(deadline), "the run that ended %s ago was never pruned: %s", d, errOut.String())
					time.Sleep(50 * time.Millisecond)
				}
			}
			for _, d := range c.kept {
				require.True(t, runExists(t, db, id("kept-", d)), "the run that ended %s ago is kept", d)
			}
		})
	}
}

// serve takes --lease-duration, --heartbeat-interval, --max-workers and
// --max-deliveries, or their ENGINE_* variables, over Options.Config, and
// logs what it runs with.
func TestServeEngineSettingsFromFlagsAndEnv(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	_, errOut := serveInProcess(t, db, commands.Options{Workflows: workflows(), Config: &engine.Config{LeaseDuration: 30 * time.Second, MaxWorkers: 7}},
		map[string]string{"ENGINE_LEASE_DURATION": "4s", "ENGINE_MAX_DELIVERIES": "3", "ENGINE_VERSION_WAIT_ALERT": "30m"}, "--heartbeat-interval", "1s", "--retention", "forever")
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(errOut.String(), `"engine serving"`); {
		require.True(t, time.Now().Before(deadline), errOut.String())
		time.Sleep(20 * time.Millisecond)
	}
	require.Contains(t, errOut.String(), `"max_workers":7,"lease_duration":"4s","heartbeat_interval":"1s","max_deliveries":3,"retention":"forever"`)
	require.Contains(t, errOut.String(), `"version_wait_alert":"30m0s"`)
}

// Bad engine settings are usage errors that say which flag or variable
// holds what, and where the other side of a conflict came from.
func TestServeRefusesBadEngineSettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		config *engine.Config
		env    map[string]string
		args   []string
		want   string
	}{
		{nil, nil, []string{"--heartbeat-interval", "10s"},
			"the heartbeat interval 10s (--heartbeat-interval) must be below the lease duration 10s (the default)"},
		{nil, map[string]string{"ENGINE_LEASE_DURATION": "5s"}, []string{"--heartbeat-interval", "6s"},
			"the heartbeat interval 6s (--heartbeat-interval) must be below the lease duration 5s (ENGINE_LEASE_DURATION)"},
		{&engine.Config{HeartbeatInterval: 3 * time.Second}, nil, []string{"--lease-duration", "2s"},
			"the heartbeat interval 3s (Options.Config) must be below the lease duration 2s (--lease-duration)"},
		{nil, nil, []string{"--lease-duration", "500ms"}, "--lease-duration: the lease duration 500ms is below the 1s minimum"},
		{nil, nil, []string{"--heartbeat-interval", "0s"}, "--heartbeat-interval: the heartbeat interval must be above 0, not 0s"},
		{nil, nil, []string{"--retention", "0"}, `invalid argument "0" for "--retention" flag: "0" is neither a duration above 0 (720h, 168h30m) nor "forever"`},
		{nil, map[string]string{"ENGINE_RETENTION": "a week"}, nil, `ENGINE_RETENTION: "a week" is neither a duration above 0`},
		{nil, map[string]string{"ENGINE_RETENTION": "1ns"}, nil, `ENGINE_RETENTION: 1ns is below the 1m0s minimum (or "forever")`},
		{nil, map[string]string{"ENGINE_MAX_WORKERS": "lots"}, nil, `ENGINE_MAX_WORKERS: "lots" is not a whole number`},
		{nil, nil, []string{"--max-deliveries", "0"}, "--max-deliveries: max deliveries must be at least 1, not 0"},
		{nil, map[string]string{"ENGINE_MAX_WORKERS": "100000000"}, nil, "ENGINE_MAX_WORKERS: max workers must be at most 10000 (River's limit per queue), not 100000000"},
		{nil, map[string]string{"ENGINE_HEARTBEAT_INTERVAL": "soon"}, nil, `ENGINE_HEARTBEAT_INTERVAL: "soon" is not a duration such as 3s`},
		{nil, map[string]string{"ENGINE_VERSION_WAIT_ALERT": "later"}, nil, `ENGINE_VERSION_WAIT_ALERT: "later" is not a duration such as 10m`},
		{nil, nil, []string{"--version-wait-alert", "0s"}, "--version-wait-alert: the version wait alert must be a duration above 0 (10m), or negative for never"},
	} {
		var errOut bytes.Buffer
		code := commands.Execute(context.Background(), append([]string{"serve", "--listen", "127.0.0.1:0"}, c.args...), commands.Options{
			Config: c.config, Stdout: &bytes.Buffer{}, Stderr: &errOut, Getenv: func(k string) string { return c.env[k] }})
		require.Equal(t, 2, code, "%v %v: %s", c.args, c.env, errOut.String())
		require.Contains(t, errOut.String(), c.want, "%v %v", c.args, c.env)
	}
}

// serve --help shows every engine setting with its variable, its unit and
// its default: the engine's, or the binary's own from Options.Config.
func TestServeHelpShowsEngineSettings(t *testing.T) {
	t.Parallel()
	help := func(cfg *engine.Config) string {
		var out bytes.Buffer
		require.Equal(t, 0, commands.Execute(context.Background(), []string{"serve", "--help"},
			commands.Options{Config: cfg, Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}))
		return out.String()
	}
	out := help(nil)
	for _, want := range []string{
		`--retention duration`, `"forever" (env ENGINE_RETENTION) (default 168h0m0s)`,
		`--lease-duration duration`, `(env ENGINE_LEASE_DURATION) (default 10s)`,
		`--heartbeat-interval duration`, `(env ENGINE_HEARTBEAT_INTERVAL) (default a third of --lease-duration)`,
		`--max-workers int`, `(env ENGINE_MAX_WORKERS) (default 100)`,
		`--max-deliveries int`, `(env ENGINE_MAX_DELIVERIES) (default 10)`,
		`--version-wait-alert duration`, `(env ENGINE_VERSION_WAIT_ALERT) (default 10m0s)`,
	} {
		require.Contains(t, out, want)
	}
	out = help(&engine.Config{Retention: -1, LeaseDuration: 30 * time.Second, HeartbeatInterval: 5 * time.Second, MaxWorkers: 8, MaxDeliveries: 4})
	for _, want := range []string{`(env ENGINE_RETENTION) (default forever)`, `(env ENGINE_LEASE_DURATION) (default 30s)`,
		`(env ENGINE_HEARTBEAT_INTERVAL) (default 5s)`, `(env ENGINE_MAX_WORKERS) (default 8)`, `(env ENGINE_MAX_DELIVERIES) (default 4)`} {
		require.Contains(t, out, want)
	}
}
