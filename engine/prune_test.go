package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// oldRun is a UUID v7 of the given time, as SQL: the run IDs of rows a
// test inserts as if they were made then.
const oldRunID = `encode(overlay(uuid_send(gen_random_uuid()) placing substring(int8send(floor(extract(epoch FROM %s) * 1000)::bigint) FROM 3) FROM 1 FOR 6), 'hex')::uuid`

// insertOldRuns inserts n finished runs of status that ended age ago,
// each with steps records, in one statement (an engine's retention sweep
// may run meanwhile): rows that stand for a month of history.
func insertOldRuns(t *testing.T, pool *pgxpool.Pool, prefix, status string, n, steps int, age time.Duration) {
	t.Helper()
	ts := fmt.Sprintf("now() - interval '%d seconds' + g * interval '1 millisecond'", int(age.Seconds()))
	_, err := pool.Exec(context.Background(), fmt.Sprintf(`
WITH runs AS (
    INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input, output, created_at, started_at, completed_at)
    SELECT `+oldRunID+`, 'history', $1 || g, $2, '1', '2', %[2]s, %[2]s, %[2]s FROM generate_series(1, $3) g
    RETURNING run_id, created_at
)
INSERT INTO pgdurable.workflow_steps (run_id, seq, name, kind, status, attempts, output, started_at, completed_at)
SELECT r.run_id, s, 's', 'step', 'completed', 1, '1', r.created_at, r.created_at
FROM runs r, generate_series(0, $4 - 1) s`, ts, ts), prefix, status, n, steps)
	require.NoError(t, err)
}

// Prune deletes 10,000 finished runs that ended a month ago (and their
// 30,000 steps, signals and resolved dead jobs) while 100 runs execute,
// none of which it disturbs; it keeps runs with an unresolved dead job and
// a finished child whose parent still runs. A dry run counts the same.
func TestPruneDeletesOldRunsWhileRunsExecute(t *testing.T) {
	t.Parallel()
	wf := engine.Define("prune-live", func(ctx *engine.Context, n int) (int, error) {
		total := 0
		for i := range 3 {
			v, err := engine.Step(ctx, fmt.Sprint("s", i), func(context.Context) (int, error) {
				time.Sleep(20 * time.Millisecond)
				return n, nil
			}, nil)
			if err != nil {
				return 0, err
			}
			total += v
		}
		return total, nil
	}, nil)
	b := setup(t, &engine.Config{Retention: -1}, wf) // no sweep prune: this test calls Prune
	ctx := testCtx(t)
	const month = 30 * 24 * time.Hour
	insertOldRuns(t, b.db.Pool, "done-", "completed", 10_000, 3, month)
	insertOldRuns(t, b.db.Pool, "dead-open-", "dead", 10, 1, month)
	insertOldRuns(t, b.db.Pool, "dead-discarded-", "dead", 5, 1, month)
	_, err := b.db.Pool.Exec(ctx, b.db.SQL(`
INSERT INTO pgdurable.dead_jobs (id, run_id, workflow_name, workflow_id, workflow_version, input, reason, error_class, error_message,
                       parked_at, resolved_at, resolution)
SELECT gen_random_uuid(), run_id, workflow_name, workflow_id, 1, input, 'panic', 'panic', 'boom', completed_at,
       CASE WHEN starts_with(workflow_id, 'dead-discarded-') THEN completed_at END,
       CASE WHEN starts_with(workflow_id, 'dead-discarded-') THEN 'discarded' END
FROM pgdurable.workflow_runs WHERE status = 'dead';
INSERT INTO pgdurable.workflow_signals (run_id, name, payload, created_at)
SELECT run_id, 'sig', '1', created_at FROM pgdurable.workflow_runs WHERE workflow_id IN ('done-1', 'done-2');
-- a parent still waiting, with an old finished child it has not read
INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input)
VALUES ('00000000-0000-7000-8000-000000000001', 'history', 'live-parent', 'waiting', '1');
INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_id, status, input, output, completed_at,
                           parent_run_id, parent_seq, parent_close_policy)
VALUES ('00000000-0000-7000-8000-000000000002', 'history', 'old-child', 'completed', '1', '2', now() - interval '30 days',
        '00000000-0000-7000-8000-000000000001', 0, 'cancel');`))
	require.NoError(t, err)

	dry, err := b.engine.Prune(ctx, engine.PruneParams{OlderThan: 24 * time.Hour, DryRun: true})
	require.NoError(t, err)
	want := engine.PruneResult{Runs: 10_005, Steps: 30_005, Signals: 2, DeadJobs: 5}
	require.Equal(t, want, dry)

	ids := make([]uuid.UUID, 100)
	for i := range ids {
		res, err := wf.Start(ctx, b.engine, i, nil)
		require.NoError(t, err)
		ids[i] = res.RunID
	}
	start := time.Now()
	var progress []engine.PruneResult
	got, err := b.engine.Prune(ctx, engine.PruneParams{OlderThan: 24 * time.Hour,
		Progress: func(so engine.PruneResult) { progress = append(progress, so) }})
	require.NoError(t, err)
	t.Logf("pruned %+v in %s", got, time.Since(start).Round(time.Millisecond))
	require.Equal(t, want, got)
	require.GreaterOrEqual(t, len(progress), 21, "a batch of 500 runs at a time, each reported")
	require.Equal(t, got, progress[len(progress)-1])
	for i, id := range ids {
		out, err := wf.Wait(ctx, b.engine, id, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, 3*i, out)
	}
	var runs, steps, openDead, kept int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE workflow_name = 'prune-live'`)).Scan(&runs))
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_steps s JOIN pgdurable.workflow_runs r USING (run_id)
		WHERE r.workflow_name = 'prune-live'`)).Scan(&steps))
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.dead_jobs WHERE resolved_at IS NULL`)).Scan(&openDead))
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE workflow_name = 'history'`)).Scan(&kept))
	require.Equal(t, 100, runs, "the runs executing meanwhile are all there")
	require.Equal(t, 300, steps)
	require.Equal(t, 10, openDead, "no unresolved dead job is deleted")
	require.Equal(t, 12, kept, "10 runs with open dead jobs, the waiting parent and its child")
	again, err := b.engine.Prune(ctx, engine.PruneParams{OlderThan: 24 * time.Hour})
	require.NoError(t, err)
	require.Zero(t, again.Runs)

	_, err = b.engine.Prune(ctx, engine.PruneParams{})
	require.ErrorIs(t, err, engine.ErrInvalidArgument)
}

