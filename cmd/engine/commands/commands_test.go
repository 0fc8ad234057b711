package commands_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/cmd/engine/internal/paymentcmd"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/examples/payment"
)

func TestMain(m *testing.M) {
	if os.Getenv(envServeChild) != "" {
		os.Exit(serveChild())
	}
	goleak.VerifyTestMain(m)
}

type in struct {
	N int `json:"n"`
}

func workflows() []engine.Registration {
	return []engine.Registration{
		engine.Define("double", func(ctx *engine.Context, in in) (int, error) {
			return engine.Step(ctx, "double", func(context.Context) (int, error) {
				if in.N < 0 {
					return 0, errors.New("negative: upstream refused")
				}
				return in.N * 2, nil
			}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 2}})
		}, nil),
		engine.Define("hostile", func(ctx *engine.Context, _ in) (int, error) {
			return engine.Step(ctx, "hostile", func(context.Context) (int, error) {
				return 0, engine.Permanent(errors.New(hostileText))
			}, nil)
		}, nil),
		engine.Define("approval", func(ctx *engine.Context, _ in) (string, error) {
			a, err := engine.AwaitSignal[struct {
				By string `json:"by"`
			}](ctx, "approve", 0)
			return a.By, err
		}, nil),
	}
}

// hostileText carries terminal escapes (a color, a window title, an 8-bit
// CSI) of the kind a step's error message may hold.
const hostileText = "boom \x1b[31mred\x1b]0;owned\x07 \u009b2J done"

// withPayment adds what cmd/engine/main.go adds: the payment example's
// commands (demo, gateway, chaos) and bench row.
func withPayment(o commands.Options) commands.Options {
	o.Commands = append(o.Commands, paymentcmd.Commands()...)
	o.BenchRows = append(o.BenchRows, paymentcmd.BenchRow)
	return o
}

