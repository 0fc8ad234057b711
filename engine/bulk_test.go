package engine_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// CancelRuns cancels the active runs a filter matches, after a dry run
// that counts them and changes nothing; runs of other workflows or other
// prefixes are left alone. ReplayDeadJobs replays the open dead jobs of a
// workflow once the bug is fixed, DiscardDeadJobs discards the rest.
func TestBulkCancelReplayAndDiscard(t *testing.T) {
	t.Parallel()
	waits := engine.Define("bulk-waits", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "never", 0)
	}, nil)
	var fixed atomic.Bool
	flaky := engine.Define("bulk-flaky", func(ctx *engine.Context, _ int) (int, error) {
		return engine.Step(ctx, "call", func(context.Context) (int, error) {
			if !fixed.Load() {
				panic("bug")
			}
			return 1, nil
		}, nil)
	}, nil)
	b := setup(t, nil, waits, flaky)
	ctx := testCtx(t)
	for i := range 6 {
		id := fmt.Sprintf("batch-a-%d", i)
		if i >= 4 {
			id = fmt.Sprintf("batch-b-%d", i)
		}
		_, err := waits.Start(ctx, b.engine, i, &engine.StartOpts{WorkflowID: id})
		require.NoError(t, err)
	}
	for i := range 3 {
		_, err := flaky.Start(ctx, b.engine, i, nil)
		require.NoError(t, err)
	}
	eventually(t, 10*time.Second, "six waiting runs and three dead ones", func() bool {
		var waiting, dead int
		require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FILTER (WHERE status = 'waiting'), count(*) FILTER (WHERE status = 'dead')
			FROM pgdurable.workflow_runs`)).Scan(&waiting, &dead))
		return waiting == 6 && dead == 3
	})

	dry, err := b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Workflow: "bulk-waits", WorkflowIDPrefix: "batch-a-"}, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, engine.BulkResult{Matched: 4, DryRun: true}, dry)
	res, err := b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Workflow: "bulk-waits", WorkflowIDPrefix: "batch-a-"}, DryRun: false})
	require.NoError(t, err)
	require.Equal(t, engine.BulkResult{Matched: 4, Done: 4}, res)
	eventually(t, 10*time.Second, "the four to end cancelled", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE status = 'cancelled'`)).Scan(&n))
		return n == 4
	})
	var stillWaiting int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE status = 'waiting'`)).Scan(&stillWaiting))
	require.Equal(t, 2, stillWaiting, "batch-b runs are left alone")
	_, err = b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Status: engine.StatusCompleted}, DryRun: true})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	require.ErrorContains(t, err, `a bulk cancel takes a status of pending, running or waiting, not "completed"`)
	// A compensating run is ending already (Cancel changes nothing for it,
	// and a bulk cancel without a status leaves it alone): the status is
	// refused rather than matched and counted as cancelled. Before, it
	// was accepted, and the message listed it as accepted.
	_, err = b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Status: engine.StatusCompensating}, DryRun: true})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	require.ErrorContains(t, err, `not "compensating"`)

	fixed.Store(true)
	dry, err = b.engine.ReplayDeadJobs(ctx, engine.ResolveDeadJobsParams{Filter: engine.ListDeadJobsParams{Workflow: "bulk-flaky"}, DryRun: true}, nil)
	require.NoError(t, err)
	require.Equal(t, 3, dry.Matched)
	res, err = b.engine.ReplayDeadJobs(ctx, engine.ResolveDeadJobsParams{Filter: engine.ListDeadJobsParams{Workflow: "bulk-flaky"}, DryRun: false}, &engine.ResolveOpts{By: "ann"})
	require.NoError(t, err)
	require.Equal(t, 3, res.Done)
	eventually(t, 10*time.Second, "the replayed runs to complete", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE workflow_name = 'bulk-flaky' AND status = 'completed'`)).Scan(&n))
		return n == 3
	})
	res, err = b.engine.DiscardDeadJobs(ctx, engine.ResolveDeadJobsParams{Filter: engine.ListDeadJobsParams{Workflow: "bulk-flaky"}, DryRun: false}, nil)
	require.NoError(t, err)
	require.Zero(t, res.Matched, "no open dead job is left")
}

