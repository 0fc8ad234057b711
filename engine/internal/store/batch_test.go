package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
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
	res, err := store.ClaimRuns(ctx, db, []store.Fence{f}, time.Now())
	require.NoError(t, err)
	require.Nil(t, res[0].Miss)
	require.NotNil(t, res[0].Run)
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
	a, b, c := claimed(t, store.Default.On(db.Pool), "a"), claimed(t, store.Default.On(db.Pool), "b"), claimed(t, store.Default.On(db.Pool), "c")
	// b's lease passes to a new delivery: the first token is a zombie's.
	_, err := db.Pool.Exec(ctx, `UPDATE pgdurable.workflow_runs SET owner_token = $2 WHERE run_id = $1`, b.RunID, uuid.New())
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE pgdurable.workflow_runs SET cancel_requested_at = now() WHERE run_id = $1`, c.RunID)
	require.NoError(t, err)

	res, err := store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{
		{Fence: a, Records: []*store.StepRecord{completedStep(0, "s0"), completedStep(1, "s1")}},
		{Fence: b, Records: []*store.StepRecord{completedStep(0, "zombie")}},
		{Fence: c, Records: []*store.StepRecord{completedStep(0, "s0")}, Status: store.RunCompleted, Finish: true, Output: []byte(`"done"`)},
	})
	require.NoError(t, err)
	require.Equal(t, []store.WriteResult{{Landed: true}, {Landed: false}, {Landed: true, CancelRequested: true}}, res)

	var steps int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1`, a.RunID).Scan(&steps))
	require.Equal(t, 2, steps)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1`, b.RunID).Scan(&steps))
	require.Zero(t, steps, "a zombie's record is not written")

	var status string
	var owner *uuid.UUID
	var output []byte
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT status, owner_token, output FROM pgdurable.workflow_runs WHERE run_id = $1`, c.RunID).
		Scan(&status, &owner, &output))
	require.Equal(t, store.RunCompleted, status)
	require.Nil(t, owner, "a finish releases the lease")
	require.JSONEq(t, `"done"`, string(output))

	var lease time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT lease_expires_at FROM pgdurable.workflow_runs WHERE run_id = $1`, a.RunID).Scan(&lease))
	require.WithinDuration(t, time.Now().Add(a.Lease), lease, 5*time.Second, "a write extends its lease")
}

// A zombie's write that would end its run (the run was claimed again, or
// terminated, since) lands nothing of its own in a batch, and the batch's
// other writes land, ending writes and the rest, each with its records.
func TestWriteRecordsFencesOutAZombiesEnd(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	on := store.Default.On(db.Pool)
	for _, taken := range []string{"claimed again", "terminated"} {
		t.Run(taken, func(t *testing.T) {
			a, z, e := claimed(t, on, "a "+taken), claimed(t, on, "z "+taken), claimed(t, on, "e "+taken)
			steal := `UPDATE pgdurable.workflow_runs SET owner_token = gen_random_uuid() WHERE run_id = $1`
			if taken == "terminated" {
				steal = `UPDATE pgdurable.workflow_runs SET owner_token = NULL, lease_expires_at = NULL, status = 'terminated', completed_at = now() WHERE run_id = $1`
			}
			_, err := db.Pool.Exec(ctx, steal, z.RunID)
			require.NoError(t, err)
			end := func(f store.Fence, name string) *store.RecordWrite {
				return &store.RecordWrite{Fence: f, Records: []*store.StepRecord{completedStep(0, name), completedStep(1, name)},
					Status: store.RunCompleted, Finish: true, Output: []byte(`"done"`)}
			}
			res, err := store.WriteRecords(ctx, on, []*store.RecordWrite{
				{Fence: a, Records: []*store.StepRecord{completedStep(0, "s0"), completedStep(1, "s1")}},
				end(z, "zombie"),
				end(e, "s"),
			})
			require.NoError(t, err)
			require.Equal(t, []store.WriteResult{{Landed: true}, {Landed: false}, {Landed: true}}, res)
			for run, want := range map[uuid.UUID]int{a.RunID: 2, z.RunID: 0, e.RunID: 2} {
				var steps int
				require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1`, run).Scan(&steps))
				require.Equal(t, want, steps, "records of run %s", run)
			}
			var status string
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT status FROM pgdurable.workflow_runs WHERE run_id = $1`, z.RunID).Scan(&status))
			require.NotEqual(t, store.RunCompleted, status, "a zombie does not end the run")
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT status FROM pgdurable.workflow_runs WHERE run_id = $1`, e.RunID).Scan(&status))
			require.Equal(t, store.RunCompleted, status)
		})
	}
}