// run executes the CLI in-process, with the shipped binary's commands, and
// returns its exit code and output.
func run(t *testing.T, db *enginetest.DB, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := commands.Execute(context.Background(), append([]string{"--database-url", db.URL}, args...), withPayment(commands.Options{
		Workflows: workflows(), Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" },
	}))
	return code, out.String(), errOut.String()
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func TestCLIRunsAndDeadJobs(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, out, _ := run(t, db, "migrate", "status")
	require.Equal(t, 0, code)
	require.Regexp(t, `00001_runs.sql\s+true`, out)
	require.Regexp(t, `00002_signals.sql\s+true`, out)
	require.Regexp(t, `00003_schedules.sql\s+true`, out)

	code, out, _ = run(t, db, "start", "double", "--id", "d-1", "--input", `{"n": 21}`)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "started")
	code, out, _ = run(t, db, "start", "double", "--id", "d-1", "--input", `{"n": 21}`)
	require.Equal(t, 0, code)
	require.Contains(t, out, "already exists")
	code, _, errOut := run(t, db, "start", "double", "--id", "d-1", "--input", `{"n": 22}`)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "workflow ID already used")
	code, _, errOut = run(t, db, "start", "double", "--input", `{"n":`)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "not valid JSON")
	require.Contains(t, errOut, "unexpected end of JSON input at byte offset 5")
	code, _, errOut = run(t, db, "start", "double", "--input", `{"n": tru}`)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `--input is not valid JSON: invalid character '}' in literal true (expecting 'e') at byte offset 10`,
		"where the input breaks")
	require.NotContains(t, errOut, `{"n": tru}`, "the input itself is not echoed: it may hold what no log should")
	code, _, errOut = run(t, db, "start", "nope", "--input", `{}`)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "unknown workflow")
	require.Contains(t, errOut, "start it through an engine that registers it: --address host:port (or ENGINE_ADDRESS)")
	_, _, _ = run(t, db, "start", "double", "--id", "d-neg", "--input", `{"n": -1}`)

	// A worker: engine serve in-process, stopped by cancelling its context.
	ctx, cancel := context.WithCancel(context.Background())
	listen := freePort(t)
	served := make(chan int, 1)
	var serveErr bytes.Buffer
	go func() {
		served <- commands.Execute(ctx, []string{"--database-url", db.URL, "serve", "--listen", listen, "--shutdown-timeout", "5s"},
			commands.Options{Workflows: workflows(), Stdout: &bytes.Buffer{}, Stderr: &serveErr, Getenv: func(string) string { return "" }})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, out, _ = run(t, db, "runs", "list", "--json")
		var page struct{ Runs []engine.Run }
		require.NoError(t, json.Unmarshal([]byte(out), &page))
		done := 0
		for _, r := range page.Runs {
			if r.Status == engine.StatusCompleted || r.Status == engine.StatusDead {
				done++
			}
		}
		if done == 2 {
			break
		}
		require.True(t, time.Now().Before(deadline), "runs did not finish: %s", out)
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Get("http://" + listen + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	cancel()
	select {
	case code := <-served:
		require.Equal(t, 0, code, serveErr.String())
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
	require.Contains(t, serveErr.String(), `"msg":"stopped"`)

	code, out, _ = run(t, db, "runs", "list", "--status", "completed")
	require.Equal(t, 0, code)
	require.Contains(t, out, "d-1")
	require.Contains(t, out, "RUN ID")
	var runID string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "d-1") {
			runID = strings.Fields(line)[0]
		}
	}
	code, out, _ = run(t, db, "runs", "show", runID)
	require.Equal(t, 0, code)
	for _, want := range []string{"SEQ", "ATTEMPTS", "REQUEST ID", "DURATION", "double", "completed", "output       42"} {
		require.Contains(t, out, want)
	}
	code, out, _ = run(t, db, "runs", "show", "d-1") // by workflow ID
	require.Equal(t, 0, code)
	require.Contains(t, out, runID)
	code, _, errOut = run(t, db, "runs", "show", "nope")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `no run with run ID or workflow ID "nope"`)

	code, out, _ = run(t, db, "dead", "list", "--json")
	require.Equal(t, 0, code)
	var dead struct {
		DeadJobs []engine.DeadJob `json:"dead_jobs"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &dead))
	require.Len(t, dead.DeadJobs, 1)
	id := dead.DeadJobs[0].ID.String()
	code, out, _ = run(t, db, "dead", "show", id)
	require.Equal(t, 0, code)
	require.Contains(t, out, "retries_exhausted")
	require.Contains(t, out, "upstream refused")
	code, _, errOut = run(t, db, "dead", "show", dead.DeadJobs[0].RunID.String())
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "is a run's ID, and its latest dead job is "+id, "the run's ID leads to its dead job")
	code, out, _ = run(t, db, "dead", "discard", id, "--by", "ops", "--note", "test data")
	require.Equal(t, 0, code)
	require.Contains(t, out, "discarded by ops")
	code, _, errOut = run(t, db, "dead", "replay", id)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "already resolved")
	code, _, errOut = run(t, db, "cancel", runID)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "already finished")
	// A run's ID with no open dead job: its status, as cancel says it.
	code, _, errOut = run(t, db, "dead", "replay", runID)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "run already finished: run "+runID+" is completed and has no open dead job to replay")
}

func TestServeRefusesPublicListenWithoutToken(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	code := commands.Execute(context.Background(), []string{"serve", "--listen", "0.0.0.0:0"},
		commands.Options{Stdout: &bytes.Buffer{}, Stderr: &errOut, Getenv: func(string) string { return "" }})
	require.Equal(t, 2, code)
	require.Contains(t, errOut.String(), "not a loopback address")
}

// A pool of no connections, or a negative shutdown timeout, is refused
// before anything starts.
func TestServeRefusesBadPoolSizeAndShutdownTimeout(t *testing.T) {
	t.Parallel()
	for args, want := range map[[2]string]string{
		{"--pool-size", "0"}:          "--pool-size 0: give at least 1 connection",
		{"--pool-size", "-5"}:         "--pool-size -5: give at least 1 connection",
		{"--shutdown-timeout", "-1s"}: "--shutdown-timeout -1s: give 0",
	} {
		var errOut bytes.Buffer
		code := commands.Execute(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", args[0], args[1]},
			commands.Options{Stdout: &bytes.Buffer{}, Stderr: &errOut, Getenv: func(string) string { return "" }})
		require.Equal(t, 2, code, args)
		require.Contains(t, errOut.String(), want)
	}
}

func TestServeNeedsMigratedSchema(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, _, errOut := run(t, db, "migrate", "down", "--steps", "-1")
	require.Equal(t, 2, code, "a negative count is refused, not taken for none")
	require.Contains(t, errOut, "--steps -1: give how many versions to roll back, or 0 for all")
	code, _, _ = run(t, db, "migrate", "down", "--include-river")
	require.Equal(t, 0, code)
	code, _, errOut = run(t, db, "serve", "--listen", freePort(t))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "engine migrate up")
	code, out, _ := run(t, db, "migrate", "up")
	require.Equal(t, 0, code)
	require.Contains(t, out, "pgdurable versions [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34]")
}

// The demo runs the payment story end to end and must report 0 double
// charges and every run finished.
func TestDemo(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, out, errOut := run(t, db, "demo", "--timeout", "90s")
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	require.Contains(t, out, "double charges: 0")
	require.Contains(t, out, "net charge mismatches (completed ≠ charged, compensated ≠ 0): 0")
	require.Contains(t, out, "201/201 finished")
	require.Contains(t, out, "9 rejected (400)")
	require.Contains(t, out, "2 conflicting reuses")
	require.Contains(t, out, "go run ./cmd/engine --database-url")
}

// engine dev with --throwaway starts its own PostgreSQL from the local
// installation, serves, and removes it all on exit.
func TestDevThrowawayPostgres(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/lib/postgresql"); err != nil {
		t.Skip("no local PostgreSQL installation")
	}
	ctx, cancel := context.WithCancel(context.Background())
	listen := freePort(t)
	errOut := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- commands.Execute(ctx, []string{"dev", "--throwaway", "--listen", listen, "--log-level", "warn"},
			commands.Options{Workflows: workflows(), Stdout: &bytes.Buffer{}, Stderr: errOut, Getenv: func(string) string { return "" }})
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Post("http://"+listen+"/v1/workflows/double/runs", "application/json", strings.NewReader(`{"input": {"n": 4}}`))
		if err == nil {
			resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			break
		}
		require.True(t, time.Now().Before(deadline), "dev never served: %s", errOut.String())
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	require.Equal(t, 0, <-done, errOut.String())
	out := errOut.String()
	require.Contains(t, out, "started a throwaway PostgreSQL in ")
	dir := strings.Fields(out[strings.Index(out, "throwaway PostgreSQL in ")+len("throwaway PostgreSQL in "):])[0]
	_, err := os.Stat(dir)
	require.True(t, os.IsNotExist(err), "the throwaway directory %s is removed", dir)
}

// engine dev with nothing configured runs the payment example on the
// embedded fake gateway and the approval example, starts example runs,
// serves the UI and prints its URL and commands that work.
func TestDevServesTheExamplesAndTheUI(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	listen := freePort(t)
	out, errOut := &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- commands.Execute(ctx, []string{"--database-url", db.URL, "dev", "--listen", listen, "--log-level", "warn"},
			withPayment(commands.Options{Stdout: out, Stderr: errOut, Getenv: func(string) string { return "" },
				Migrate: payment.Migrate, Dev: paymentcmd.Dev}))
	}()
	base := "http://" + listen
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status := func(id string) string {
		code, body := get("/v1/runs/" + id)
		if code != 200 {
			return ""
		}
		var r struct{ Status string }
		require.NoError(t, json.Unmarshal([]byte(body), &r))
		return r.Status
	}
	deadline := time.Now().Add(60 * time.Second)
	for status("dev-order-1") != "completed" || status("dev-order-2") != "compensated" || status("expense-1") != "waiting" {
		require.True(t, time.Now().Before(deadline), "the example runs never settled: %s %s", out.String(), errOut.String())
		time.Sleep(100 * time.Millisecond)
	}
	require.Contains(t, out.String(), "web UI   "+base+"/ui/")

	// The export example parks as a dead job at once, so the dead-job desk
	// has one to look at; dev says so, and its replay completes it.
	for status("dev-export-1") != "dead" {
		require.True(t, time.Now().Before(deadline), "the export example never parked: %s %s", out.String(), errOut.String())
		time.Sleep(100 * time.Millisecond)
	}
	require.Contains(t, out.String(), "a dead job (dev-export-1: its upload failed 3 times, so it is parked")
	require.Contains(t, out.String(), "open "+base+"/ui/dead-jobs and replay it")
	code, body := get("/v1/dead-jobs?open=true")
	require.Equal(t, 200, code)
	var dead struct {
		DeadJobs []engine.DeadJob `json:"dead_jobs"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &dead))
	require.Len(t, dead.DeadJobs, 1, body)
	require.Equal(t, "dev-export-1", dead.DeadJobs[0].WorkflowID)
	require.Equal(t, engine.ReasonRetriesExhausted, dead.DeadJobs[0].Reason)
	require.Equal(t, 3, dead.DeadJobs[0].Attempts)
	code, body = get("/ui/dead-jobs")
	require.Equal(t, 200, code)
	require.Contains(t, body, "503 Service Unavailable")
	resp, err := http.Post(base+"/v1/dead-jobs/"+dead.DeadJobs[0].ID.String()+"/replay", "application/json", strings.NewReader(`{"by": "test"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for status("dev-export-1") != "completed" {
		require.True(t, time.Now().Before(deadline), "the replayed export never completed")
		time.Sleep(50 * time.Millisecond)
	}

	code, body = get("/ui/runs")
	require.Equal(t, 200, code)
	require.Contains(t, body, "expense-1")

	// The printed signal command works as printed.
	var signal string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, "/signals/decision") {
			signal = strings.TrimSpace(line)
		}
	}
	require.NotEmpty(t, signal, out.String())
	require.Contains(t, signal, `-d '{"approved": true, "by": "you"}'`)
	resp, err = http.Post(base+"/v1/runs/expense-1/signals/decision", "application/json", strings.NewReader(`{"approved": true, "by": "you"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	for status("expense-1") != "completed" {
		require.True(t, time.Now().Before(deadline), "the approval never completed")
		time.Sleep(50 * time.Millisecond)
	}
	_, body = get("/v1/runs/expense-1")
	require.Contains(t, body, `"output":"approved by you"`)

	// The printed start works as printed: over the API (the CLI's own
	// process may not register the workflow), to the run's end.
	input := `{"order_id": "cli-order-1", "customer_id": "cus_dev", "amount": 4999, "currency": "usd", "payment_method": "pm_card_visa", "items": [{"sku": "sku_tee", "qty": 1}]}`
	require.Contains(t, out.String(), "--address "+base+" start payment --id cli-order-1 --input '"+input+"' --wait")
	var startOut, startErr bytes.Buffer
	code = commands.Execute(context.Background(), []string{"--address", base, "start", "payment", "--id", "cli-order-1", "--input", input, "--wait"},
		commands.Options{Stdout: &startOut, Stderr: &startErr, Getenv: func(string) string { return "" }})
	require.Equal(t, 0, code, "%s %s", startOut.String(), startErr.String())
	require.Contains(t, startOut.String(), "completed")
	cancel()
	require.Equal(t, 0, <-done, errOut.String())

	// A second start on the database adds the next number's examples, and
	// its hints name them: another parked export, another approval.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	listen = freePort(t)
	base = "http://" + listen
	out = &syncBuffer{}
	go func() {
		done <- commands.Execute(ctx, []string{"--database-url", db.URL, "dev", "--listen", listen, "--log-level", "warn"},
			withPayment(commands.Options{Stdout: out, Stderr: errOut, Getenv: func(string) string { return "" },
				Migrate: payment.Migrate, Dev: paymentcmd.Dev}))
	}()
	for status("dev-export-2") != "dead" || status("expense-2") != "waiting" {
		require.True(t, time.Now().Before(deadline), "the second start's examples never settled: %s %s", out.String(), errOut.String())
		time.Sleep(100 * time.Millisecond)
	}
	require.Contains(t, out.String(), "a dead job (dev-export-2: its upload failed 3 times, so it is parked")
	require.Contains(t, out.String(), base+"/v1/runs/expense-2/signals/decision")
	require.Contains(t, out.String(), "start payment --id cli-order-2 ")
	cancel()
	require.Equal(t, 0, <-done, errOut.String())
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestBenchCommandPrintsEveryRow(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, out, errOut := run(t, db, "bench", "--workflows", "40", "--rounds", "1", "--latency-samples", "5", "--waiting-runs", "100", "--json")
	require.Equal(t, 0, code, errOut)
	var rep struct {
		Rows []struct {
			Name    string  `json:"name"`
			Value   float64 `json:"value"`
			Skipped bool    `json:"skipped"`
		} `json:"rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	names := map[string]float64{}
	for _, r := range rep.Rows {
		names[r.Name] = r.Value
	}
	require.Positive(t, names["payment workflow, fake gateway without faults"])
	require.Positive(t, names["river 3 rows in 3 transactions per job"])
	require.Positive(t, names["RSS with 100 waiting runs"])
	n := len(rep.Rows)
	require.Equal(t, "payment workflow, fake gateway without faults", rep.Rows[n-2].Name, "Options.BenchRows come before the memory row")
	require.Equal(t, "RSS with 100 waiting runs", rep.Rows[n-1].Name)
}

// chaos and bench fill their database: they refuse the default one, and
// reject counts that would run nothing or divide by zero.
func TestChaosAndBenchRefuseDefaultDatabaseAndBadCounts(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"chaos"}, {"bench"}} {
		var errOut bytes.Buffer
		code := commands.Execute(context.Background(), args,
			withPayment(commands.Options{Stdout: &bytes.Buffer{}, Stderr: &errOut, Getenv: func(string) string { return "" }}))
		require.Equal(t, 2, code, args)
		require.Contains(t, errOut.String(), "name a database of its own", args)
	}
	url := "postgres://postgres@127.0.0.1:1/never-used"
	for args, msg := range map[string]string{
		"chaos --workflows 0":  "--workflows must be at least 1",
		"chaos --engines 0":    "--engines must be at least 1",
		"bench --workflows -5": "--workflows must be at least 1",
	} {
		var errOut bytes.Buffer
		code := commands.Execute(context.Background(), append([]string{"--database-url", url}, strings.Fields(args)...),
			withPayment(commands.Options{Stdout: &bytes.Buffer{}, Stderr: &errOut, Getenv: func(string) string { return "" }}))
		require.Equal(t, 2, code, args)
		require.Contains(t, errOut.String(), msg, args)
	}
}

func TestSignalCommand(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	e := enginetest.NewEngine(t, db, nil, true, workflows()...)
	ctx := context.Background()
	res, err := e.StartJSON(ctx, "approval", []byte(`{}`), &engine.StartOpts{WorkflowID: "exp-9"})
	require.NoError(t, err)

	code, _, errOut := run(t, db, "signal", "exp-9")
	require.Equal(t, 2, code, "a wrong number of arguments is a usage error")
	require.Contains(t, errOut, "accepts between 2 and 3 arg(s)")
	code, _, errOut = run(t, db, "signal", "exp-9", "approve", `{"by":`)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "not valid JSON")
	code, out, errOut := run(t, db, "signal", "exp-9", "approve", `{"by": "cli"}`)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `signal "approve" sent`)
	deadline := time.Now().Add(15 * time.Second)
	for {
		run, err := e.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		if run.Status == engine.StatusCompleted {
			require.JSONEq(t, `"cli"`, string(run.Output))
			break
		}
		require.True(t, time.Now().Before(deadline), "run is %s", run.Status)
		time.Sleep(20 * time.Millisecond)
	}
	code, out, _ = run(t, db, "runs", "show", res.RunID.String())
	require.Equal(t, 0, code)
	require.Regexp(t, `approve\s+\S+\s+0\s+\{"by": "cli"\}`, out, "the signal and the step that received it")
	code, _, errOut = run(t, db, "signal", res.RunID.String(), "approve", `{}`)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "already finished")
}

func TestSchedulesCommand(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, out, errOut := run(t, db, "schedules", "create", "nightly", "--cron", "30 2 * * *", "--time-zone", "America/New_York",
		"--workflow", "double", "--input", `{"n": 2}`, "--catchup-window", "10m")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "America/New_York")
	code, _, errOut = run(t, db, "schedules", "create", "nightly", "--cron", "@daily", "--workflow", "double", "--input", `{"n": 2}`)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "already exists")
	code, _, errOut = run(t, db, "schedules", "create", "feb30", "--cron", "0 0 30 2 *", "--workflow", "double", "--input", `{"n": 2}`)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "never fires")
	code, _, errOut = run(t, db, "schedules", "create", "nocron", "--workflow", "double")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "needs --cron and --workflow")

	code, out, _ = run(t, db, "schedules", "update", "nightly", "--cron", "@hourly", "--workflow", "double", "--input", `{"n": 3}`, "--overlap", "allow")
	require.Equal(t, 0, code)
	require.Contains(t, out, "@hourly")
	for _, act := range []string{"pause", "resume"} {
		code, out, _ = run(t, db, "schedules", act, "nightly")
		require.Equal(t, 0, code)
		require.Contains(t, out, act)
	}
	code, out, _ = run(t, db, "schedules", "trigger", "nightly")
	require.Equal(t, 0, code)
	require.Contains(t, out, "workflow ID schedule:nightly:trigger:")
	code, _, errOut = run(t, db, "schedules", "trigger", "absent")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "not found")
	code, out, _ = run(t, db, "schedules", "list", "--json")
	require.Equal(t, 0, code)
	var body struct {
		Schedules []map[string]any `json:"schedules"` // GET /v1/schedules's shape
	}
	require.NoError(t, json.Unmarshal([]byte(out), &body))
	list := body.Schedules
	require.Len(t, list, 1)
	require.Equal(t, "allow", list[0]["overlap"])
	require.Equal(t, "1h0m0s", list[0]["catchup_window"], "update replaces the whole definition")
	code, out, _ = run(t, db, "schedules", "show", "nightly")
	require.Equal(t, 0, code)
	require.Contains(t, out, "FIRE AT")
	code, _, _ = run(t, db, "schedules", "delete", "nightly")
	require.Equal(t, 0, code)
	code, _, errOut = run(t, db, "schedules", "show", "nightly")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "not found")
}

// runs show tells a run held in crash backoff from one waiting for a timer.
func TestRunsShowACrashBackoff(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, _, errOut := run(t, db, "start", "double", "--id", "held-1", "--input", `{"n": 1}`)
	require.Equal(t, 0, code, errOut)
	for _, runs := range db.RouteTables("workflow_runs") {
		_, err := db.Pool.Exec(context.Background(), `UPDATE `+runs+` SET status = 'waiting', deliveries = 3, stalled_deliveries = 3,
		wake_at = now() + interval '1 hour' WHERE workflow_id = 'held-1'`)
		require.NoError(t, err)
	}
	code, out, _ := run(t, db, "runs", "show", "held-1")
	require.Equal(t, 0, code)
	require.Contains(t, out, "crashes      3 deliveries in a row died without progress")
	require.Contains(t, out, "waiting until")
}

// What the CLI prints for people never carries a raw control character:
// an error message with terminal escapes is shown escaped.
func TestCLIEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	e := enginetest.NewEngine(t, db, nil, true, workflows()...)
	res, err := e.StartJSON(context.Background(), "hostile", []byte(`{}`), &engine.StartOpts{WorkflowID: "hostile-1"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := e.GetRun(context.Background(), res.RunID)
		require.NoError(t, err)
		return run.Status == engine.StatusFailed
	}, 10*time.Second, 20*time.Millisecond)
	for _, args := range [][]string{{"runs", "show", "hostile-1"}, {"runs", "list"}} {
		code, out, errOut := run(t, db, args...)
		require.Equal(t, 0, code, errOut)
		require.NotContains(t, out, "\x1b", args)
		require.NotContains(t, out, "\u009b", args)
		require.NotContains(t, out, "\x07", args)
	}
	_, out, _ := run(t, db, "runs", "show", "hostile-1")
	require.Contains(t, out, `\x1b[31mred`)
	code, _, errOut := run(t, db, "start", "double", "--id", "bad\x1b[2Jid", "--input", `{"n": 1}`)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "control character")
	require.NotContains(t, errOut, "\x1b")
}

// A connection string's password never reaches the terminal, in URL or
// key=value form, whatever fails.
func TestCLINeverPrintsThePassword(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"postgres://u:s3cretpw@127.0.0.1:1/x",
		"postgres://u:s3cretpw@127.0.0.1:notaport/x",
		"postgres://u:s3c@retpw@127.0.0.1/x",
		"host=127.0.0.1 port=1 user=u password=s3cretpw dbname=x",
		"host=127.0.0.1 port=1 password='s3cret pw' user=u",
		"host=127.0.0.1 port=notaport password=s3cretpw",
		"postgres://postgres:s3cretpw@127.0.0.1:5432/postgres?sslmode=bogus",
		"postgres://postgres@127.0.0.1:1/x?password=s3cretpw",
		"postgres://postgres@127.0.0.1:1/x?sslmode=disable&sslpassword=s3cretpw",
		"POSTGRES://postgres:s3cretpw@127.0.0.1:1/x",
		"Postgresql://postgres:s3cretpw@127.0.0.1:1/x",
		"postgres://postgres:s3c@127.0.0.1:1/retpw@127.0.0.1:5432/x",
		"host=127.0.0.1 port=1 sslpassword=s3cretpw",
	} {
		for _, args := range [][]string{{"runs", "list"}, {"migrate", "up"}, {"dead", "list"}, {"bench", "--workflows", "1"}, {"demo"}} {
			var out, errOut bytes.Buffer
			code := commands.Execute(context.Background(), append([]string{"--database-url", url}, args...), withPayment(commands.Options{
				Workflows: workflows(), Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" },
			}))
			require.NotEqual(t, 0, code)
			require.NotContains(t, out.String()+errOut.String(), "s3cret", "%s %v", url, args)
			require.NotContains(t, out.String()+errOut.String(), "retpw", "%s %v", url, args)
		}
	}
	// A password too short to scrub from arbitrary text is still redacted
	// where the connection string is printed.
	var out, errOut bytes.Buffer
	code := commands.Execute(context.Background(), []string{"--database-url", "postgres://postgres@127.0.0.1:1/x?password=ab", "runs", "list"},
		commands.Options{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }})
	require.NotEqual(t, 0, code)
	require.NotContains(t, errOut.String(), "password=ab")
}

// An API token HTTP cannot carry back intact (white space at either end,
// a control character) is refused at start, as a short one is beyond
// loopback.
func TestServeRefusesTokensClientsCannotSend(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	for _, tok := range []string{"abcdefghijklmnop ", " abcdefghijklmnop", strings.Repeat(" ", 16), "abcdefgh\tijklmnop"} {
		code, _, errOut := run(t, db, "serve", "--listen", "127.0.0.1:0", "--api-token", tok)
		require.Equal(t, 2, code, "%q: %s", tok, errOut)
		require.Contains(t, errOut, "white space or a control character")
	}
	code, _, errOut := run(t, db, "serve", "--listen", "0.0.0.0:0", "--api-token", "short")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "at least 16")
}

// --json covers every command and its errors, in the HTTP API's shapes and
// field names; usage mistakes exit 2 whatever the command.
func TestCLIJSONAndUsage(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	decode := func(out string) map[string]any {
		t.Helper()
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &v), out)
		return v
	}
	code, out, _ := run(t, db, "--json", "start", "approval", "--id", "ap-1", "--input", `{}`)
	require.Equal(t, 0, code)
	started := decode(out)
	require.Equal(t, "approval", started["workflow"])
	require.Equal(t, "ap-1", started["workflow_id"])

	code, out, _ = run(t, db, "--json", "signal", "ap-1", "approve", `{"by": "ann"}`)
	require.Equal(t, 0, code, out)
	require.Equal(t, map[string]any{"run": "ap-1", "signal": "approve", "status": "accepted"}, decode(out))

	code, out, _ = run(t, db, "--json", "cancel", "ap-1")
	require.Equal(t, 0, code, out)
	cancelled := decode(out)
	require.Equal(t, "approval", cancelled["workflow"], "the API's run shape")
	require.NotEmpty(t, cancelled["cancel_requested_at"])

	code, out, errOut := run(t, db, "--json", "cancel", "no-such-run")
	require.Equal(t, 1, code)
	require.Empty(t, errOut)
	body := decode(out)["error"].(map[string]any)
	require.Equal(t, "not_found", body["code"])
	require.Contains(t, body["message"], "no-such-run")

	code, out, _ = run(t, db, "--json", "runs", "list", "--limit", "0")
	require.Equal(t, 2, code)
	require.Equal(t, "usage", decode(out)["error"].(map[string]any)["code"])
	code, out, _ = run(t, db, "--json", "runs", "show", "ap-1")
	require.Equal(t, 0, code)
	require.Equal(t, "approval", decode(out)["workflow"])
	code, out, _ = run(t, db, "--json", "dead", "list")
	require.Equal(t, 0, code)
	require.Contains(t, decode(out), "dead_jobs")

	for _, args := range [][]string{{"migrate", "sideways"}, {"runs", "frobnicate"}, {"dead", "list", "--limit", "0"}, {"runs", "list", "--limit", "5000"},
		{"runs", "list", "--status", "nosuch"}, {"dead", "list", "--reason", "nosuch"}} {
		code, _, errOut := run(t, db, args...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
	}
	code, out, _ = run(t, db, "--version")
	require.Equal(t, 0, code)
	require.Regexp(t, `^engine \S+`, out)
}

// A command against a database without pgdurable's tables says to migrate,
// where PostgreSQL says only that a relation does not exist.
func TestCommandsOnAnUnmigratedDatabaseSayToMigrate(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, _, _ := run(t, db, "migrate", "down", "--include-river")
	require.Equal(t, 0, code)
	for _, args := range [][]string{{"runs", "list"}, {"dead", "list"}} {
		code, _, errOut := run(t, db, args...)
		require.Equal(t, 1, code, args)
		require.Contains(t, errOut, "run `engine migrate up` first", args)
	}
}

// engine start --delay inserts the run waiting; start-now makes it due;
// a bad --start-at is a usage error; signal --key is sent once.
func TestCLIDelayedStartAndSignalKey(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, out, errOut := run(t, db, "start", "double", "--id", "later", "--input", `{"n": 2}`, "--delay", "1h")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "status waiting")
	code, out, _ = run(t, db, "runs", "show", "later")
	require.Equal(t, 0, code)
	require.Contains(t, out, "starts at")
	code, _, errOut = run(t, db, "start", "double", "--id", "timed", "--input", `{"n": 2}`, "--delay", "1h", "--run-timeout", "90s")
	require.Equal(t, 0, code, errOut)
	code, out, _ = run(t, db, "runs", "show", "timed")
	require.Equal(t, 0, code)
	require.Contains(t, out, "timeout      1m30s from its first pick-up")
	code, _, errOut = run(t, db, "start", "double", "--id", "bad", "--input", `{"n": 2}`, "--start-at", "tomorrow")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "RFC 3339")
	code, out, errOut = run(t, db, "start-now", "later")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "started now")
	code, out, _ = run(t, db, "runs", "show", "later", "--json")
	require.Equal(t, 0, code)
	var r engine.Run
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Equal(t, engine.StatusPending, r.Status)
	require.Nil(t, r.WakeAt)

	code, _, errOut = run(t, db, "start", "approval", "--id", "ap", "--input", `{"n": 0}`)
	require.Equal(t, 0, code, errOut)
	for range 3 {
		code, _, errOut = run(t, db, "signal", "ap", "approve", `{"by": "ann"}`, "--key", "k1")
		require.Equal(t, 0, code, errOut)
	}
	code, _, errOut = run(t, db, "signal", "ap", "approve", `{"by": "eve"}`, "--key", "k1")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "idempotency key")
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), db.SQL(`SELECT count(*) FROM pgdurable.workflow_signals`)).Scan(&n))
	require.Equal(t, 1, n)

	// signal --start: signal-with-start.
	code, out, errOut = run(t, db, "signal", "sws", "approve", `{"by": "bo"}`, "--start", "approval", "--input", `{"n": 0}`)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "started")
	code, out, errOut = run(t, db, "signal", "sws", "approve", `{"by": "bo"}`, "--start", "approval", "--input", `{"n": 0}`)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "existed")
	code, _, errOut = run(t, db, "signal", "sws", "approve", "--input", `{"n": 0}`)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--input is for --start")
	require.NoError(t, db.Pool.QueryRow(context.Background(), db.SQL(`SELECT count(*) FROM pgdurable.workflow_signals`)).Scan(&n))
	require.Equal(t, 3, n)
}

// runs show names a child's parent, and lists a parent's children and
// the child it waits for.
func TestRunsShowParentAndChildren(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	kid := engine.Define("show-kid", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "go", 0)
	}, nil)
	parent := engine.Define("show-parent", func(ctx *engine.Context, _ int) (int, error) {
		return engine.ChildWorkflow(ctx, kid, 1, &engine.ChildOpts{WorkflowID: "the-kid", ParentClosePolicy: engine.ParentCloseAbandon})
	}, nil)
	e := enginetest.NewEngine(t, db, nil, true, parent, kid)
	ctx := context.Background()
	res, err := parent.Start(ctx, e, 0, &engine.StartOpts{WorkflowID: "the-parent"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := e.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		return run.Status == engine.StatusWaiting && len(run.AwaitChildren) == 1 && run.Children[0].Status == engine.StatusWaiting
	}, 10*time.Second, 20*time.Millisecond)
	code, out, errOut := run(t, db, "runs", "show", "the-parent")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "waiting for  the child run of step 0 to end")
	require.Regexp(t, `CHILD OF STEP +RUN ID +WORKFLOW +WORKFLOW ID +STATUS +ON PARENT CLOSE`, out)
	require.Regexp(t, `0 +[0-9a-f-]{36} +show-kid +the-kid +waiting +abandon`, out)
	code, out, errOut = run(t, db, "runs", "show", "the-kid")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, fmt.Sprintf("parent       %s (its step 0; when it closes first: abandon)", res.RunID))
	require.Contains(t, out, `waiting for  signal "go"`)
}

// dead show of a parent parked with its dead child (child_dead) names the
// child run and the child's dead job; replaying the parent's from the CLI
// replays both.
func TestDeadShowLinksAChildDeadJob(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	var broken atomic.Bool
	broken.Store(true)
	kid := engine.Define("dead-kid", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "work", func(context.Context) (int, error) {
			if broken.Load() {
				return 0, errors.New("broken")
			}
			return 7, nil
		}, &engine.StepOpts{RetryPolicy: &engine.RetryPolicy{MaximumAttempts: 1}}) // parked at once
	}, nil)
	parent := engine.Define("dead-kid-parent", func(ctx *engine.Context, _ int) (int, error) {
		return engine.ChildWorkflow(ctx, kid, 1, nil)
	}, nil)
	e := enginetest.NewEngine(t, db, nil, true, parent, kid)
	ctx := context.Background()
	res, err := parent.Start(ctx, e, 0, &engine.StartOpts{WorkflowID: "waits-for-a-dead-kid"})
	require.NoError(t, err)
	var job *engine.DeadJob
	require.Eventually(t, func() bool {
		jobs, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: res.RunID})
		require.NoError(t, err)
		if len(jobs) == 1 {
			job = jobs[0]
		}
		return job != nil
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, engine.ReasonChildDead, job.Reason)
	code, out, errOut := run(t, db, "dead", "show", job.ID.String())
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "reason       child_dead")
	// The parent's workflow ID leads to its dead job (a new user tried
	// "dead replay dev-export-1"); an unknown one is still only refused.
	code, _, errOut = run(t, db, "dead", "replay", "waits-for-a-dead-kid")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `dead job ID "waits-for-a-dead-kid" is not a UUID; waits-for-a-dead-kid is a workflow ID, and its run's latest dead job is `+job.ID.String())
	code, _, errOut = run(t, db, "dead", "replay", "no-such-workflow-id")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `dead job ID "no-such-workflow-id" is not a UUID`)
	require.NotContains(t, errOut, "is a workflow ID")
	require.Contains(t, out, fmt.Sprintf("child        run %s, dead job %s (replaying either dead job replays both)", *job.ChildRunID, *job.ChildDeadJobID))
	code, out, errOut = run(t, db, "dead", "show", job.ChildDeadJobID.String())
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, fmt.Sprintf("parent       run %s waits for this run, parked as dead job %s (replaying either dead job replays both)", res.RunID, job.ID))
	code, out, errOut = run(t, db, "dead", "list", "--reason", "child_dead", "--json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, job.ID.String())

	broken.Store(false)
	code, _, errOut = run(t, db, "dead", "replay", job.ID.String(), "--note", "fixed")
	require.Equal(t, 0, code, errOut)
	out7, err := parent.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out7)
}

// runs show names everything a Select waits for, and links the runs of a
// continue-as-new chain.
func TestRunsShowASelectAndAContinuedChain(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	kid := engine.Define("show-sel-kid", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "go", 0)
	}, nil)
	sel := engine.Define("show-select", func(ctx *engine.Context, _ int) (int, error) {
		c, err := engine.StartChild(ctx, kid, 0, nil)
		if err != nil {
			return 0, err
		}
		s, err := engine.Select(ctx, "first", engine.OnChild(c), engine.OnSignal("poke"), engine.OnTimer(time.Hour))
		return s.Index, err
	}, nil)
	loop := engine.Define("show-loop", func(ctx *engine.Context, n int) (int, error) {
		if n < 2 {
			return 0, engine.ContinueAsNew(ctx, n+1)
		}
		return engine.AwaitSignal[int](ctx, "stop", 0)
	}, nil)
	e := enginetest.NewEngine(t, db, nil, true, kid, sel, loop)
	ctx := context.Background()
	res, err := sel.Start(ctx, e, 0, &engine.StartOpts{WorkflowID: "the-select"})
	require.NoError(t, err)
	first, err := loop.Start(ctx, e, 0, &engine.StartOpts{WorkflowID: "the-loop"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := e.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		latest, err := e.FindRun(ctx, "the-loop")
		require.NoError(t, err)
		last, err := e.GetRun(ctx, latest)
		require.NoError(t, err)
		return run.Status == engine.StatusWaiting && len(run.AwaitChildren) == 1 && last.Status == engine.StatusWaiting
	}, 10*time.Second, 20*time.Millisecond)
	code, out, errOut := run(t, db, "runs", "show", "the-select")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `waiting for  the child run of step 0 to end, or signal "poke", or until`)
	code, out, errOut = run(t, db, "runs", "show", first.RunID.String())
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "status       continued")
	require.Contains(t, out, "continued    as run ")
	code, out, errOut = run(t, db, "runs", "show", "the-loop")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, fmt.Sprintf("chain        started by run %s", first.RunID))
	require.Contains(t, out, `waiting for  signal "stop"`)
}

