package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// The lease sweep makes a run of a flow-controlled queue whose process
// died ready at once, keeping its fair-queuing tag, so that it keeps its
// place before its key's later runs: left neither leased nor ready until
// its ticket's delivery, it held no slot of its key, and an admission in
// between started the key's next run first. A run held back after
// repeated crashes waits out its delay instead, and a run of no
// flow-controlled queue only loses its lease (its ticket claims it).
func TestSweepMakesAFlowRunWhoseLeaseExpiredReady(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	on := store.Default.On(db.Pool)
	insert := func(flowQueue string, stalled int) uuid.UUID {
		ins, err := store.InsertRun(ctx, on, store.NewRun{RunID: uuid.Must(uuid.NewV7()), WorkflowName: "wf", WorkflowVersion: 1,
			WorkflowID: uuid.NewString(), Input: []byte(`{}`), Queue: "q", FlowQueue: flowQueue, FlowKey: "k"})
		require.NoError(t, err)
		// As a process that died running it leaves it: leased, the lease
		// expired, not ready.
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.RunTable("workflow_runs", ins.RunID)+` SET owner_token = $2,
			lease_expires_at = now() - interval '1 second', ready_at = NULL, status = 'running', deliveries = 1,
			stalled_deliveries = $3, fair_tag = 7 WHERE run_id = $1`, ins.RunID, uuid.New(), stalled)
		require.NoError(t, err)
		return ins.RunID
	}
	flow, heldBack, plain := insert("fq", 0), insert("fq", 2), insert("", 0)

	now := time.Now().UTC().Truncate(time.Millisecond)
	swept, err := store.Sweep(ctx, on, store.SweepParams{Queue: "q", Now: now, Lease: time.Second, Limit: 10})
	require.NoError(t, err)
	causes := map[uuid.UUID]string{}
	for _, s := range swept {
		causes[s.RunID] = s.Cause
	}
	require.Equal(t, map[uuid.UUID]string{flow: store.SweptLeaseExpired, heldBack: store.SweptCrashBackoff, plain: store.SweptLeaseExpired}, causes)

	type state struct {
		Status  string
		Owner   *uuid.UUID
		ReadyAt *time.Time
		Tag     *float64
	}
	read := func(runID uuid.UUID) state {
		var s state
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT status, owner_token, ready_at, fair_tag FROM pgdurable.workflow_runs WHERE run_id = $1`), runID).
			Scan(&s.Status, &s.Owner, &s.ReadyAt, &s.Tag))
		return s
	}
	s := read(flow)
	require.Nil(t, s.Owner, "the lease is ended")
	require.NotNil(t, s.ReadyAt, "a flow-controlled run is ready again at once")
	require.True(t, s.ReadyAt.Equal(now), "ready at the sweep's time %s, got %s", now, s.ReadyAt)
	require.Equal(t, "running", s.Status)
	require.NotNil(t, s.Tag)
	require.Equal(t, 7.0, *s.Tag, "it keeps its fair-queuing tag, so it goes before its key's later runs")

	s = read(heldBack)
	require.Nil(t, s.Owner)
	require.Nil(t, s.ReadyAt, "a run held back after repeated crashes is not ready before its delay")
	require.Equal(t, "waiting", s.Status)

	s = read(plain)
	require.Nil(t, s.Owner)
	require.Nil(t, s.ReadyAt, "a run of no flow-controlled queue is never ready: its ticket claims it")
}
