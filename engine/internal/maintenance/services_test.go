package maintenance_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/engine/internal/maintenance"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// fakeQueue records the tickets the services enqueue, and returns stale
// as River's stale tickets.
type fakeQueue struct {
	mu       sync.Mutex
	enqueued []uuid.UUID
	stale    []uuid.UUID
}

func (q *fakeQueue) EnqueueMany(_ context.Context, _ pgx.Tx, ids []uuid.UUID) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.enqueued = append(q.enqueued, ids...)
	return nil
}

func (q *fakeQueue) StaleTickets(context.Context, time.Duration) ([]uuid.UUID, error) {
	return q.stale, nil
}

func (q *fakeQueue) got() []uuid.UUID {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.enqueued)
}

// bundle is what a service test works with: its database, a log it can
// read and a fake River queue.
type bundle struct {
	db    *enginetest.DB
	logs  *syncBuffer
	log   *slog.Logger
	queue *fakeQueue
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{db: enginetest.NewDB(t), logs: &syncBuffer{}, queue: &fakeQueue{}}
	b.log = slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return b
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// insertRun inserts a pending run on queue "q", claimed under a fence
// with lease when lease is above 0, and returns its ID.
func insertRun(t *testing.T, db store.DBTX, lease time.Duration, deadline *time.Time) uuid.UUID {
	t.Helper()
	id := uuid.Must(uuid.NewV7())
	r := store.NewRun{RunID: id, WorkflowName: "wf", WorkflowVersion: 1, WorkflowID: id.String(), Input: []byte(`{}`),
		Queue: "q", Deadline: deadline}
	if lease > 0 {
		r.Claim = &store.Fence{RunID: id, Token: uuid.New(), Lease: lease}
	}
	_, err := store.InsertRun(context.Background(), db, r)
	require.NoError(t, err)
	return id
}

// The lease sweeper enqueues a run whose lease expired, logs it, and
// leaves a run whose lease holds alone.
func TestLeaseSweeperReenqueuesARunWhoseLeaseExpired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	expired := insertRun(t, store.Default.On(b.db.Pool), time.Millisecond, nil)
	insertRun(t, store.Default.On(b.db.Pool), time.Hour, nil)
	s := &maintenance.LeaseSweeper{DB: store.Default.On(b.db.Pool), Queue: b.queue, Log: b.log, QueueName: "q", Lease: time.Second,
		Now: time.Now, Cancelled: func([]uuid.UUID) { t.Error("nothing timed out") }}
	require.Eventually(t, func() bool {
		s.RunOnce(context.Background())
		return len(b.queue.got()) > 0
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []uuid.UUID{expired}, b.queue.got())
	require.Contains(t, b.logs.String(), "lease expired; run re-enqueued for another delivery")
}

// A running run past its deadline is cancelled: this process's delivery
// hears of it through Cancelled, and no ticket is enqueued for it.
func TestLeaseSweeperCancelsARunPastItsTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	deadline := now.Add(-time.Second)
	id := insertRun(t, store.Default.On(b.db.Pool), time.Hour, &deadline)
	var cancelled []uuid.UUID
	s := &maintenance.LeaseSweeper{DB: store.Default.On(b.db.Pool), Queue: b.queue, Log: b.log, QueueName: "q", Lease: time.Second,
		Now: func() time.Time { return now }, Cancelled: func(ids []uuid.UUID) { cancelled = append(cancelled, ids...) }}
	s.RunOnce(context.Background())
	require.Equal(t, []uuid.UUID{id}, cancelled)
	require.Empty(t, b.queue.got())
	require.Contains(t, b.logs.String(), "run timeout passed; run cancelled")
}