// runs show lists a child that continued as new once, at its chain's
// latest run, with the chain's first run; before, one row per run of the
// chain.
func TestRunsShowAContinuedChildOnce(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	kid := engine.Define("show-chain-kid", func(ctx *engine.Context, n int) (int, error) {
		if n < 3 {
			return 0, engine.ContinueAsNew(ctx, n+1)
		}
		return engine.AwaitSignal[int](ctx, "stop", 0)
	}, nil)
	parent := engine.Define("show-chain-parent", func(ctx *engine.Context, _ int) (int, error) {
		return engine.ChildWorkflow(ctx, kid, 0, &engine.ChildOpts{WorkflowID: "the-chain"})
	}, nil)
	e := enginetest.NewEngine(t, db, nil, true, parent, kid)
	ctx := context.Background()
	res, err := parent.Start(ctx, e, 0, &engine.StartOpts{WorkflowID: "the-chain-parent"})
	require.NoError(t, err)
	var latest uuid.UUID
	require.Eventually(t, func() bool {
		if latest, err = e.FindRun(ctx, "the-chain"); err != nil {
			return false
		}
		r, err := e.GetRun(ctx, latest)
		require.NoError(t, err)
		return r.Status == engine.StatusWaiting && r.AwaitSignal == "stop"
	}, 10*time.Second, 20*time.Millisecond)
	last, err := e.GetRun(ctx, latest)
	require.NoError(t, err)
	require.NotNil(t, last.FirstRunID)
	code, out, errOut := run(t, db, "runs", "show", res.RunID.String())
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `CHILD OF STEP +RUN ID +WORKFLOW +WORKFLOW ID +STATUS +ON PARENT CLOSE +CHAIN'S FIRST RUN`, out)
	require.Regexp(t, fmt.Sprintf(`0 +%s +show-chain-kid +the-chain +waiting +cancel +%s`, latest, *last.FirstRunID), out)
	rows := regexp.MustCompile(`(?m)^[0-9]+ +[0-9a-f-]{36} +show-chain-kid +the-chain `).FindAllString(out, -1)
	require.Len(t, rows, 1, "one row for the chain of 4 runs:\n%s", out)
}