// Every engine's sweep prunes for Config.Retention: 1,200 runs that ended
// two days ago go (more than one batch), one that ended an hour ago stays.
func TestRetentionSweepPrunesOldRuns(t *testing.T) {
	t.Parallel()
	// The runs exist before the engine starts: its first sweep prunes at
	// once, and the next comes 30 to 90 s later (a clean-clone CI run
	// caught the first pass running before the insert ended).
	b := &bundle{db: enginetest.NewDB(t)}
	insertOldRuns(t, b.db.Pool, "two-days-", "completed", 1200, 1, 48*time.Hour)
	insertOldRuns(t, b.db.Pool, "an-hour-", "failed", 1, 1, time.Hour)
	b.engine = newEngine(t, b.db, &engine.Config{Retention: 24 * time.Hour, SweepInterval: 50 * time.Millisecond}, true)
	ctx := testCtx(t)
	eventually(t, 20*time.Second, "the old runs to be pruned", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE starts_with(workflow_id, 'two-days-')`)).Scan(&n))
		return n == 0
	})
	var recent, steps int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE starts_with(workflow_id, 'an-hour-')`)).Scan(&recent))
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_steps`)).Scan(&steps))
	require.Equal(t, 1, recent)
	require.Equal(t, 1, steps)
}

// A continue-as-new chain whose latest run still runs keeps its continued
// runs: a retried start with the chain's first input still finds the
// latest run, and Wait on the first run ID still follows the chain. Once
// the chain ended, its runs go (found by an attack pass).
func TestPruneKeepsALiveChainsEarlierRuns(t *testing.T) {
	t.Parallel()
	wf := engine.Define("prune-chain", func(ctx *engine.Context, n int) (int, error) {
		if n < 2 {
			return 0, engine.ContinueAsNew(ctx, n+1)
		}
		return engine.AwaitSignal[int](ctx, "stop", 0)
	}, nil)
	b := setup(t, &engine.Config{Retention: -1}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: "chain"})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the chain's third run to wait", func() bool {
		id, err := b.engine.FindRun(ctx, "chain")
		require.NoError(t, err)
		run, err := b.engine.GetRun(ctx, id)
		require.NoError(t, err)
		return run.Status == engine.StatusWaiting
	})
	time.Sleep(50 * time.Millisecond)
	pruned, err := b.engine.Prune(ctx, engine.PruneParams{OlderThan: 20 * time.Millisecond})
	require.NoError(t, err)
	require.Zero(t, pruned.Runs, "the live chain's continued runs are kept")
	again, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: "chain"})
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.NoError(t, b.engine.Signal(ctx, "chain", "stop", 7, nil))
	out, err := wf.Wait(ctx, b.engine, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 7, out)
	time.Sleep(50 * time.Millisecond)
	pruned, err = b.engine.Prune(ctx, engine.PruneParams{OlderThan: 20 * time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, int64(3), pruned.Runs, "the ended chain goes whole")
}

// A time range before 1970 does not wrap around: every run is created
// after it (found by an attack pass).
func TestListRunsBefore1970(t *testing.T) {
	t.Parallel()
	wf := engine.Define("list-1970", func(*engine.Context, int) (int, error) { return 1, nil }, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	_, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	runs, _, err := b.engine.ListRuns(ctx, engine.ListRunsParams{CreatedAfter: time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC)})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	runs, _, err = b.engine.ListRuns(ctx, engine.ListRunsParams{CreatedBefore: time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC)})
	require.NoError(t, err)
	require.Empty(t, runs)
}
