package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// Wait on a run that ends in another process returns as the end commits,
// notified, not at its next poll (a minute here).
func TestWaitIsNotifiedOfAnEndInAnotherProcess(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	wf := engine.Define("ends-elsewhere", func(ctx *engine.Context, n int) (int, error) {
		return engine.Step(ctx, "block", func(context.Context) (int, error) {
			<-release
			return n * 2, nil
		}, nil)
	}, nil)
	db := enginetest.NewDB(t)
	worker := newEngine(t, db, nil, true, wf)
	client := newEngine(t, db, nil, false, wf) // another process: it runs nothing
	ctx := testCtx(t)
	res, err := wf.Start(ctx, client, 21, nil)
	require.NoError(t, err)

	type result struct {
		out int
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		out, err := wf.Wait(ctx, client, res.RunID, time.Minute)
		got <- result{out, err, time.Now()}
	}()
	waitWatched(t, db, res.RunID)
	close(release)
	released := time.Now()
	select {
	case r := <-got:
		require.NoError(t, r.err)
		require.Equal(t, 42, r.out)
		require.Less(t, r.at.Sub(released), 2*time.Second, "notified, not polled")
	case <-time.After(20 * time.Second):
		t.Fatal("Wait did not return")
	}
	_, err = wf.Result(ctx, worker, res.RunID)
	require.NoError(t, err)
}

// A run that ends before Wait marks it watched, or that ends in Wait's own
// process, is seen without a notification.
func TestWaitSeesRunsThatEndedOrEndHere(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, double)
	ctx := testCtx(t)
	res, err := double.Start(ctx, b.engine, 4, nil)
	require.NoError(t, err)
	began := time.Now()
	out, err := double.Wait(ctx, b.engine, res.RunID, time.Minute)
	waited := time.Since(began)
	require.NoError(t, err)
	require.Equal(t, 8, out)
	out, err = double.Wait(ctx, b.engine, res.RunID, time.Minute) // ended already
	require.NoError(t, err)
	require.Equal(t, 8, out)
	var watched bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT watched FROM pgdurable.workflow_runs WHERE run_id = $1`), res.RunID).Scan(&watched))
	if waited < 40*time.Millisecond {
		// A Wait marks a run it has not seen end within 50 ms: on a loaded
		// machine this one may take that long, and is marked then.
		require.False(t, watched, "a run that ends where it was started is not marked")
	}
}

// A run parked as dead in another process notifies its Waits too.
func TestWaitIsNotifiedOfADeadRunInAnotherProcess(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	wf := engine.Define("dies-elsewhere", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "boom", func(context.Context) (int, error) {
			<-release
			panic("boom")
		}, nil)
	}, nil)
	db := enginetest.NewDB(t)
	newEngine(t, db, nil, true, wf)
	client := newEngine(t, db, nil, false, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, client, 0, nil)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		_, err := wf.Wait(ctx, client, res.RunID, time.Minute)
		got <- err
	}()
	waitWatched(t, db, res.RunID)
	close(release)
	select {
	case err := <-got:
		var runErr *engine.RunError
		require.ErrorAs(t, err, &runErr)
		require.Equal(t, engine.StatusDead, runErr.Status)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
	}
}

// A notification that never comes (here: the run unmarked behind Wait's
// back, so its end sends none) costs a Wait at most its one-second
// backstop read, not its poll (a minute here).
func TestWaitReadsItsRunEverySecondWhileNotified(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	wf := engine.Define("unnotified", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "block", func(context.Context) (int, error) {
			<-release
			return 1, nil
		}, nil)
	}, nil)
	db := enginetest.NewDB(t)
	newEngine(t, db, nil, true, wf)
	client := newEngine(t, db, nil, false, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, client, 0, nil)
	require.NoError(t, err)
	got := make(chan time.Time, 1)
	go func() {
		_, err := wf.Wait(ctx, client, res.RunID, time.Minute)
		assert.NoError(t, err)
		got <- time.Now()
	}()
	waitWatched(t, db, res.RunID)
	_, err = db.Pool.Exec(ctx, `UPDATE `+db.RunTable("workflow_runs", res.RunID)+` SET watched = false WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)
	close(release)
	released := time.Now()
	select {
	case at := <-got:
		require.Less(t, at.Sub(released), 3*time.Second, "the backstop read, not the poll")
	case <-time.After(20 * time.Second):
		t.Fatal("Wait did not return")
	}
}

// waitWatched waits until a Wait has marked runID watched.
func waitWatched(t *testing.T, db *enginetest.DB, runID uuid.UUID) {
	t.Helper()
	eventually(t, 10*time.Second, "the client's Wait to watch the run", func() bool {
		var watched bool
		require.NoError(t, db.Pool.QueryRow(context.Background(), db.SQL(`SELECT watched FROM pgdurable.workflow_runs WHERE run_id = $1`), runID).Scan(&watched))
		return watched
	})
}