// A batch that holds a zombie's write and a record PostgreSQL refuses
// fails as a whole, with nothing of it committed: the batch's error is
// every write's, which the caller writes again (found by an attack pass:
// written one at a time around the zombie, the writes before the refused
// one committed, and the caller, told they failed, wrote them again, to
// find a completed run fenced out or a fresh record taken).
func TestWriteRecordsAroundAZombieStaysOneTransaction(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	on := store.Default.On(db.Pool)
	a, z, b := claimed(t, on, "a"), claimed(t, on, "z"), claimed(t, on, "b")
	_, err := db.Pool.Exec(ctx, `UPDATE pgdurable.workflow_runs SET owner_token = gen_random_uuid() WHERE run_id = $1`, z.RunID)
	require.NoError(t, err)
	fresh := completedStep(1, "s1")
	fresh.Fresh = true
	refused := completedStep(0, "nul")
	refused.Output = []byte(`"\u0000"`) // JSON that jsonb refuses
	writes := []*store.RecordWrite{
		{Fence: a, Records: []*store.StepRecord{completedStep(0, "s0"), fresh}, Status: store.RunCompleted, Finish: true, Output: []byte(`"done"`)},
		{Fence: z, Records: []*store.StepRecord{completedStep(0, "zombie")}},
		{Fence: b, Records: []*store.StepRecord{refused}},
	}
	_, err = store.WriteRecords(ctx, on, writes)
	require.Error(t, err)
	var steps int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_steps`).Scan(&steps))
	require.Zero(t, steps, "records of a failed batch")
	var status string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT status FROM pgdurable.workflow_runs WHERE run_id = $1`, a.RunID).Scan(&status))
	require.Equal(t, store.RunRunning, status, "a run ended by a failed batch")

	// Written again without the refused record, as the caller would: the
	// rest lands, the zombie's does not.
	res, err := store.WriteRecords(ctx, on, writes[:2])
	require.NoError(t, err)
	require.Equal(t, []store.WriteResult{{Landed: true}, {Landed: false}}, res)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_steps`).Scan(&steps))
	require.Equal(t, 2, steps)
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
	_, err := store.InsertRun(ctx, store.Default.On(db.Pool), old)
	require.NoError(t, err)

	batch := []store.NewRun{
		run("new", `{}`, false),
		run("claimed", `{}`, true),
		run("old", `{"a":1}`, false),      // same input, other spelling
		run("old", `{"a": 2}`, false),     // other input
		run("claimed", `{}`, false),       // earlier in the batch, same input
		run("claimed", `{"b": 1}`, false), // earlier in the batch, other input
	}
	res, err := store.InsertRuns(ctx, store.Default.On(db.Pool), batch)
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
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT owner_token, deliveries FROM pgdurable.workflow_runs WHERE run_id = $1`, batch[1].RunID).
		Scan(&owner, &deliveries))
	require.Equal(t, batch[1].Claim.Token, *owner)
	require.Equal(t, 1, deliveries, "a claimed insert counts its first delivery")
}

