package engine_test

// Regression tests for faults found by attacking the engine: a paused
// worker, a worker that died between River's fetch and the claim, payloads
// that Postgres rejects, and garbage at the API's edge.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// A worker paused (SIGSTOP) in workflow code past its lease must not start
// the next step when it resumes: another worker has taken the run over and
// recorded that step. No record is pending, so only the lease check before
// each step stops it.
func TestPausedWorkerDoesNotStartStepsAfterTakeover(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	wfs := crashWorkflows(db.Pool)
	client := newEngine(t, db, nil, false, wfs...)
	ctx := testCtx(t)
	res, err := client.StartJSON(ctx, "crash-three", []byte(`{}`), nil)
	require.NoError(t, err)

	child := crashtest.StartWorker(t, db, time.Second, envPauseFirst+"=1")
	eventually(t, 30*time.Second, "the child to claim the run", func() bool {
		run, err := client.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		return run.Deliveries == 1
	})
	require.NoError(t, child.Process.Signal(syscall.SIGSTOP)) // inside its 2 s of workflow code

	worker := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true, wfs...)
	waitStatus(t, worker, res.RunID, engine.StatusCompleted, 30*time.Second)
	require.NoError(t, child.Process.Signal(syscall.SIGCONT))
	time.Sleep(2500 * time.Millisecond) // the child finishes its pause and reaches s1
	for _, s := range []string{"s1", "s2", "s3"} {
		require.Equal(t, 1, calls(t, db.Pool, res.RunID, s), s)
	}
}

