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

// InsertRuns answers each run as InsertRun would: new (claimed or not), the
// same workflow ID with the same input (in the table or earlier in the
// batch) is the existing run, with another input a conflict.
func TestInsertRunsAnswersEachRunAsInsertRunWould(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	run := func(workflowID, input string, claim bool) store.NewRun {
		r := store.NewRun{RunID: uuid.Must(uuid.NewV7()), WorkflowName: "wf", WorkflowVersion: 1, WorkflowID: workflowID,
			Input: []byte(input), Queue: "q"}
		if claim {
			r.Claim = &store.Fence{RunID: r.RunID, Token: uuid.New(), Lease: 10 * time.Second}
		}
		return r
	}
	old := run("old", `{"a": 1}`, false)
	_, err := store.InsertRun(ctx, db.Pool, old)
	require.NoError(t, err)

	batch := []store.NewRun{
		run("new", `{}`, false),
		run("claimed", `{}`, true),
		run("old", `{"a":1}`, false),      // same input, other spelling
		run("old", `{"a": 2}`, false),     // other input
		run("claimed", `{}`, false),       // earlier in the batch, same input
		run("claimed", `{"b": 1}`, false), // earlier in the batch, other input
	}
	res, err := store.InsertRuns(ctx, db.Pool, batch)
	require.NoError(t, err)
	require.Len(t, res, len(batch))
	require.NoError(t, res[0].Err)
	require.Equal(t, store.InsertedRun{RunID: batch[0].RunID, Status: store.RunPending}, *res[0].Run)
	require.Equal(t, store.InsertedRun{RunID: batch[1].RunID, Status: store.RunRunning}, *res[1].Run)
	require.Equal(t, store.InsertedRun{RunID: old.RunID, Existing: true, Status: store.RunPending}, *res[2].Run)
	require.ErrorIs(t, res[3].Err, store.ErrConflict)
	require.Equal(t, old.RunID, res[3].Run.RunID)
	require.Equal(t, store.InsertedRun{RunID: batch[1].RunID, Existing: true, Status: store.RunRunning}, *res[4].Run)
	require.ErrorIs(t, res[5].Err, store.ErrConflict)

	var owner *uuid.UUID
	var deliveries int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT owner_token, deliveries FROM workflow_runs WHERE run_id = $1`, batch[1].RunID).
		Scan(&owner, &deliveries))
	require.Equal(t, batch[1].Claim.Token, *owner)
	require.Equal(t, 1, deliveries, "a claimed insert counts its first delivery")
}
