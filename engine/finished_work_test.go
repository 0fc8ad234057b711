package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// An activity that answers after StopAndCancel cancelled its context, while
// its delivery still holds the lease, has its result recorded as the run is
// handed back: the next worker replays it instead of calling it again.
// Before, the answer was thrown away and the next worker called the API a
// second time.
func TestActivityAnsweringAfterStopAndCancelIsRecorded(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	inCall := make(chan struct{}, 1)
	wf := engine.Define("late-answer", func(ctx *engine.Context, _ int) (string, error) {
		ch, err := engine.RunActivity(ctx, "charge", func(actx context.Context, _ *engine.ActivityAttempt) (string, error) {
			calls.Add(1)
			inCall <- struct{}{}
			<-actx.Done()
			time.Sleep(300 * time.Millisecond)
			return "ch_1", nil
		}, nil)
		if err != nil {
			return "", err
		}
		return engine.Step(ctx, "after", func(context.Context) (string, error) { return ch + "+after", nil }, nil)
	}, nil)
	db := enginetest.NewDB(t)
	e1 := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e1, 0, nil)
	require.NoError(t, err)
	<-inCall
	require.NoError(t, e1.StopAndCancel(ctx))
	run, err := e1.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status, "handed back")
	require.Equal(t, "completed", string(run.Steps[0].Status), "the late answer is recorded")

	e2 := newEngine(t, db, nil, true, wf)
	out, err := wf.Wait(ctx, e2, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "ch_1+after", out)
	require.EqualValues(t, 1, calls.Load(), "the API is called once")
}

// A record write that fails for a transient reason (a serialization
// failure, a dropped connection: both injected by a trigger on the real
// table, firing once) is tried again under the same fence; the delivery
// carries on and the step's side effect runs once. Before, the delivery
// ended and the next one ran the step again.
func TestTransientRecordWriteFailureIsRetried(t *testing.T) {
	t.Parallel()
	enginetest.SkipOnCitus(t, "injects the fault with a trigger on the steps' table, which Citus refuses on a distributed table")
	for _, fault := range []string{
		`RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001'`,
		`PERFORM pg_terminate_backend(pg_backend_pid())`, // the write's own connection drops
	} {
		t.Run(fault[:5], func(t *testing.T) {
			t.Parallel()
			var charges atomic.Int32
			wf := engine.Define("write-retry", func(ctx *engine.Context, _ int) (int, error) {
				if _, err := engine.Step(ctx, "charge", func(context.Context) (int, error) { return int(charges.Add(1)), nil }, nil); err != nil {
					return 0, err
				}
				return engine.Step(ctx, "after", func(context.Context) (int, error) { return 2, nil }, nil)
			}, nil)
			b := setup(t, nil, wf)
			ctx := testCtx(t)
			// nextval is not rolled back with the failed write: the fault
			// fires for the first write of charge's record only.
			_, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`
				CREATE SEQUENCE fault_once;
				CREATE FUNCTION inject_fault() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					IF NEW.name = 'charge' AND NEW.status = 'completed' AND nextval('fault_once') = 1 THEN
						%s;
					END IF;
					RETURN NEW;
				END $$;
				`, fault))
			require.NoError(t, err)
			for _, steps := range b.db.RouteTables("workflow_steps") {
				_, err := b.db.Pool.Exec(ctx, `CREATE TRIGGER inject_fault BEFORE INSERT OR UPDATE ON `+steps+` FOR EACH ROW EXECUTE FUNCTION inject_fault()`)
				require.NoError(t, err)
			}
			res, err := wf.Start(ctx, b.engine, 0, nil)
			require.NoError(t, err)
			out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
			require.NoError(t, err)
			require.Equal(t, 2, out)
			require.EqualValues(t, 1, charges.Load(), "the side effect ran once")
			var fired int64
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT last_value FROM fault_once`).Scan(&fired))
			require.GreaterOrEqual(t, fired, int64(2), "the fault fired and the write was tried again")
			run, err := b.engine.GetRun(ctx, res.RunID)
			require.NoError(t, err)
			require.Equal(t, 1, run.Deliveries)
		})
	}
}

// An undo that fails parks the run as compensation_failed with the undo's
// error, and keeps the failure that started the compensation: on the run's
// error and on the dead job.
func TestFailedCompensationKeepsTheForwardFailure(t *testing.T) {
	t.Parallel()
	wf := engine.Define("undo-fails", func(ctx *engine.Context, _ int) (int, error) {
		if _, err := engine.Step(ctx, "reserve", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return 0, err
		}
		if err := ctx.Compensate(engine.Undo{Name: "release", Fn: func(context.Context, *engine.ActivityAttempt) error {
			return engine.Permanent(errors.New("inventory service rejected the release"))
		}}); err != nil {
			return 0, err
		}
		return engine.Step(ctx, "charge", func(context.Context) (int, error) {
			return 0, engine.Permanent(&declineError{Reason: "do_not_honor"})
		}, nil)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusDead, 10*time.Second)
	require.Contains(t, run.Error.Message, "inventory service rejected the release")
	require.NotNil(t, run.Error.ForwardError)
	require.Contains(t, run.Error.ForwardError.Message, "declined: do_not_honor")
	var de *declineError
	require.ErrorAs(t, run.Error.ForwardError.Err(), &de, "the forward failure keeps its identity")
	dj := openDeadJob(t, b.engine, res.RunID)
	require.Equal(t, engine.ReasonCompensationFailed, dj.Reason)
	require.Contains(t, dj.ErrorMessage, "inventory service rejected the release")
	require.NotNil(t, dj.ForwardError)
	require.Equal(t, run.Error.ForwardError.Message, dj.ForwardError.Message)
	require.Equal(t, 1, dj.Deliveries)
}

// A run parked for a crash loop says how many times it was delivered and
// how many deliveries died in a row, and names the step they died in.
func TestCrashLoopDeadJobCarriesDeliveriesAndAttempts(t *testing.T) {
	t.Parallel()
	wf := engine.Define("looped", func(ctx *engine.Context, _ int) (string, error) {
		return engine.RunActivity(ctx, "call", func(context.Context, *engine.ActivityAttempt) (string, error) { return "x", nil }, nil)
	}, nil)
	db := enginetest.NewDB(t)
	client := newEngine(t, db, nil, false, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, client, 0, nil)
	require.NoError(t, err)
	// As if 10 deliveries had claimed it and each died in its call.
	_, err = db.Pool.Exec(ctx, `
		WITH run AS (UPDATE `+db.RunTable("workflow_runs", res.RunID)+` SET deliveries = 10, stalled_deliveries = 10 WHERE run_id = $1 RETURNING run_id)
		INSERT INTO `+db.RunTable("workflow_steps", res.RunID)+` (run_id, seq, name, kind, status, attempts, request_id, started_at)
		SELECT run_id, 0, 'call', 'activity', 'started', 3, gen_random_uuid(), now() FROM run`, res.RunID)
	require.NoError(t, err)
	worker := newEngine(t, db, nil, true, wf)
	run := waitStatus(t, worker, res.RunID, engine.StatusDead, 10*time.Second)
	require.Equal(t, engine.ClassCrashLoop, run.Error.Class)
	dj := openDeadJob(t, worker, res.RunID)
	require.Equal(t, engine.ReasonCrashLoop, dj.Reason)
	require.Equal(t, 11, dj.Deliveries, "10 died, the 11th parked it")
	require.Equal(t, 10, dj.Attempts, "the deliveries that died in a row")
	require.Equal(t, "call", dj.StepName)
	require.NotNil(t, dj.Seq)
	require.Equal(t, 0, *dj.Seq)
}