// A worker paused while its flush of a record was committing must not
// start the next step when it resumes: the commit landed while it still
// held the lease, but by the time the reply reaches it another worker has
// taken the run over and finished it. The lease is checked again after the
// flush (found by an attack pass: the resumed worker ran the step again).
func TestWorkerPausedDuringItsFlushDoesNotStartTheNextStep(t *testing.T) {
	t.Parallel()
	enginetest.SkipOnCitus(t, "waits for the engine's write to queue behind the test's row lock in pg_stat_activity, which on Citus shows it on the worker node, not on the coordinator")
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	wfs := crashWorkflows(db.Pool)
	client := newEngine(t, db, nil, false, wfs...)
	ctx := testCtx(t)
	res, err := client.StartJSON(ctx, "crash-three", []byte(`{}`), nil)
	require.NoError(t, err)

	// While s1 runs (300 ms), hold the run row, so the child's flush of
	// s1's record (as s2 begins) waits on it.
	lock, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	child := crashtest.StartWorker(t, db, 2*time.Second, envSlowS1+"=1")
	eventually(t, 30*time.Second, "the child to run s1", func() bool { return calls(t, db.Pool, res.RunID, "s1") == 1 })
	_, err = lock.Exec(ctx, `SELECT 1 FROM `+db.RunTable("workflow_runs", res.RunID)+` WHERE run_id = $1 FOR UPDATE`, res.RunID)
	require.NoError(t, err)
	eventually(t, 30*time.Second, "the child's flush to wait for the row", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%pgdurable: workflow_steps record%'`).Scan(&n))
		return n > 0
	})
	require.NoError(t, child.Process.Signal(syscall.SIGSTOP))
	require.NoError(t, lock.Commit(ctx)) // the flush commits while the child is stopped
	eventually(t, 10*time.Second, "s1's record to land", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1`), res.RunID).Scan(&n))
		return n == 1
	})

	worker := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true, wfs...)
	waitStatus(t, worker, res.RunID, engine.StatusCompleted, 30*time.Second)
	require.NoError(t, child.Process.Signal(syscall.SIGCONT))
	time.Sleep(1500 * time.Millisecond) // the child gets its flush's reply and decides
	for _, s := range []string{"s1", "s2", "s3"} {
		require.Equal(t, 1, calls(t, db.Pool, res.RunID, s), "%s: called by processes %v (the paused child is %d, this test %d)",
			s, callers(t, db.Pool, res.RunID, s), child.Process.Pid, os.Getpid())
	}
}

// A worker that died after River fetched a ticket but before it claimed
// the run leaves the run unleased: the orphan sweep re-enqueues it.
func TestTicketOfDeadWorkerIsRedelivered(t *testing.T) {
	t.Parallel()
	wf := engine.Define("orphan", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "s", func(context.Context) (int, error) { return in, nil }, nil)
	}, nil)
	db := enginetest.NewDB(t)
	client := newEngine(t, db, nil, false, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, client, 7, nil)
	require.NoError(t, err)
	// The state River's fetch leaves a ticket in, in a worker then SIGKILLed
	// (a test-only write to River's table to stage that crash exactly).
	tag, err := db.Pool.Exec(ctx, `UPDATE pgdurable.river_job SET state = 'running', attempt = attempt + 1, attempted_at = now(),
		attempted_by = array_append(attempted_by, 'killed-worker') WHERE args->>'run_id' = $1`, res.RunID.String())
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	worker := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true, wf)
	start := time.Now()
	out, err := wf.Wait(ctx, worker, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out)
	t.Logf("redelivered and completed %s after the simulated crash", time.Since(start).Round(time.Millisecond))
	require.Less(t, time.Since(start), 10*time.Second)
}

// Error text that Postgres cannot store (NUL, invalid UTF-8) is made
// storable, so the failure is recorded as what it is, once.
func TestUnstorableErrorTextIsRecordedNotLooped(t *testing.T) {
	t.Parallel()
	var nulCalls, utf8Calls, panicCalls atomic.Int64
	retry := &engine.RetryPolicy{MaximumAttempts: 2, InitialInterval: 10 * time.Millisecond}
	nulErr := engine.Define("nul-err", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "s1", func(context.Context) (int, error) {
			nulCalls.Add(1)
			return 0, errors.New("upstream said \x00 bad")
		}, &engine.StepOpts{RetryPolicy: retry})
	}, nil)
	utf8Err := engine.Define("utf8-err", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "s1", func(context.Context) (int, error) {
			utf8Calls.Add(1)
			return 0, errors.New("upstream 502: body=" + string([]byte{0x8b, 0x1f, 0xff}))
		}, &engine.StepOpts{RetryPolicy: retry})
	}, nil)
	utf8Panic := engine.Define("utf8-panic", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "s1", func(context.Context) (int, error) {
			panicCalls.Add(1)
			panic(string([]byte{0xff, 0xfe, 'x', 0}))
		}, nil)
	}, nil)
	badName := engine.Define("bad-step-name", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "bad\x00name", func(context.Context) (int, error) { return 1, nil }, nil)
	}, nil)
	b := setup(t, &engine.Config{LeaseDuration: time.Second}, nulErr, utf8Err, utf8Panic, badName)
	ctx := testCtx(t)

	for _, tc := range []struct {
		wf     *engine.Workflow[int, int]
		calls  *atomic.Int64
		want   int64
		status engine.RunStatus
		class  engine.ErrorClass
	}{
		{nulErr, &nulCalls, 2, engine.StatusDead, engine.ClassTransient},
		{utf8Err, &utf8Calls, 2, engine.StatusDead, engine.ClassTransient},
		{utf8Panic, &panicCalls, 1, engine.StatusDead, engine.ClassPanic},
	} {
		res, err := tc.wf.Start(ctx, b.engine, 1, nil)
		require.NoError(t, err)
		run := waitStatus(t, b.engine, res.RunID, tc.status, 20*time.Second)
		require.Equal(t, tc.class, run.Error.Class, tc.wf.Name())
		require.Equal(t, tc.want, tc.calls.Load(), tc.wf.Name())
		require.Equal(t, 1, run.Deliveries, tc.wf.Name())
		require.Contains(t, openDeadJob(t, b.engine, res.RunID).ErrorMessage, "\uFFFD")
	}
	res, err := badName.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusFailed, 20*time.Second)
	require.Contains(t, run.Error.Message, "NUL")
}

func TestStartRejectsTextPostgresCannotStore(t *testing.T) {
	t.Parallel()
	type in struct {
		ID string `json:"id"`
	}
	wf := engine.Define("text", func(ctx *engine.Context, in in) (string, error) { return in.ID, nil }, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	for _, id := range []string{"a\x00b", string([]byte{0xff}), strings.Repeat("x", 401), ""} {
		_, err := wf.Start(ctx, b.engine, in{ID: "x"}, &engine.StartOpts{WorkflowID: id})
		if id == "" {
			require.NoError(t, err, "an empty workflow ID means: use the run ID")
			continue
		}
		require.ErrorIs(t, err, engine.ErrInvalidInput, "%q", id)
	}
	for _, input := range []string{`{"id":"a\u0000"}`, "{\"id\":\"\xff\"}", `{}}`, `{"id": 1}`} {
		_, err := b.engine.StartJSON(ctx, "text", []byte(input), nil)
		require.ErrorIs(t, err, engine.ErrInvalidInput, "%q", input)
	}
	_, err := wf.Start(ctx, b.engine, in{ID: "nul\x00"}, nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)

	// Rejected before Postgres sees it, so the caller's transaction lives on.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = b.engine.StartJSONTx(ctx, tx, "text", []byte(`{"id":"a\u0000"}`), nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	res, err := b.engine.StartJSONTx(ctx, tx, "text", []byte(`{"id":"ok"}`), nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "ok", out)
}

// Stop lets the running step finish and hands the run back at the next
// step boundary instead of running the workflow to its end.
func TestStopHandsBackAtStepBoundary(t *testing.T) {
	t.Parallel()
	var steps atomic.Int64
	inStep := make(chan struct{}, 1)
	wf := engine.Define("ten-slow", func(ctx *engine.Context, in int) (int, error) {
		for i := range 10 {
			if _, err := engine.Step(ctx, "s"+string(rune('a'+i)), func(context.Context) (int, error) {
				steps.Add(1)
				select {
				case inStep <- struct{}{}:
				default:
				}
				time.Sleep(200 * time.Millisecond)
				return i, nil
			}, nil); err != nil {
				return 0, err
			}
		}
		return 10, nil
	}, nil)
	db := enginetest.NewDB(t)
	e1 := newEngine(t, db, &engine.Config{LeaseDuration: time.Hour}, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e1, 1, nil)
	require.NoError(t, err)
	<-inStep
	start := time.Now()
	require.NoError(t, e1.Stop(ctx))
	require.Less(t, time.Since(start), time.Second, "Stop waits for one step, not ten")
	run, err := e1.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status)
	require.Len(t, run.Steps, 1)
	require.Equal(t, "completed", string(run.Steps[0].Status))

	e2 := newEngine(t, db, &engine.Config{LeaseDuration: time.Hour}, true, wf)
	out, err := wf.Wait(ctx, e2, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 10, out)
	require.EqualValues(t, 10, steps.Load(), "no step ran twice")
}

var _ pgx.Tx

// gatedTwoSteps is a two-step workflow whose first delivery of s1 waits
// (after closing inStep) until release is closed; s1 and s2 count calls.
type gatedTwoSteps struct {
	wf              *engine.Workflow[int, int]
	inStep, release chan struct{}
	s1, s2          atomic.Int32
}

func newGatedTwoSteps(name string) *gatedTwoSteps {
	g := &gatedTwoSteps{inStep: make(chan struct{}), release: make(chan struct{})}
	g.wf = engine.Define(name, func(ctx *engine.Context, in int) (int, error) {
		if _, err := engine.Step(ctx, "s1", func(context.Context) (int, error) {
			if g.s1.Add(1) == 1 {
				close(g.inStep)
				<-g.release
			}
			return 1, nil
		}, nil); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "s2", func(context.Context) (int, error) { g.s2.Add(1); return in, nil }, nil)
	}, nil)
	return g
}

// The claim commits asynchronously, so a PostgreSQL crash can lose it while
// its delivery runs a step: the run is back to unowned and the delivery's
// first write fails its fence. Nobody else holds the run and its ticket
// completes, so the losing delivery must re-enqueue it (staged here by
// undoing the claim with a test-only write).
func TestRunOfLostClaimIsRedelivered(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	g := newGatedTwoSteps("lost-claim")
	wf, inStep, release, s1, s2 := g.wf, g.inStep, g.release, &g.s1, &g.s2
	worker := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, worker, 5, nil)
	require.NoError(t, err)
	<-inStep
	tag, err := db.Pool.Exec(ctx, `UPDATE `+db.RunTable("workflow_runs", res.RunID)+` SET owner_token = NULL, lease_expires_at = NULL, status = 'pending',
		deliveries = deliveries - 1 WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	close(release)

	out, err := wf.Wait(ctx, worker, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 5, out)
	require.EqualValues(t, 2, s1.Load(), "s1 ran in the lost delivery and again in the next")
	require.EqualValues(t, 1, s2.Load(), "the losing delivery started nothing after its fence failed")
}