// The poller asks about the deliveries that have not heard of a
// cancellation and are at least 100 ms old, and tells those whose
// cancellation was requested.
func TestCancelPollerTellsDeliveriesOfCancellationsRequestedElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old, young, heard, running := insertRun(t, store.Default.On(b.db.Pool), time.Hour, nil), insertRun(t, store.Default.On(b.db.Pool), time.Hour, nil),
		insertRun(t, store.Default.On(b.db.Pool), time.Hour, nil), insertRun(t, store.Default.On(b.db.Pool), time.Hour, nil)
	_, err := b.db.Pool.Exec(ctx, `UPDATE pgdurable.workflow_runs SET cancel_requested_at = now() WHERE run_id = ANY($1)`,
		[]uuid.UUID{old, young, heard})
	require.NoError(t, err)
	live := []maintenance.LiveRun{
		{RunID: old, ClaimedAt: time.Now().Add(-time.Second)},
		{RunID: young, ClaimedAt: time.Now()},
		{RunID: heard, ClaimedAt: time.Now().Add(-time.Second), CancelHeard: true},
		{RunID: running, ClaimedAt: time.Now().Add(-time.Second)},
	}
	var told []uuid.UUID
	p := &maintenance.CancelPoller{DB: store.Default.On(b.db.Pool), Log: b.log, Live: slices.Values(live),
		Cancelled: func(ids []uuid.UUID) { told = append(told, ids...) }}
	p.RunOnce(ctx)
	require.Equal(t, []uuid.UUID{old}, told)
}

// The registry records this process with its workflows sorted by name,
// and Forget deletes its row.
func TestProcessRegistryRecordsAndForgetsThisProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := &maintenance.ProcessRegistry{DB: store.Default.On(b.db.Pool), Log: b.log, ID: uuid.New(), QueueName: "q", WriteTimeout: 15 * time.Second,
		Workflows: func() []store.ProcessWorkflow {
			return []store.ProcessWorkflow{{Name: "b", Version: 2}, {Name: "a", Version: 1}}
		}}
	r.RunOnce(ctx)
	procs, err := store.LiveProcesses(ctx, store.Default.On(b.db.Pool), maintenance.ProcessLive)
	require.NoError(t, err)
	require.Len(t, procs, 1)
	require.Equal(t, r.ID, procs[0].ID)
	require.Equal(t, "q", procs[0].Queue)
	require.Equal(t, []store.ProcessWorkflow{{Name: "a", Version: 1}, {Name: "b", Version: 2}}, procs[0].Workflows)
	r.Forget()
	procs, err = store.LiveProcesses(ctx, store.Default.On(b.db.Pool), maintenance.ProcessLive)
	require.NoError(t, err)
	require.Empty(t, procs)
	require.NotContains(t, b.logs.String(), "failed")
}

// A pass prunes, with the cutoff Retention before the engine's clock,
// until a batch is not full, and logs what it deleted.
func TestPrunerPrunesUntilABatchIsNotFull(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	var cutoffs []time.Time
	results := []store.Pruned{{Runs: maintenance.PruneBatch, Steps: 7}, {ScheduleFires: maintenance.PruneBatch}, {Runs: 3}, {Runs: 99}}
	p := &maintenance.Pruner{Log: slog.New(slog.NewTextHandler(logs, nil)), Retention: time.Hour,
		Now: func() time.Time { return now },
		Batch: func(_ context.Context, cutoff time.Time) (store.Pruned, error) {
			cutoffs = append(cutoffs, cutoff)
			return results[len(cutoffs)-1], nil
		}}
	p.RunOnce(context.Background())
	require.Equal(t, []time.Time{now.Add(-time.Hour), now.Add(-time.Hour), now.Add(-time.Hour)}, cutoffs)
	require.Contains(t, logs.String(), `msg="pruned finished runs past retention" runs=503 steps=7 schedule_fires=500 retention=1h0m0s`)
	require.True(t, maintenance.Full(store.Pruned{Runs: maintenance.PruneBatch}))
	require.False(t, maintenance.Full(store.Pruned{Runs: maintenance.PruneBatch - 1, ScheduleFires: maintenance.PruneBatch - 1}))
}