// runs prune deletes finished runs past --older-than; --dry-run counts
// them; an --older-than not above 0 is a usage error.
func TestRunsPrune(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), db.SQL(`
INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input, completed_at)
VALUES ('00000000-0001-7000-8000-000000000001', 'double', 'ancient', 'completed', '1', now() - interval '40 days')`))
	require.NoError(t, err)
	code, out, errOut := run(t, db, "runs", "prune", "--older-than", "720h", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would delete 1 runs (0 steps, 0 signals, 0 dead jobs) and 0 schedule fires that ended over 720h0m0s ago")
	code, out, errOut = run(t, db, "runs", "prune", "--older-than", "720h", "--json")
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"runs": 1, "steps": 0, "signals": 0, "dead_jobs": 0, "schedule_fires": 0}`, out)
	code, _, errOut = run(t, db, "runs", "prune", "--older-than", "0")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--older-than must be a duration above 0")
}

// start --wait follows the run to its end: its steps as they are recorded,
// exit 0 once it completed, 1 (with the run's error, or with --json the
// run) when it ended otherwise; runs show --follow does the same for a
// run already started.
func TestStartWaitAndRunsShowFollow(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	e := enginetest.NewEngine(t, db, nil, true, workflows()...) // the server that works the runs
	code, out, errOut := run(t, db, "start", "double", "--id", "w-1", "--input", `{"n": 3}`, "--wait")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `step 0 +double +step +completed`, out)
	require.Contains(t, out, "completed: output 6")

	code, out, errOut = run(t, db, "start", "double", "--id", "w-2", "--input", `{"n": -1}`, "--wait")
	require.Equal(t, 1, code, out)
	require.Contains(t, errOut, "ended dead")
	require.Regexp(t, `step 0 +double +step +parked +attempt 2`, out)

	code, out, _ = run(t, db, "start", "double", "--id", "w-3", "--input", `{"n": -2}`, "--wait", "--json")
	require.Equal(t, 1, code)
	var ended engine.Run
	require.NoError(t, json.Unmarshal([]byte(out), &ended), out)
	require.Equal(t, engine.StatusDead, ended.Status)

	res, err := e.StartJSON(context.Background(), "approval", []byte(`{}`), &engine.StartOpts{WorkflowID: "w-approve"})
	require.NoError(t, err)
	go func() {
		time.Sleep(500 * time.Millisecond)
		_ = e.Signal(context.Background(), res.RunID.String(), "approve", map[string]string{"by": "ann"}, nil)
	}()
	code, out, errOut = run(t, db, "runs", "show", "w-approve", "--follow")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `waiting for signal "approve"`)
	require.Contains(t, out, `completed: output "ann"`)
}

// engine terminate needs --reason, and ends the run.
func TestTerminateCommand(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, _, errOut := run(t, db, "start", "approval", "--id", "to-end", "--input", `{}`)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = run(t, db, "terminate", "to-end")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--reason is required")
	code, out, errOut := run(t, db, "terminate", "to-end", "--reason", "a test", "--by", "ann")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "terminated")
	code, out, errOut = run(t, db, "runs", "show", "to-end")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "status       terminated")
	require.Contains(t, out, "terminated by ann: a test")
}

// runs list filters by creation and finish time: RFC 3339 times or
// durations ago; anything else is a usage error.
func TestRunsListByTime(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, _, errOut := run(t, db, "start", "approval", "--id", "recent", "--input", `{}`)
	require.Equal(t, 0, code, errOut)
	code, out, errOut := run(t, db, "runs", "list", "--created-after", "1h")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "recent")
	code, out, errOut = run(t, db, "runs", "list", "--created-before", "1h")
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "recent")
	code, _, errOut = run(t, db, "runs", "list", "--finished-after", "yesterday")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "neither an RFC 3339 time")
}

// engine workflows list shows what the live engine processes register.
func TestWorkflowsList(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, out, errOut := run(t, db, "workflows", "list")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "no live engine process")
	enginetest.NewEngine(t, db, nil, true, workflows()...)
	code, out, errOut = run(t, db, "workflows", "list")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `double +1 +[^ ]+:\d+ \(queue pgdurable, v1\)`, out)
}

// runs cancel-matching and dead discard-matching act on what their
// filters match, need a filter, and count with --dry-run.
func TestMatchingCommands(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	e := enginetest.NewEngine(t, db, nil, true, workflows()...)
	for _, id := range []string{"m-1", "m-2"} {
		_, err := e.StartJSON(context.Background(), "approval", []byte(`{}`), &engine.StartOpts{WorkflowID: id})
		require.NoError(t, err)
	}
	code, _, errOut := run(t, db, "runs", "cancel-matching")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "give --workflow")
	code, out, errOut := run(t, db, "runs", "cancel-matching", "--workflow-id-prefix", "m-", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "2 runs match (dry run: nothing cancelled)")
	code, out, errOut = run(t, db, "runs", "cancel-matching", "--workflow-id-prefix", "m-")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "2 runs matched: 2 cancelled, 0 skipped")
	code, out, errOut = run(t, db, "dead", "discard-matching", "--workflow", "double", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "0 dead jobs match")
}

// start --tag labels a run; runs list --tag and runs show read the labels.
func TestTagsOnTheCommandLine(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, _, errOut := run(t, db, "start", "double", "--id", "tagged-1", "--input", `{"n": 1}`, "--tag", "customer=c_42", "--tag", "region=eu")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = run(t, db, "start", "double", "--id", "tagged-2", "--input", `{"n": 2}`, "--tag", "customer=c_7")
	require.Equal(t, 0, code, errOut)
	code, out, _ := run(t, db, "runs", "list", "--tag", "customer=c_42")
	require.Equal(t, 0, code)
	require.Contains(t, out, "tagged-1")
	require.NotContains(t, out, "tagged-2")
	code, out, _ = run(t, db, "runs", "show", "tagged-1")
	require.Equal(t, 0, code)
	require.Contains(t, out, "tags         customer=c_42 region=eu")
	code, out, _ = run(t, db, "runs", "cancel-matching", "--tag", "customer=c_7", "--dry-run")
	require.Equal(t, 0, code)
	require.Contains(t, out, "1")
	code, _, errOut = run(t, db, "start", "double", "--input", `{"n": 3}`, "--tag", "novalue")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "not key:value")
	code, _, errOut = run(t, db, "start", "double", "--input", `{"n": 3}`, "--tag", "bad key=v")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "tag key")
}

// serveForCLI runs serve on db with token, in-process, until the test
// ends, and returns its address.
func serveForCLI(t *testing.T, db *enginetest.DB, token string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	listen := freePort(t)
	errOut := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- commands.Execute(ctx, []string{"--database-url", db.URL, "serve", "--migrate", "--listen", listen, "--api-token", token, "--log-level", "warn"},
			commands.Options{Workflows: workflows(), Stdout: io.Discard, Stderr: errOut, Getenv: func(string) string { return "" }})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		if resp, err := http.Get("http://" + listen + "/healthz"); err == nil {
			resp.Body.Close()
			return listen
		}
		require.True(t, time.Now().Before(deadline), "serve never listened: %s", errOut.String())
		time.Sleep(50 * time.Millisecond)
	}
}

// overHTTP runs the CLI against a server's API: ENGINE_ADDRESS and
// ENGINE_API_TOKEN set, and a DATABASE_URL that goes nowhere, so nothing
// can reach the database directly.
func overHTTP(t *testing.T, addr, token string, args ...string) (int, string, string) {
	t.Helper()
	env := map[string]string{"ENGINE_ADDRESS": addr, "ENGINE_API_TOKEN": token, "DATABASE_URL": "postgres://nobody@127.0.0.1:1/nowhere?connect_timeout=1"}
	var out, errOut bytes.Buffer
	code := commands.Execute(context.Background(), args, commands.Options{Workflows: workflows(), Stdout: &out, Stderr: &errOut,
		Getenv: func(k string) string { return env[k] }})
	return code, out.String(), errOut.String()
}

// Every operator command works over the HTTP API (--address or
// ENGINE_ADDRESS, with the API token) as it does on the database.
func TestCLIOverHTTP(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	const token = "cli-over-http-token-0123456789"
	addr := serveForCLI(t, db, token)
	cli := func(args ...string) (int, string, string) { t.Helper(); return overHTTP(t, addr, token, args...) }

	code, out, errOut := cli("start", "double", "--id", "h-1", "--input", `{"n": 21}`, "--tag", "team=ops", "--wait")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "completed")
	code, out, _ = cli("runs", "show", "h-1")
	require.Equal(t, 0, code)
	require.Contains(t, out, "tags         team=ops")
	require.Contains(t, out, "42")
	code, out, _ = cli("runs", "list", "--tag", "team=ops", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"workflow_id":"h-1"`)
	code, _, errOut = cli("start", "double", "--id", "h-1", "--input", `{"n": 22}`)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "workflow ID")

	// Signals, cancel, terminate, start-now.
	code, _, errOut = cli("start", "approval", "--id", "h-wait", "--input", `{}`)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = cli("signal", "h-wait", "approve", `{"by": "ann"}`, "--key", "k-1")
	require.Equal(t, 0, code, errOut)
	code, out, _ = cli("runs", "show", "h-wait", "--follow")
	require.Equal(t, 0, code, out)
	code, _, errOut = cli("start", "approval", "--id", "h-later", "--input", `{}`, "--delay", "1h")
	require.Equal(t, 0, code, errOut)
	code, out, errOut = cli("start-now", "h-later")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "started now")
	code, _, errOut = cli("cancel", "h-later")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = cli("start", "approval", "--id", "h-term", "--input", `{}`)
	require.Equal(t, 0, code, errOut)
	code, out, errOut = cli("terminate", "h-term", "--reason", "test", "--by", "ann")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "terminated")
	code, _, errOut = cli("cancel", "h-1")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "run already finished", "the API's 409 reads as the database's error")

	// Dead jobs: park one, list, show, replay-matching dry run, discard.
	code, _, errOut = cli("start", "double", "--id", "h-dead", "--input", `{"n": -1}`)
	require.Equal(t, 0, code, errOut)
	var jobID string
	for deadline := time.Now().Add(30 * time.Second); jobID == ""; {
		_, out, _ = cli("dead", "list", "--open", "--json")
		var list struct {
			DeadJobs []struct {
				ID string `json:"id"`
			} `json:"dead_jobs"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &list), out)
		if len(list.DeadJobs) > 0 {
			jobID = list.DeadJobs[0].ID
		}
		require.True(t, time.Now().Before(deadline), "no dead job")
		time.Sleep(50 * time.Millisecond)
	}
	code, out, _ = cli("dead", "show", jobID)
	require.Equal(t, 0, code)
	require.Contains(t, out, "negative: upstream refused")
	_, out, _ = cli("runs", "show", "h-dead", "--json")
	var deadRun struct {
		RunID string `json:"run_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &deadRun))
	code, out, _ = cli("dead", "list", "--run-id", deadRun.RunID, "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, jobID)
	code, out, _ = cli("dead", "list", "--run-id", uuid.NewString(), "--json")
	require.Equal(t, 0, code)
	require.NotContains(t, out, jobID)
	code, _, _ = cli("dead", "list", "--run-id", "nope")
	require.Equal(t, 2, code)
	code, out, _ = cli("dead", "replay-matching", "--workflow", "double", "--dry-run")
	require.Equal(t, 0, code)
	require.Contains(t, out, "1")
	code, out, errOut = cli("dead", "discard", jobID, "--by", "ann", "--note", "test")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "discarded")
	code, out, _ = cli("dead", "replay", deadRun.RunID, "--json")
	require.Equal(t, 1, code)
	require.Contains(t, out, `"code":"run_closed"`, "a run whose dead job was discarded")
	require.Contains(t, out, "is dead and has no open dead job to replay")
	code, _, errOut = cli("start", "approval", "--id", "h-wait-2", "--input", `{}`)
	require.Equal(t, 0, code, errOut)
	_, out, _ = cli("runs", "show", "h-wait-2", "--json")
	var waitingRun struct {
		RunID string `json:"run_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &waitingRun))
	code, out, _ = cli("dead", "discard", waitingRun.RunID, "--json")
	require.Equal(t, 1, code)
	require.Contains(t, out, `"code":"run_not_finished"`, "a run still going: %s", out)
	require.Contains(t, out, "has no open dead job to discard")

	// Bulk cancel, workflows, prune.
	code, out, _ = cli("runs", "cancel-matching", "--workflow", "approval", "--dry-run", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"dry_run":true`)
	code, out, _ = cli("workflows", "list")
	require.Equal(t, 0, code)
	require.Contains(t, out, "double")
	code, out, errOut = cli("runs", "prune", "--older-than", "720h", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "0 runs")

	// Schedules.
	code, _, errOut = cli("schedules", "create", "h-nightly", "--cron", "0 3 * * *", "--workflow", "double", "--input", `{"n": 1}`, "--catchup-window", "2h")
	require.Equal(t, 0, code, errOut)
	code, out, _ = cli("schedules", "list")
	require.Equal(t, 0, code)
	require.Contains(t, out, "h-nightly")
	require.Contains(t, out, "2h0m0s")
	for _, act := range []string{"pause", "resume", "trigger"} {
		code, _, errOut = cli("schedules", act, "h-nightly")
		require.Equal(t, 0, code, act+": "+errOut)
	}
	code, out, _ = cli("schedules", "show", "h-nightly")
	require.Equal(t, 0, code)
	require.Contains(t, out, "started")
	code, _, errOut = cli("schedules", "delete", "h-nightly")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = cli("schedules", "show", "h-nightly")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "not found")

	// A wrong token: refused, said so, the token never printed.
	code, _, errOut = overHTTP(t, addr, "wrong-token-wrong-token", "runs", "list")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "the engine refused the API token")
	require.NotContains(t, errOut, "wrong-token-wrong-token")
	code, out, _ = overHTTP(t, addr, "", "runs", "list", "--json")
	require.Equal(t, 1, code)
	require.Contains(t, out, `"code":"unauthorized"`)
	require.Contains(t, out, "requires an API token")
	code, out, _ = cli("schedules", "list", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `{"schedules":`)
	code, out, _ = cli("--database-url", db.URL, "runs", "show", "h-1", "--json")
	require.Equal(t, 0, code, "an explicit --database-url wins over ENGINE_ADDRESS")
	require.Contains(t, out, `"workflow_id":"h-1"`)
	for _, local := range [][]string{{"migrate", "status"}, {"bench"}} {
		code, _, errOut = overHTTP(t, addr, token, append([]string{"--address", addr}, local...)...)
		require.Equal(t, 2, code, local)
		require.Contains(t, errOut, "works on the database", local)
	}
	code, _, _ = overHTTP(t, "localhost", token, "runs", "list")
	require.Equal(t, 2, code, "an address without a port")
	code, _, errOut = overHTTP(t, "ftp://x", token, "runs", "list")
	require.Equal(t, 2, code, errOut)
	code, _, errOut = overHTTP(t, addr, token, "--address", addr, "migrate", "up")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "works on the database")
}