// A batch of 300 inserts as one: a workflow ID seen earlier in the batch
// is that run, a run whose ID exists (a batch tried again after its
// commit) is found by its workflow ID, and a run PostgreSQL refuses leaves
// none of the batch, and the pool's connection usable.
func TestInsertRunsIsOneTransaction(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db.URL)
	require.NoError(t, err)
	defer pool.Close()
	batch := func(prefix string) []store.NewRun {
		runs := make([]store.NewRun, 300)
		for i := range runs {
			runs[i] = store.NewRun{RunID: uuid.Must(uuid.NewV7()), WorkflowName: "wf", WorkflowVersion: 1,
				WorkflowID: fmt.Sprintf("%s-%03d", prefix, i), Input: []byte(`{}`), Queue: "q"}
		}
		return runs
	}
	runs := batch("a")
	runs[299].WorkflowID = runs[0].WorkflowID
	res, err := store.InsertRuns(ctx, store.Default.On(pool), runs)
	require.NoError(t, err)
	for i, r := range res[:299] {
		require.NoError(t, r.Err)
		require.Equal(t, store.InsertedRun{RunID: runs[i].RunID, Status: store.RunPending}, *r.Run)
	}
	require.Equal(t, store.InsertedRun{RunID: runs[0].RunID, Existing: true, Status: store.RunPending}, *res[299].Run)
	again, err := store.InsertRuns(ctx, store.Default.On(pool), runs[:2])
	require.NoError(t, err)
	for i, r := range again {
		require.Equal(t, store.InsertedRun{RunID: runs[i].RunID, Existing: true, Status: store.RunPending}, *r.Run)
	}

	runs = batch("b")
	runs[299].Input = []byte(`{not json`)
	_, err = store.InsertRuns(ctx, store.Default.On(pool), runs)
	require.Error(t, err)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_runs WHERE workflow_id LIKE 'b-%'`).Scan(&n))
	require.Zero(t, n, "runs of a failed batch")
	require.Equal(t, int32(1), pool.Stat().TotalConns(), "the batch's connection went back to the pool")
	var one int
	require.NoError(t, pool.QueryRow(ctx, `SELECT 1`).Scan(&one), "the connection is usable")
}

// ClaimRuns claims each claimable run of a batch once: a run leased by a
// live delivery, a finished run, a missing run and the second fence for a
// run already in the batch are misses, and each claimed run comes with its
// own steps.
func TestClaimRunsClaimsEachRunOnce(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	insert := func(workflowID string) uuid.UUID {
		ins, err := store.InsertRun(ctx, store.Default.On(db.Pool), store.NewRun{RunID: uuid.Must(uuid.NewV7()), WorkflowName: "wf",
			WorkflowVersion: 1, WorkflowID: workflowID, Input: []byte(`{}`), Queue: "q"})
		require.NoError(t, err)
		return ins.RunID
	}
	free, leased, twice := insert("free"), claimed(t, store.Default.On(db.Pool), "leased"), insert("twice")
	_, err := store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{{Fence: leased, Records: []*store.StepRecord{completedStep(0, "s0")}}})
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE pgdurable.workflow_runs SET owner_token = NULL, lease_expires_at = NULL WHERE run_id = $1`, leased.RunID)
	require.NoError(t, err)
	leased2 := claimed(t, store.Default.On(db.Pool), "leased-live")

	fence := func(id uuid.UUID) store.Fence {
		return store.Fence{RunID: id, Token: uuid.New(), Lease: 10 * time.Second}
	}
	fences := []store.Fence{fence(free), fence(leased.RunID), fence(leased2.RunID), fence(uuid.New()), fence(twice), fence(twice)}
	res, err := store.ClaimRuns(ctx, store.Default.On(db.Pool), fences, time.Now())
	require.NoError(t, err)
	require.NotNil(t, res[0].Run)
	require.Empty(t, res[0].Run.Steps)
	require.NotNil(t, res[1].Run, "a run whose lease was released is claimed again")
	require.Len(t, res[1].Run.Steps, 1, "with its recorded steps")
	require.Equal(t, 2, res[1].Run.Deliveries)
	require.True(t, res[2].Miss.Leased)
	require.True(t, res[3].Miss.NotExists)
	require.True(t, (res[4].Run == nil) != (res[5].Run == nil), "one of two fences for one run claims it")
	for _, r := range res[4:] {
		if r.Miss != nil {
			require.True(t, r.Miss.Leased)
		}
	}
	var owner uuid.UUID
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT owner_token FROM pgdurable.workflow_runs WHERE run_id = $1`, twice).Scan(&owner))
	winner := fences[4]
	if res[5].Run != nil {
		winner = fences[5]
	}
	require.Equal(t, winner.Token, owner)
}

// A batch of one write with at most one record takes the scalar statement:
// it lands, is fenced out, and ends a run as the batch statement does.
func TestWriteRecordsAloneFencesAndFinishes(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	a, b := claimed(t, store.Default.On(db.Pool), "a"), claimed(t, store.Default.On(db.Pool), "b")
	_, err := db.Pool.Exec(ctx, `UPDATE pgdurable.workflow_runs SET cancel_requested_at = now() WHERE run_id = $1`, a.RunID)
	require.NoError(t, err)
	one := func(w *store.RecordWrite) store.WriteResult {
		res, err := store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{w})
		require.NoError(t, err)
		return res[0]
	}
	require.Equal(t, store.WriteResult{Landed: true, CancelRequested: true}, one(&store.RecordWrite{Fence: a, Records: []*store.StepRecord{completedStep(0, "s0")}}))
	require.Equal(t, store.WriteResult{Landed: true, CancelRequested: true}, one(&store.RecordWrite{Fence: a}), "a bare lease extension")
	zombie := b
	zombie.Token = uuid.New()
	require.Equal(t, store.WriteResult{}, one(&store.RecordWrite{Fence: zombie, Records: []*store.StepRecord{completedStep(0, "zombie")}}))
	require.Equal(t, store.WriteResult{Landed: true}, one(&store.RecordWrite{Fence: b, Records: []*store.StepRecord{completedStep(0, "s0")},
		Status: store.RunFailed, Finish: true, Error: []byte(`{"message":"no"}`)}))

	var status string
	var owner *uuid.UUID
	var errJSON []byte
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT status, owner_token, error FROM pgdurable.workflow_runs WHERE run_id = $1`, b.RunID).
		Scan(&status, &owner, &errJSON))
	require.Equal(t, store.RunFailed, status)
	require.Nil(t, owner)
	require.JSONEq(t, `{"message":"no"}`, string(errJSON))
	rec, err := store.GetStep(ctx, store.Default.On(db.Pool), b.RunID, 0)
	require.NoError(t, err)
	require.Equal(t, "s0", rec.Name, "the zombie's record was not written")
	// The finished run's fence is gone: a retry of the finish is fenced out.
	require.Equal(t, store.WriteResult{}, one(&store.RecordWrite{Fence: b, Status: store.RunFailed, Finish: true}))
}