// The crash that loses a claim also breaks the delivery's connection, so
// its next write fails with a connection error rather than a failed fence.
// Found by `engine chaos` with an immediate (crash) PostgreSQL restart: the
// delivery logged the failed write and let its ticket complete, and the run
// stayed pending with no ticket and no lease to expire. Staged here: the
// claim is undone in a transaction that holds the run's row, the
// delivery's write blocks on it and its backend is terminated.
func TestFailedWriteAfterLostClaimIsRedelivered(t *testing.T) {
	t.Parallel()
	enginetest.SkipOnCitus(t, "waits for the engine's write to queue behind the test's row lock in pg_stat_activity, which on Citus shows it on the worker node, not on the coordinator")
	db := enginetest.NewDB(t)
	g := newGatedTwoSteps("lost-claim-eof")
	wf, inStep, release, s1 := g.wf, g.inStep, g.release, &g.s1
	worker := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, worker, 6, nil)
	require.NoError(t, err)
	<-inStep

	crash, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = crash.Rollback(ctx) }()
	_, err = crash.Exec(ctx, `UPDATE `+db.RunTable("workflow_runs", res.RunID)+` SET owner_token = NULL, lease_expires_at = NULL, status = 'pending',
		deliveries = deliveries - 1 WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)
	close(release) // s1's record write now waits for the row
	eventually(t, 10*time.Second, "the delivery's write to wait on the run's row", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%workflow_steps%'`).Scan(&n))
		return n == 1
	})
	require.NoError(t, crash.Commit(ctx))

	out, err := wf.Wait(ctx, worker, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 6, out)
	require.EqualValues(t, 2, s1.Load())
}

// A step result that encodes as JSON but that PostgreSQL refuses to store
// (a number beyond jsonb's numeric range) fails the same way on every
// delivery. It used to be retried until the run was parked as crash_loop,
// which hid the cause; the run is parked at once with PostgreSQL's reason.
func TestRecordPostgresRejectsParksWithItsReason(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	wf := engine.Define("unstorable", func(ctx *engine.Context, _ int) (json.RawMessage, error) {
		if _, err := engine.Step(ctx, "huge", func(context.Context) (json.RawMessage, error) {
			calls.Add(1)
			return json.RawMessage(`1e1000000`), nil
		}, nil); err != nil {
			return nil, err
		}
		return engine.Step(ctx, "next", func(context.Context) (json.RawMessage, error) { return json.RawMessage(`1`), nil }, nil)
	}, nil)
	b := setup(t, &engine.Config{LeaseDuration: time.Second}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusDead, 20*time.Second)
	dead, _, err := b.engine.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: res.RunID})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, engine.ReasonPermanentError, dead[0].Reason)
	require.Contains(t, dead[0].ErrorMessage, "value overflows numeric format")
	require.EqualValues(t, 1, calls.Load(), "parked on the first delivery")
	require.Equal(t, 1, run.Deliveries)
}