// uiSignIn signs in to the web UI at addr with token and returns the
// session cookie.
func uiSignIn(t *testing.T, addr, token string) *http.Cookie {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+addr+"/ui/login", strings.NewReader("token="+token))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://"+addr)
	resp, err := http.DefaultTransport.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Len(t, resp.Cookies(), 1)
	return resp.Cookies()[0]
}

// uiPage answers GET /ui/runs at addr with cookie: 200 signed in, 303 sent
// to the sign-in page.
func uiPage(t *testing.T, addr string, cookie *http.Cookie) int {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+"/ui/runs", nil)
	require.NoError(t, err)
	req.AddCookie(cookie)
	resp, err := http.DefaultTransport.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// engine ui-sessions revoke signs every browser out of the web UI, on the
// database and over --address; a server restarted with another token
// refuses the old token's sessions by itself.
func TestUISessionsRevoke(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	const token = "cli-ui-sessions-token-0123456789"
	addr := serveForCLI(t, db, token)

	cookie := uiSignIn(t, addr, token)
	require.Equal(t, http.StatusOK, uiPage(t, addr, cookie))
	code, out, errOut := overHTTP(t, addr, token, "ui-sessions", "revoke")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1 web UI session(s) ended")
	require.Equal(t, http.StatusSeeOther, uiPage(t, addr, cookie), "signed out")

	cookie = uiSignIn(t, addr, token)
	other := uiSignIn(t, addr, token)
	code, out, errOut = run(t, db, "ui-sessions", "revoke", "--json")
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"revoked": 2}`, out)
	require.Equal(t, http.StatusSeeOther, uiPage(t, addr, cookie))
	require.Equal(t, http.StatusSeeOther, uiPage(t, addr, other))

	code, out, _ = overHTTP(t, addr, "wrong-token-wrong-token", "ui-sessions", "revoke", "--json")
	require.Equal(t, 1, code)
	require.Contains(t, out, `"code":"unauthorized"`)
	require.NotContains(t, out, "wrong-token-wrong-token")
	code, _, _ = run(t, db, "ui-sessions", "revoke", "extra")
	require.Equal(t, 2, code)

	// The same database served with a new token: the old token's session
	// no longer signs in there.
	cookie = uiSignIn(t, addr, token)
	rotated := serveForCLI(t, db, "cli-ui-sessions-rotated-0123456789")
	require.Equal(t, http.StatusSeeOther, uiPage(t, rotated, cookie))
	require.Equal(t, http.StatusOK, uiPage(t, addr, cookie), "the old token's server still takes it")
}

// --schema (or ENGINE_SCHEMA) puts every command on the tables of another
// schema; an installation in public is told to migrate, migrate moves
// it, and public is refused afterwards.
func TestCLISchema(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, out, errOut := run(t, db, "--schema", "acme_cli", "migrate", "up")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "migrate up (schema acme_cli): pgdurable versions [1 2 3")
	code, out, errOut = run(t, db, "--schema", "acme_cli", "start", "double", "--id", "in-acme", "--input", `{"n": 1}`)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "started")
	code, out, _ = run(t, db, "runs", "list")
	require.Equal(t, 0, code)
	require.NotContains(t, out, "in-acme", "the default schema's runs are others")
	var envOut bytes.Buffer
	code = commands.Execute(context.Background(), []string{"--database-url", db.URL, "runs", "list"}, withPayment(commands.Options{
		Workflows: workflows(), Stdout: &envOut, Stderr: io.Discard,
		Getenv: func(k string) string { return map[string]string{"ENGINE_SCHEMA": "acme_cli"}[k] },
	}))
	require.Equal(t, 0, code)
	require.Contains(t, envOut.String(), "in-acme")
	code, _, errOut = run(t, db, "--schema", "Acme", "runs", "list")
	require.Equal(t, 2, code, "a usage mistake")
	require.Contains(t, errOut, `schema name "Acme"`)

	// A mistyped schema is pointed at the ones that hold tables.
	code, _, errOut = run(t, db, "--schema", "acme_typo", "runs", "list")
	require.Equal(t, 1, code)
	require.True(t, strings.HasPrefix(errOut, "error: the database has no pgdurable tables in schema acme_typo; schemas acme_cli, pgdurable hold them: pass --schema"), errOut)
	require.Contains(t, errOut, "(pgdurable: listing runs: ERROR: relation", "PostgreSQL's words come after")
	code, out, _ = run(t, db, "--schema", "acme_typo", "runs", "list", "--json")
	require.Equal(t, 1, code)
	require.Contains(t, out, `"code":"not_migrated"`)
	code, _, errOut = run(t, db, "--schema", "acme_typo", "serve", "--listen", freePort(t))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "schema acme_typo holds no pgdurable tables; schemas acme_cli, pgdurable hold them")
	code, out, errOut = run(t, db, "--schema", "acme_typo", "migrate", "status")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "schema: acme_typo\n")
	require.Contains(t, out, "schemas acme_cli, pgdurable hold them")
	code, out, errOut = run(t, db, "--schema", "acme_typo", "migrate", "status", "--json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"schema":"acme_typo"`)
	require.Contains(t, out, `"other_schemas":["acme_cli","pgdurable"]`)
	// Over the HTTP API the server's schema is used: a --schema that would
	// change nothing is refused.
	var apiErr bytes.Buffer
	code = commands.Execute(context.Background(), []string{"--address", "127.0.0.1:1", "--schema", "acme_cli", "runs", "list"},
		commands.Options{Stdout: io.Discard, Stderr: &apiErr, Getenv: func(string) string { return "" }})
	require.Equal(t, 2, code)
	require.Contains(t, apiErr.String(), "over the HTTP API (127.0.0.1:1) the server's own schema is used")

	// An installation from before: its tables in public.
	_, err := db.Pool.Exec(context.Background(), `DROP SCHEMA pgdurable CASCADE`)
	require.NoError(t, err)
	code, _, errOut = run(t, db, "--schema", "public", "migrate", "up")
	require.Equal(t, 0, code, errOut)
	_, err = db.Pool.Exec(context.Background(), `COMMENT ON TABLE public.pgdurable_schema_migrations IS NULL`) // as the earlier version left it
	require.NoError(t, err)
	code, _, errOut = run(t, db, "serve", "--listen", freePort(t))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "pgdurable's tables are in schema public, where an earlier version kept them")
	code, out, errOut = run(t, db, "migrate", "status")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "schema: pgdurable\n")
	require.Contains(t, out, "pgdurable's tables are in schema public, where an earlier version kept them")
	code, out, _ = run(t, db, "runs", "list", "--json")
	require.Equal(t, 1, code)
	require.Contains(t, out, `"code":"not_migrated"`)
	require.Contains(t, out, "where an earlier version kept them")
	code, out, errOut = run(t, db, "migrate", "up")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "moved from schema public to schema pgdurable: tables pgdurable_schema_migrations, workflow_runs")
	code, _, errOut = run(t, db, "--schema", "public", "runs", "list")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "pgdurable's tables were moved from schema public to schema pgdurable: use --schema pgdurable")
}