// Heartbeats extends each lease whose fence holds and reports a zombie's
// as not landed, alone and in a batch.
func TestHeartbeatsFenceEachDelivery(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	a, b := claimed(t, store.Default.On(db.Pool), "a"), claimed(t, store.Default.On(db.Pool), "b")
	zombie := b
	zombie.Token = uuid.New()
	_, err := db.Pool.Exec(ctx, `UPDATE pgdurable.workflow_runs SET cancel_requested_at = now() WHERE run_id = $1`, b.RunID)
	require.NoError(t, err)
	res, err := store.Heartbeats(ctx, store.Default.On(db.Pool), []store.Beat{{Fence: a, MarkLong: true}, {Fence: zombie}, {Fence: b}})
	require.NoError(t, err)
	require.Equal(t, []store.BeatResult{{Landed: true, Marked: true}, {}, {Landed: true, CancelRequested: true}}, res)
	res, err = store.Heartbeats(ctx, store.Default.On(db.Pool), []store.Beat{{Fence: zombie}})
	require.NoError(t, err)
	require.Equal(t, []store.BeatResult{{}}, res)
	var long int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT long_stalled_deliveries FROM pgdurable.workflow_runs WHERE run_id = $1`, a.RunID).Scan(&long))
	require.Equal(t, 1, long)
}

// A completed record is never overwritten, by WriteSteps (a tx step's
// retry counts on it: written 0 rolls its effects back) or by a batch.
func TestCompletedRecordsAreNeverOverwritten(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	f := claimed(t, store.Default.On(db.Pool), "x")
	w, err := store.WriteSteps(ctx, store.Default.On(db.Pool), f, "", completedStep(0, "tx"))
	n := w.Written
	require.NoError(t, err)
	require.Equal(t, 1, n)
	again := completedStep(0, "tx")
	again.Output = []byte(`2`)
	w, err = store.WriteSteps(ctx, store.Default.On(db.Pool), f, "", again)
	n = w.Written
	require.NoError(t, err)
	require.Zero(t, n)
	res, err := store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{{Fence: f, Records: []*store.StepRecord{again}}})
	require.NoError(t, err)
	require.True(t, res[0].Landed)
	res, err = store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{{Fence: f, Records: []*store.StepRecord{again, completedStep(1, "s1")}}})
	require.NoError(t, err)
	require.True(t, res[0].Landed)
	rec, err := store.GetStep(ctx, store.Default.On(db.Pool), f.RunID, 0)
	require.NoError(t, err)
	require.JSONEq(t, `1`, string(rec.Output))
}

// A fresh record is inserted without ON CONFLICT, in a batch and alone,
// beside upserted ones; were its row there after all, the write fails as a
// conflict and lands nothing, where an upsert of the same record lands.
func TestWriteRecordsInsertsFreshRecordsPlainly(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	a, b := claimed(t, store.Default.On(db.Pool), "a"), claimed(t, store.Default.On(db.Pool), "b")
	fresh := func(seq int, name string) *store.StepRecord {
		r := completedStep(seq, name)
		r.Fresh = true
		return r
	}
	res, err := store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{
		{Fence: a, Records: []*store.StepRecord{fresh(0, "s0"), completedStep(1, "s1")}},
		{Fence: b, Records: []*store.StepRecord{fresh(0, "s0")}},
	})
	require.NoError(t, err)
	require.Equal(t, []store.WriteResult{{Landed: true}, {Landed: true}}, res)
	res, err = store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{{Fence: b, Records: []*store.StepRecord{fresh(1, "s1")}}})
	require.NoError(t, err)
	require.Equal(t, []store.WriteResult{{Landed: true}}, res, "a batch of one")
	var steps int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = ANY($1)`, []uuid.UUID{a.RunID, b.RunID}).Scan(&steps))
	require.Equal(t, 4, steps)

	for _, writes := range [][]*store.RecordWrite{
		{{Fence: a, Records: []*store.StepRecord{fresh(0, "again")}}},
		{{Fence: a, Records: []*store.StepRecord{fresh(1, "again")}}, {Fence: b, Records: []*store.StepRecord{completedStep(5, "s5")}}},
	} {
		_, err = store.WriteRecords(ctx, store.Default.On(db.Pool), writes)
		require.ErrorIs(t, err, store.ErrConflict)
	}
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_steps WHERE name = 'again' OR seq = 5`).Scan(&steps))
	require.Zero(t, steps, "the failed statement landed nothing")
	res, err = store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{{Fence: a, Records: []*store.StepRecord{completedStep(0, "again")}}})
	require.NoError(t, err)
	require.True(t, res[0].Landed, "an upsert of an existing record lands (a completed one is kept)")
}

// A KeepLease write lands its records without updating the run row (its
// lease and stalled counts stay), alone and in a batch, and a zombie's is
// fenced out. It holds a share lock on the row until it commits: a claim
// of the run waits for it and then loads its record, so a record never
// lands unseen by the run's next delivery.
func TestKeepLeaseWritesLockTheRunRowInsteadOfUpdatingIt(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	a, b, zombie := claimed(t, store.Default.On(db.Pool), "a"), claimed(t, store.Default.On(db.Pool), "b"), claimed(t, store.Default.On(db.Pool), "zombie")
	_, err := db.Pool.Exec(ctx, `UPDATE pgdurable.workflow_runs SET owner_token = $2 WHERE run_id = $1`, zombie.RunID, uuid.New())
	require.NoError(t, err)
	type row struct {
		lease   time.Time
		stalled int
		ctid    string
	}
	read := func(runID uuid.UUID) row {
		var r row
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT lease_expires_at, stalled_deliveries, ctid::text FROM pgdurable.workflow_runs WHERE run_id = $1`, runID).
			Scan(&r.lease, &r.stalled, &r.ctid))
		return r
	}
	beforeA, beforeB := read(a.RunID), read(b.RunID)
	require.Equal(t, 1, beforeA.stalled)

	res, err := store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{{Fence: a, Records: []*store.StepRecord{completedStep(0, "s0")}, KeepLease: true}})
	require.NoError(t, err)
	require.Equal(t, []store.WriteResult{{Landed: true}}, res)
	res, err = store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{
		{Fence: a, Records: []*store.StepRecord{completedStep(1, "s1"), completedStep(2, "s2")}, KeepLease: true},
		{Fence: b, Records: []*store.StepRecord{completedStep(0, "s0")}, KeepLease: true},
		{Fence: zombie, Records: []*store.StepRecord{completedStep(0, "zombie")}, KeepLease: true},
	})
	require.NoError(t, err)
	require.Equal(t, []store.WriteResult{{Landed: true}, {Landed: true}, {Landed: false}}, res)
	require.Equal(t, beforeA, read(a.RunID), "the run row is not updated")
	require.Equal(t, beforeB, read(b.RunID), "the run row is not updated")
	var steps int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1`, a.RunID).Scan(&steps))
	require.Equal(t, 3, steps)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = $1`, zombie.RunID).Scan(&steps))
	require.Zero(t, steps, "a zombie's record is not written")

	// A write that changes the status updates the row even with KeepLease.
	res, err = store.WriteRecords(ctx, store.Default.On(db.Pool), []*store.RecordWrite{{Fence: b, Status: store.RunCompensating, KeepLease: true}})
	require.NoError(t, err)
	require.True(t, res[0].Landed)
	require.Zero(t, read(b.RunID).stalled, "a status write records progress")

	// The lock: a claim of a's run (its lease run out) waits for the
	// write's commit, then sees its record.
	_, err = db.Pool.Exec(ctx, `UPDATE pgdurable.workflow_runs SET lease_expires_at = now() - interval '1 second' WHERE run_id = $1`, a.RunID)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res, err = store.WriteRecords(ctx, store.Default.On(tx), []*store.RecordWrite{{Fence: a, Records: []*store.StepRecord{completedStep(3, "s3")}, KeepLease: true}})
	require.NoError(t, err)
	require.True(t, res[0].Landed)
	claimedC := make(chan []store.ClaimResult, 1)
	go func() {
		c, err := store.ClaimRuns(ctx, store.Default.On(db.Pool), []store.Fence{{RunID: a.RunID, Token: uuid.New(), Lease: time.Minute}}, time.Now())
		if err != nil {
			t.Error(err)
		}
		claimedC <- c
	}()
	select {
	case <-claimedC:
		t.Fatal("the claim did not wait for the write holding the row's share lock")
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	c := <-claimedC
	require.NotNil(t, c[0].Run)
	require.Len(t, c[0].Run.Steps, 4, "the claim loads the record the write committed")
}

