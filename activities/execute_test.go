package activities_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// 503, then a timeout, then 200: three attempts, one idempotency key, one
// charge, although every attempt's body carries a different nonce.
func TestTransientFailuresRetryWithOneKey(t *testing.T) {
	t.Parallel()
	api, srv := newFakeAPI(t)
	api.script = []func(http.ResponseWriter, *http.Request) bool{status(503), hang(2 * time.Second)}
	wf := chargeWorkflow(srv.URL, func(a *activities.Activity[chargeReq, chargeResp]) {
		a.StartToCloseTimeout = 300 * time.Millisecond
	})
	db := enginetest.NewDB(t)
	e := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e, chargeReq{OrderID: "ord_1", Amount: 4999}, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "ch_1", out.ID)

	reqs, keys, charges := api.snapshot()
	require.Len(t, reqs, 3)
	require.Len(t, keys, 1, "every attempt sends the same key")
	require.Equal(t, 1, charges)
	require.NotEqual(t, reqs[0].Nonce, reqs[2].Nonce, "the request body changed; the key did not")
	run := runOf(t, e, res.RunID)
	require.Equal(t, "activity", string(run.Steps[0].Kind))
	require.Equal(t, 3, run.Steps[0].Attempts)
	require.Equal(t, reqs[0].Key, run.Steps[0].RequestID.String(), "the key is the stored request ID")
}

// Activity.ScheduleToCloseTimeout bounds the activity as a whole: its
// retries stop at it and the run is parked with the timeout, long before
// its 100 attempts.
func TestScheduleToCloseTimeoutEndsTheRetries(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	a := &activities.Activity[int, int]{Name: "flaky", ScheduleToCloseTimeout: 500 * time.Millisecond,
		RetryPolicy: &engine.RetryPolicy{InitialInterval: 150 * time.Millisecond, BackoffCoefficient: 1, MaximumAttempts: 100},
		Fn: func(context.Context, activities.Call, int) (int, error) {
			calls.Add(1)
			return 0, errors.New("upstream unavailable")
		}}
	wf := engine.Define("s2c", func(ctx *engine.Context, in int) (int, error) { return activities.Execute(ctx, a, in) }, nil)
	e := newEngine(t, enginetest.NewDB(t), nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e, 1, nil)
	require.NoError(t, err)
	enginetest.RequireRunStatus(ctx, t, e, res.RunID, engine.StatusDead, 10*time.Second)
	jobs, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: res.RunID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, engine.ClassTimeout, jobs[0].ErrorClass)
	require.Contains(t, jobs[0].ErrorMessage, "schedule-to-close")
	require.LessOrEqual(t, calls.Load(), int64(4), "stopped by the deadline, not after 100 attempts")
}

func TestClientErrorIsPermanent(t *testing.T) {
	t.Parallel()
	api, srv := newFakeAPI(t)
	api.script = []func(http.ResponseWriter, *http.Request) bool{status(400)}
	wf := chargeWorkflow(srv.URL)
	db := enginetest.NewDB(t)
	e := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e, chargeReq{OrderID: "ord_2", Amount: -1}, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusFailed, runErr.Status)
	require.Equal(t, "http_400", string(runErr.Info.Class))
	require.Contains(t, runErr.Info.Message, "scripted 400")
	reqs, _, _ := api.snapshot()
	require.Len(t, reqs, 1)
	step := runOf(t, e, res.RunID).Steps[0]
	require.Equal(t, "failed", string(step.Status))
	require.Equal(t, "http_400", string(step.Error.Class))
}

func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	api, srv := newFakeAPI(t)
	api.script = []func(http.ResponseWriter, *http.Request) bool{status(429, "Retry-After", "2")}
	wf := chargeWorkflow(srv.URL)
	db := enginetest.NewDB(t)
	e := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e, chargeReq{OrderID: "ord_3", Amount: 100}, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	reqs, keys, _ := api.snapshot()
	require.Len(t, reqs, 2)
	require.Len(t, keys, 1)
	require.GreaterOrEqual(t, reqs[1].At.Sub(reqs[0].At), 2*time.Second)
}

// The worker is SIGKILLed after the API applied the charge and before the
// response is recorded. The next worker calls again with the same key; the
// API answers with the stored charge: 2 requests, 1 key, 1 charge.
func TestCrashBetweenCallAndRecordReusesTheKey(t *testing.T) {
	t.Parallel()
	api, srv := newFakeAPI(t)
	api.hangAfterCharge = true
	wf := chargeWorkflow(srv.URL)
	db := enginetest.NewDB(t)
	client := newEngine(t, db, nil, false, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, client, chargeReq{OrderID: "ord_4", Amount: 4999}, nil)
	require.NoError(t, err)

	child := crashtest.StartWorker(t, db, time.Second, envChildAPI+"="+srv.URL)
	select {
	case <-api.processed:
	case <-ctx.Done():
		t.Fatal("the child never called the API")
	}
	crashtest.Kill(t, child)

	worker := newEngine(t, db, &engine.Config{LeaseDuration: time.Second}, true, wf)
	out, err := wf.Wait(ctx, worker, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "ch_1", out.ID)
	require.True(t, out.Replayed, "the API replayed its stored response")
	reqs, keys, charges := api.snapshot()
	require.Len(t, reqs, 2)
	require.Len(t, keys, 1)
	require.Equal(t, 1, charges)
	run := runOf(t, worker, res.RunID)
	require.Equal(t, engine.StatusCompleted, run.Status)
	// The killed attempt counts: it was announced before the call, so the
	// retry after the crash is attempt 2.
	require.Equal(t, 2, run.Steps[0].Attempts, "one attempt per real try, the killed one included")
}