// runs show says what a run whose workflow version no process registers
// waits for.
func TestRunsShowARunWaitingForItsVersion(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	legacy := engine.Define("double", func(ctx *engine.Context, _ in) (int, error) { return 0, nil }, &engine.WorkflowOpts{Version: 7})
	starter := enginetest.NewEngine(t, db, nil, false, legacy)
	r, err := legacy.Start(context.Background(), starter, in{N: 1}, &engine.StartOpts{WorkflowID: "old-1"})
	require.NoError(t, err)
	code, out, errOut := run(t, db, "runs", "show", "old-1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "waiting for  a process that registers double v7: no live engine process on its queue registers it", "no process at all yet")
	worker := enginetest.NewEngine(t, db, nil, true, workflows()...) // registers double v1 only
	require.Eventually(t, func() bool {
		run, err := worker.GetRun(context.Background(), r.RunID)
		require.NoError(t, err)
		return run.WaitingSince != nil // handed back
	}, 30*time.Second, 20*time.Millisecond)
	code, out, errOut = run(t, db, "runs", "show", "old-1")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `waiting for  a process that registers double v7, since \S+ \(\d+s\); processes that do not register it hand it back`, out)
	code, out, _ = run(t, db, "runs", "show", "old-1", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"waiting_for":"a process that registers double v7"`)
}

// runs show names the change (engine.Patched) a run took on the step
// after it, and --json lists it.
func TestRunsShowTheChangesARunTook(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	patched := engine.Define("patched", func(ctx *engine.Context, _ in) (int, error) {
		if engine.Patched(ctx, "fraud-check") {
			return engine.Step(ctx, "fraud_check", func(context.Context) (int, error) { return 1, nil }, nil)
		}
		return 0, nil
	}, nil)
	e := enginetest.NewEngine(t, db, nil, true, patched)
	r, err := patched.Start(context.Background(), e, in{N: 1}, &engine.StartOpts{WorkflowID: "patched-1"})
	require.NoError(t, err)
	enginetest.RequireRunCompleted(context.Background(), t, e, r.RunID, 0)
	code, out, errOut := run(t, db, "runs", "show", "patched-1")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `0 +fraud_check \(took change fraud-check\) +step +completed`, out)
	code, out, _ = run(t, db, "runs", "show", "patched-1", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"patches":["fraud-check"]`)
}