// The orphan sweeper re-enqueues the runs of stale tickets that no
// delivery claimed since, and leaves a claimed one alone.
func TestOrphanSweeperReenqueuesUnclaimedRunsOfStaleTickets(t *testing.T) {
	t.Parallel()
	b := setup(t)
	orphan := insertRun(t, store.Default.On(b.db.Pool), 0, nil)
	claimed := insertRun(t, store.Default.On(b.db.Pool), time.Hour, nil)
	b.queue.stale = []uuid.UUID{orphan, claimed}
	s := &maintenance.OrphanSweeper{DB: store.Default.On(b.db.Pool), Queue: b.queue, Log: b.log, Lease: time.Millisecond}
	require.Eventually(t, func() bool {
		s.RunOnce(context.Background())
		return len(b.queue.got()) > 0
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []uuid.UUID{orphan}, b.queue.got())
	require.Contains(t, b.logs.String(), "delivery died before claiming the run; run re-enqueued")
}

// A due schedule whose workflow this process registers fires: the run
// starts with the fire's workflow ID, the fire is recorded, the schedule
// moves on, and Fired hears of it after the commit. A schedule whose
// workflow is not registered here waits, and says so once.
func TestSchedulerFiresDueSchedulesOfRegisteredWorkflows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 2, 12, 0, 30, 0, time.UTC)
	fireAt := now.Truncate(time.Minute)
	for _, name := range []string{"mine", "theirs"} {
		require.NoError(t, store.InsertSchedule(ctx, store.Default.On(b.db.Pool), &store.ScheduleRow{Name: name, Cron: "* * * * *", TimeZone: "UTC",
			WorkflowName: name + "-wf", Input: []byte(`{"n":1}`), OverlapPolicy: "skip", CatchupWindow: time.Hour,
			Queue: "q", NextFireAt: fireAt}))
	}
	runID := uuid.New()
	var startedWith []string
	var fired []string
	s := &maintenance.Scheduler{DB: store.Default.On(b.db.Pool), Log: b.log, QueueName: "q", Now: func() time.Time { return now },
		Workflow: func(workflow, schedule string) (maintenance.StartFunc, bool) {
			if workflow != "mine-wf" {
				return nil, false
			}
			return func(_ context.Context, _ pgx.Tx, input []byte, workflowID string) (uuid.UUID, error) {
				startedWith = append(startedWith, schedule, string(input), workflowID)
				return runID, nil
			}, true
		},
		Fired: func(schedule, workflow, outcome, reason string) {
			fired = append(fired, schedule, workflow, outcome, reason)
		}}
	s.RunOnce(ctx)
	s.RunOnce(ctx)
	require.Len(t, startedWith, 3)
	require.Equal(t, "mine", startedWith[0])
	require.JSONEq(t, `{"n":1}`, startedWith[1])
	require.Equal(t, "schedule:mine:2026-12-02T12:00:00Z", startedWith[2])
	require.Equal(t, []string{"mine", "mine-wf", maintenance.FireStarted, ""}, fired)
	fires, err := store.ListFires(ctx, store.Default.On(b.db.Pool), "mine", 10)
	require.NoError(t, err)
	require.Len(t, fires, 1)
	require.Equal(t, maintenance.FireStarted, fires[0].Outcome)
	require.Equal(t, &runID, fires[0].RunID)
	mine, err := store.GetSchedule(ctx, store.Default.On(b.db.Pool), "mine")
	require.NoError(t, err)
	require.Equal(t, fireAt.Add(time.Minute), mine.NextFireAt.UTC())
	theirs, err := store.GetSchedule(ctx, store.Default.On(b.db.Pool), "theirs")
	require.NoError(t, err)
	require.Equal(t, fireAt, theirs.NextFireAt.UTC())
	require.Equal(t, 1, bytes.Count([]byte(b.logs.String()), []byte("schedule's workflow is not registered in this process")))
}

// The strings the services store are the ones package engine exports.
func TestConstantsMatchTheEngines(t *testing.T) {
	t.Parallel()
	require.Equal(t, engine.OverlapAllow, maintenance.OverlapAllow)
	require.Equal(t, engine.OverlapBufferOne, maintenance.OverlapBufferOne)
	require.Equal(t, engine.FireStarted, maintenance.FireStarted)
	require.Equal(t, engine.FireBuffered, maintenance.FireBuffered)
	require.Equal(t, engine.FireSkipped, maintenance.FireSkipped)
	require.Equal(t, engine.FireMissed, maintenance.FireMissed)
	require.Equal(t, engine.FireOverlap, maintenance.FireOverlap)
	at := time.Date(2026, 12, 2, 12, 0, 0, 0, time.FixedZone("X", 3600))
	require.Equal(t, engine.ScheduleWorkflowID("s", at), maintenance.ScheduleWorkflowID("s", at))
}