// An operator's replay of a run parked after the activity exhausted its
// retries calls the API with the same key again.
func TestReplayAfterExhaustedRetriesKeepsTheKey(t *testing.T) {
	t.Parallel()
	api, srv := newFakeAPI(t)
	api.script = []func(http.ResponseWriter, *http.Request) bool{status(503), status(503)}
	wf := chargeWorkflow(srv.URL, func(a *activities.Activity[chargeReq, chargeResp]) {
		a.RetryPolicy = &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumAttempts: 2}
	})
	db := enginetest.NewDB(t)
	e := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e, chargeReq{OrderID: "ord_5", Amount: 10}, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusDead, runErr.Status)
	require.Equal(t, "http_503", string(runErr.Info.Class))

	jobs, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: res.RunID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, "retries_exhausted", string(jobs[0].Reason))
	_, err = e.ReplayDeadJob(ctx, jobs[0].ID, nil)
	require.NoError(t, err)
	_, err = wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	reqs, keys, charges := api.snapshot()
	require.Len(t, reqs, 3)
	require.Len(t, keys, 1)
	require.Equal(t, 1, charges)
}

// A heartbeating activity that runs 3.5x the lease keeps it: with a second
// engine sweeping and fetching, it is started once.
func TestHeartbeatingActivityOutlivesTheLease(t *testing.T) {
	t.Parallel()
	var starts atomic.Int64
	long := &activities.Activity[int, int]{
		Name: "long",
		Fn: func(ctx context.Context, call activities.Call, n int) (int, error) {
			starts.Add(1)
			deadline := time.Now().Add(3500 * time.Millisecond)
			for time.Now().Before(deadline) {
				if err := call.Heartbeat(ctx); err != nil {
					return 0, err
				}
				time.Sleep(100 * time.Millisecond)
			}
			return n, nil
		},
		HeartbeatTimeout: time.Second,
	}
	wf := engine.Define("long", func(ctx *engine.Context, n int) (int, error) { return activities.Execute(ctx, long, n) }, nil)
	db := enginetest.NewDB(t)
	cfg := &engine.Config{LeaseDuration: time.Second, SweepInterval: 50 * time.Millisecond}
	e1 := newEngine(t, db, cfg, true, wf)
	newEngine(t, db, cfg, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e1, 7, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, e1, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out)
	require.EqualValues(t, 1, starts.Load())
}

// An attempt that stops heartbeating is abandoned and retried, with the
// same request ID.
func TestStuckActivityIsRetriedWithTheSameRequestID(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var keys []string
	stuck := &activities.Activity[int, int]{
		Name: "stuck-once",
		Fn: func(ctx context.Context, call activities.Call, n int) (int, error) {
			mu.Lock()
			keys = append(keys, call.IdempotencyKey())
			mu.Unlock()
			if call.Attempt == 1 {
				<-ctx.Done() // hangs without heartbeating until abandoned
				return 0, ctx.Err()
			}
			return n, nil
		},
		HeartbeatTimeout: 200 * time.Millisecond,
		RetryPolicy:      &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond},
	}
	wf := engine.Define("stuck", func(ctx *engine.Context, n int) (int, error) { return activities.Execute(ctx, stuck, n) }, nil)
	db := enginetest.NewDB(t)
	e := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e, 3, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 3, out)
	require.Len(t, keys, 2)
	require.Equal(t, keys[0], keys[1])
	require.Equal(t, 2, runOf(t, e, res.RunID).Steps[0].Attempts)
}

func TestExecuteReplaysRecordedResponse(t *testing.T) {
	t.Parallel()
	api, srv := newFakeAPI(t)
	charge := chargeActivity(srv.URL, nil)
	var later atomic.Int64
	wf := engine.Define("charge-then-wait", func(ctx *engine.Context, in chargeReq) (string, error) {
		resp, err := activities.Execute(ctx, charge, in)
		if err != nil {
			return "", err
		}
		_, err = engine.Step(ctx, "later", func(context.Context) (int, error) {
			if later.Add(1) == 1 {
				return 0, engine.RetryAfter(errors.New("not yet"), 1200*time.Millisecond)
			}
			return 1, nil
		}, nil)
		return resp.ID, err
	}, nil)
	db := enginetest.NewDB(t)
	e := newEngine(t, db, nil, true, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, e, chargeReq{OrderID: "ord_6", Amount: 1}, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "ch_1", out)
	reqs, _, _ := api.snapshot()
	require.Len(t, reqs, 1, "the second delivery replayed the recorded response without calling")
	require.Equal(t, 2, runOf(t, e, res.RunID).Deliveries)
}