// queues list, pause and resume, and runs show's queue lines.
func TestQueuesCommands(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	code, out, errOut := run(t, db, "queues", "list")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "no queue")
	e := enginetest.NewEngine(t, db, nil, false, workflows()...)
	require.NoError(t, e.RegisterQueue("payments", engine.QueueOpts{Concurrency: 5, KeyConcurrency: 1, Workers: 3}))
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(func() { _ = e.StopAndCancel(context.Background()) })
	code, _, errOut = run(t, db, "queues", "pause", "payments", "--reason", "processor down", "--by", "alice")
	require.Equal(t, 0, code, errOut)
	res, err := e.StartJSON(context.Background(), "approval", []byte(`{}`), &engine.StartOpts{Queue: "payments", QueueKey: "cus_1"})
	require.NoError(t, err)
	code, out, errOut = run(t, db, "queues", "list")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `payments +paused \(processor down\) by alice +1 +\S+ +0 +5 at once, 1 per key +\S+:\d+ \(3 workers\)`, out)
	code, out, errOut = run(t, db, "runs", "show", res.RunID.String())
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "queue        payments, key cus_1")
	require.Contains(t, out, "waiting for  queue payments is paused (processor down, by alice), ready since")
	code, _, errOut = run(t, db, "queues", "resume", "payments")
	require.Equal(t, 0, code, errOut)
	require.Eventually(t, func() bool {
		r, err := e.GetRun(context.Background(), res.RunID)
		return err == nil && r.Status == engine.StatusWaiting // admitted: it waits for its approval signal
	}, 10*time.Second, 20*time.Millisecond)
	code, _, errOut = run(t, db, "queues", "pause", "nope")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "not defined")
}