// A bulk cancel needs a filter (an empty one would cancel every run), and
// bulk cancels running at once each count only the runs they cancelled:
// 400 runs cancelled by three concurrent calls are 400 in all, not 400
// each (found by an attack pass).
func TestBulkCancelNeedsAFilterAndCountsWhatItChanged(t *testing.T) {
	t.Parallel()
	waits := engine.Define("bulk-count-waits", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "never", 0)
	}, nil)
	b := setup(t, nil, waits)
	ctx := testCtx(t)
	_, err := b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{}, DryRun: true})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
	require.ErrorContains(t, err, "a bulk cancel needs a filter")
	_, err = b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Status: engine.StatusWaiting}, DryRun: true})
	require.ErrorIs(t, err, engine.ErrInvalidArgument, "a status alone is no filter")

	const n = 400
	runs := make([]engine.StartParams[int], n)
	for i := range runs {
		runs[i] = engine.StartParams[int]{Input: i}
	}
	_, err = waits.StartMany(ctx, b.engine, runs)
	require.NoError(t, err)
	eventually(t, 30*time.Second, "every run waiting", func() bool {
		var waiting int
		require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE status = 'waiting'`)).Scan(&waiting))
		return waiting == n
	})
	var wg sync.WaitGroup
	results := make([]engine.BulkResult, 3)
	for i := range results {
		wg.Go(func() {
			var err error
			results[i], err = b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Workflow: "bulk-count-waits"}, DryRun: false})
			require.NoError(t, err)
		})
	}
	wg.Wait()
	done := 0
	for _, r := range results {
		done += r.Done
		require.Equal(t, r.Matched, r.Done+r.Skipped)
	}
	require.Equal(t, n, done, "each run counted once, by the call that cancelled it: %+v", results)
}

// A bulk replay or discard needs a filter too, and checks its by and note
// before anything is matched, so a dry run refuses what the real call
// would (found by an attack pass: {} matched every open dead job).
func TestBulkDeadJobActionsNeedAFilter(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := testCtx(t)
	for _, act := range []func(engine.ListDeadJobsParams, *engine.ResolveOpts, bool) (engine.BulkResult, error){
		func(p engine.ListDeadJobsParams, o *engine.ResolveOpts, dry bool) (engine.BulkResult, error) {
			return b.engine.ReplayDeadJobs(ctx, engine.ResolveDeadJobsParams{Filter: p, DryRun: dry}, o)
		},
		func(p engine.ListDeadJobsParams, o *engine.ResolveOpts, dry bool) (engine.BulkResult, error) {
			return b.engine.DiscardDeadJobs(ctx, engine.ResolveDeadJobsParams{Filter: p, DryRun: dry}, o)
		},
	} {
		_, err := act(engine.ListDeadJobsParams{}, nil, true)
		require.ErrorIs(t, err, engine.ErrInvalidArgument)
		require.ErrorContains(t, err, "needs a filter")
		_, err = act(engine.ListDeadJobsParams{Workflow: "none"}, &engine.ResolveOpts{By: "a\u202eb"}, true)
		require.ErrorIs(t, err, engine.ErrInvalidArgument, "checked on a dry run too")
		res, err := act(engine.ListDeadJobsParams{Workflow: "none"}, nil, true)
		require.NoError(t, err)
		require.Zero(t, res.Matched)
	}
}

// A bulk cancel reaches a run that moves between statuses while it lists
// them: listed status by status, a run that went from a status not listed
// yet to one listed already was in neither list (an attack pass's bulk
// cancel of 40 payments retrying against a gateway that was down, waiting
// out their backoffs and running again, cancelled 35 and said there were
// no more). Here the move is made between the lists.
func TestBulkCancelReachesARunMovingBetweenStatuses(t *testing.T) {
	t.Parallel()
	waits := engine.Define("bulk-moving", func(ctx *engine.Context, _ int) (int, error) {
		return engine.AwaitSignal[int](ctx, "never", 0)
	}, nil)
	b := setup(t, nil, waits)
	ctx := testCtx(t)
	const n = 5
	runs := make([]engine.StartParams[int], n)
	for i := range runs {
		runs[i] = engine.StartParams[int]{Input: i}
	}
	started, err := waits.StartMany(ctx, b.engine, runs)
	require.NoError(t, err)
	for _, s := range started {
		waitStatus(t, b.engine, s.RunID, engine.StatusWaiting, 30*time.Second)
	}
	mover := started[0].RunID
	var moved atomic.Bool
	engine.AfterBulkList(b.engine, func(s engine.RunStatus) {
		if s == engine.StatusRunning && moved.CompareAndSwap(false, true) {
			// Woken: the run is claimed again, after the running runs were
			// listed and before the waiting ones are.
			_, err := b.db.Pool.Exec(ctx, `UPDATE `+b.db.RunTable("workflow_runs", mover)+` SET status = 'running' WHERE run_id = $1`, mover)
			require.NoError(t, err)
		}
	})
	res, err := b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Workflow: "bulk-moving"}})
	require.NoError(t, err)
	require.True(t, moved.Load())
	require.Equal(t, engine.BulkResult{Matched: n, Done: n}, res)
	var requested bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT cancel_requested_at IS NOT NULL FROM pgdurable.workflow_runs WHERE run_id = $1`), mover).Scan(&requested))
	require.True(t, requested, "the run that moved was cancelled too")
}