// A batch of flow-controlled starts runs with a generic plan, and the
// setting stays with its statement: the caller's transaction goes on with
// its own plan cache mode.
func TestInsertFlowRunsLeaveThePlanCacheModeAsItWas(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after the commit
	runs := make([]store.NewRun, 3)
	for i := range runs {
		runs[i] = store.NewRun{RunID: uuid.Must(uuid.NewV7()), WorkflowName: "wf", WorkflowVersion: 1, WorkflowID: fmt.Sprint("flow-", i),
			Input: []byte(`{}`), Queue: "q", FlowQueue: "fq", FlowKey: "k"}
	}
	res, err := store.InsertRuns(ctx, store.Default.On(tx), runs)
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err)
		require.False(t, r.Run.Existing)
	}
	var mode string
	require.NoError(t, tx.QueryRow(ctx, `SHOW plan_cache_mode`).Scan(&mode))
	require.Equal(t, "auto", mode)
	require.NoError(t, tx.Commit(ctx))
	var ready int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgdurable.workflow_runs WHERE flow_queue = 'fq' AND ready_at IS NOT NULL`).Scan(&ready))
	require.Equal(t, 3, ready)
}

// A write whose statements are sent as one transaction block (one
// delivery's fence and record, a suspend with its record) leaves its
// connection idle when it fails — fenced out, or a record PostgreSQL
// refuses — on a connection and through a pool, which keeps the
// connection rather than replacing it (found by an attack pass: each
// zombie's write left its connection in an aborted transaction).
func TestFailedWriteLeavesItsConnectionIdle(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	pool := store.Default.On(db.Pool)
	f := claimed(t, pool, "idle")
	stale := f
	stale.Token = uuid.New()
	fresh := func(seq int) *store.StepRecord {
		r := completedStep(seq, "s")
		r.Fresh = true
		return r
	}
	refused := completedStep(9, "bad")
	refused.Output = []byte(`{"not json`)

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	on := store.Default.On(conn.Conn())
	for name, write := range map[string]func(store.DBTX) error{
		"a fenced-out write": func(db store.DBTX) error {
			res, err := store.WriteRecords(ctx, db, []*store.RecordWrite{{Fence: stale, Records: []*store.StepRecord{fresh(1)}}})
			if err == nil {
				require.False(t, res[0].Landed)
			}
			return err
		},
		"a refused record": func(db store.DBTX) error {
			_, err := store.WriteRecords(ctx, db, []*store.RecordWrite{{Fence: f, Records: []*store.StepRecord{refused}}})
			require.Error(t, err)
			return nil
		},
		"a refused record of a suspend": func(db store.DBTX) error {
			err := store.SuspendRun(ctx, db, f, store.SuspendParams{Pending: refused, Status: store.RunPending, Progress: true})
			require.Error(t, err)
			return nil
		},
	} {
		require.NoError(t, write(on), name)
		require.Equal(t, byte('I'), conn.Conn().PgConn().TxStatus(), "%s on a connection", name)
		_, err := conn.Exec(ctx, "SELECT 1")
		require.NoError(t, err, name)

		single, err := pgxpool.New(ctx, db.Pool.Config().ConnString()+"&pool_max_conns=1")
		require.NoError(t, err)
		var before, after int
		require.NoError(t, single.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&before))
		require.NoError(t, write(store.Default.On(single)), name)
		require.NoError(t, single.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after))
		single.Close()
		require.Equal(t, before, after, "%s through a pool: the pool kept its connection", name)
	}
}