// engine start puts a run in a queue with its key, priority and
// deduplication ID, on the database and over the API alike: a second
// start with the ID is refused as a duplicate, or answered with the open
// run that holds it.
func TestStartIntoAQueue(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	const token = "start-into-a-queue-token-0123456"
	addr := serveForCLI(t, db, token)
	for name, cli := range map[string]func(args ...string) (int, string, string){
		"database": func(args ...string) (int, string, string) { t.Helper(); return run(t, db, args...) },
		"api":      func(args ...string) (int, string, string) { t.Helper(); return overHTTP(t, addr, token, args...) },
	} {
		dedup := "dedup-" + name
		args := []string{"start", "double", "--input", `{"n": 1}`, "--queue", "unserved_cli", "--queue-key", "cus_" + name,
			"--priority", "5", "--key-weight", "2", "--deduplication-id", dedup}
		code, out, errOut := cli(args...)
		require.Equal(t, 0, code, name+": "+errOut)
		require.Contains(t, out, "started", name)
		runID := strings.Fields(out)[1]
		code, _, errOut = cli(args...)
		require.Equal(t, 1, code, name)
		require.Contains(t, errOut, "deduplication ID held by an open run", name)
		require.Contains(t, errOut, dedup, name)
		code, out, errOut = cli(append(args, "--return-duplicate")...)
		require.Equal(t, 0, code, name+": "+errOut)
		require.Contains(t, out, "run "+runID+" already exists: it holds the deduplication ID", name)
		code, out, errOut = cli("runs", "show", runID)
		require.Equal(t, 0, code, name+": "+errOut)
		require.Contains(t, out, "unserved_cli, key cus_"+name+", priority 5", name)
		require.Contains(t, out, "a process that serves queue unserved_cli", name)
		code, _, errOut = cli("start", "double", "--input", `{"n": 1}`, "--queue", "unserved_cli", "--priority", "5000")
		require.Equal(t, 1, code, name)
		require.Contains(t, errOut, "Priority 5000", name)
	}
}
