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

// claimed inserts a run and claims it, returning its fence.
func claimed(t *testing.T, db store.DBTX, workflowID string) store.Fence {
	t.Helper()
	ctx := context.Background()
	ins, err := store.InsertRun(ctx, db, store.NewRun{RunID: uuid.Must(uuid.NewV7()), WorkflowName: "wf", WorkflowVersion: 1,
		WorkflowID: workflowID, Input: []byte(`{}`), Queue: "q"})
	require.NoError(t, err)
	f := store.Fence{RunID: ins.RunID, Token: uuid.New(), Lease: 10 * time.Second}
	c, miss, err := store.Claim(ctx, db, f.RunID, f.Token, f.Lease, time.Now())
	require.NoError(t, err)
	require.Nil(t, miss)
	require.NotNil(t, c)
	return f
}

func completedStep(seq int, name string) *store.StepRecord {
	now := time.Now()
	return &store.StepRecord{Seq: seq, Name: name, Kind: "step", Status: store.StepCompleted, Attempts: 1,
		Output: []byte(`1`), StartedAt: now, CompletedAt: &now}
}

// A batch holding a zombie's write (its fence is stale: another delivery
// claimed the run since) lands every other write and reports only the
// zombie's as lost; the zombie's record is not written.
func TestWriteRecordsFencesEachWriteOnItsOwn(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	a, b, c := claimed(t, db.Pool, "a"), claimed(t, db.Pool, "b"), claimed(t, db.Pool, "c")
	// b's lease passes to a new delivery: the first token is a zombie's.
	_, err := db.Pool.Exec(ctx, `UPDATE workflow_runs SET owner_token = $2 WHERE run_id = $1`, b.RunID, uuid.New())
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE workflow_runs SET cancel_requested_at = now() WHERE run_id = $1`, c.RunID)
	require.NoError(t, err)

	res, err := store.WriteRecords(ctx, db.Pool, []*store.RecordWrite{
		{Fence: a, Records: []*store.StepRecord{completedStep(0, "s0"), completedStep(1, "s1")}},
		{Fence: b, Records: []*store.StepRecord{completedStep(0, "zombie")}},
		{Fence: c, Records: []*store.StepRecord{completedStep(0, "s0")}, Status: store.RunCompleted, Finish: true, Output: []byte(`"done"`)},
	})
	require.NoError(t, err)
	require.Equal(t, []store.WriteResult{{Landed: true}, {Landed: false}, {Landed: true, CancelRequested: true}}, res)

	var steps int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM workflow_steps WHERE run_id = $1`, a.RunID).Scan(&steps))
	require.Equal(t, 2, steps)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM workflow_steps WHERE run_id = $1`, b.RunID).Scan(&steps))
	require.Zero(t, steps, "a zombie's record is not written")

	var status string
	var owner *uuid.UUID
	var output []byte
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT status, owner_token, output FROM workflow_runs WHERE run_id = $1`, c.RunID).
		Scan(&status, &owner, &output))
	require.Equal(t, store.RunCompleted, status)
	require.Nil(t, owner, "a finish releases the lease")
	require.JSONEq(t, `"done"`, string(output))

	var lease time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT lease_expires_at FROM workflow_runs WHERE run_id = $1`, a.RunID).Scan(&lease))
	require.WithinDuration(t, time.Now().Add(a.Lease), lease, 5*time.Second, "a write extends its lease")
}