// Plain PostgreSQL is not taken for a Citus coordinator, and a handle
// bound like another (a transaction begun on it) shares what was learned.
func TestPlainPostgreSQLIsNotCitus(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	on := store.Default.On(db.Pool)
	citus, err := store.OnCitus(ctx, on)
	require.NoError(t, err)
	require.False(t, citus)
	tx, err := on.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	citus, err = store.OnCitus(ctx, store.Bind(on, tx))
	require.NoError(t, err)
	require.False(t, citus)
}

// A start takes its queue's virtual time as its handle saw it within a
// second (an admission of the process notes the one it wrote), and reads
// it again once that is older.
func TestQueueVirtualTimeIsReadAtMostOnceASecond(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	on := store.Default.On(db.Pool)
	require.NoError(t, store.DefineQueue(ctx, on, store.QueueDef{Name: "q"}))
	_, err := db.Pool.Exec(ctx, `UPDATE pgdurable.queues SET vtime = 5 WHERE name = 'q'`)
	require.NoError(t, err)

	v, err := store.QueueVTimes(ctx, on, []string{"q", "q", "undefined"})
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"q": 5}, v, "read, and a queue without a row left out")
	_, err = db.Pool.Exec(ctx, `UPDATE pgdurable.queues SET vtime = 7 WHERE name = 'q'`)
	require.NoError(t, err)
	v, err = store.QueueVTimes(ctx, store.Bind(on, db.Pool), []string{"q"})
	require.NoError(t, err)
	require.Equal(t, 5.0, v["q"], "seen within the second, by a handle bound like it")

	store.NoteVTime(on, "q", 6, time.Now())
	v, err = store.QueueVTimes(ctx, on, []string{"q"})
	require.NoError(t, err)
	require.Equal(t, 6.0, v["q"], "an admission's note")
	store.NoteVTime(on, "q", 2, time.Now())
	v, err = store.QueueVTimes(ctx, on, []string{"q"})
	require.NoError(t, err)
	require.Equal(t, 6.0, v["q"], "never an earlier one than seen")

	store.NoteVTime(on, "q", 6, time.Now().Add(-2*time.Second))
	v, err = store.QueueVTimes(ctx, on, []string{"q"})
	require.NoError(t, err)
	require.Equal(t, 7.0, v["q"], "read again once a second old")
}
