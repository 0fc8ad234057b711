package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// NewRun is what Start inserts.
type NewRun struct {
	RunID           uuid.UUID
	WorkflowName    string
	WorkflowVersion int
	WorkflowID      string
	Input           []byte
	Queue           string
	ScheduleName    *string // the schedule whose fire started it
	// Claim, when set, inserts the run already claimed under this fence
	// (running, its first delivery counted), for a process that executes
	// it at once; the lease sweep redelivers it if that process dies.
	Claim *Fence
	// Hold, when not zero, inserts the run pending without a River job, held
	// for this long by the starting process, which runs it once a worker of
	// its frees up; when the hold passes first, the sweep gives it a job.
	// InsertRuns only.
	Hold time.Duration
	// StartAt, when set, inserts the run waiting until then (wake_at), with
	// no River job: the sweep wakes it when it is due. Not with Claim or
	// Hold.
	StartAt *time.Time
	// RunTimeout, when not zero, is the run's timeout: the claim that
	// first picks it up sets its deadline that long after the claim's
	// time, and at the deadline the sweep requests its cancellation.
	// With Claim, Deadline is that deadline, set at the insert.
	RunTimeout time.Duration
	Deadline   *time.Time
	// Parent, for a child run, places it under its parent.
	Parent *ParentRef
	// ContinuedFrom, for a run ContinueAsNew starts, is the run it
	// continues (InsertRun only): the new run records its chain's first.
	ContinuedFrom *uuid.UUID
	// Tags is a JSON object of strings (nil: none; a run ContinueAsNew
	// starts without tags takes those of the run it continues).
	Tags []byte
	// TraceContext is the starting span's W3C trace context as a JSON
	// object (nil: not traced; a continued run takes its predecessor's).
	TraceContext []byte
	// FlowQueue, when set, puts the run in a flow-controlled queue: it is
	// inserted ready (or waiting, with StartAt), with no River job, and
	// only the queue's admission claims it (see Admit). Not with Claim or
	// Hold.
	FlowQueue string
	// FlowKey is the run's key in its queue ("" for none: the runs without
	// one share it), Priority its priority (higher first) and TagStep its
	// share of the key's fair-queuing time (1/weight).
	FlowKey  string
	Priority int
	TagStep  float64
	// tags, with routes, are the run's fair-queuing tag's floor and its
	// share of its key's in the start's batch, set by flowTags.
	tags *flowTag
	// DedupID, when set, is the run's deduplication ID: the insert finds
	// the open run of the queue that holds it instead (see
	// InsertedRun.Deduplicated).
	DedupID string
	// DebounceKey, when set (with StartAt, the debounce window's end),
	// joins the run of the workflow with that key that waits out its
	// window, if any: its input becomes Input and its start moves to
	// StartAt, never past DebounceUntil (nil: no bound) as the first start
	// set it. InsertedRun.Debounced says it joined.
	DebounceKey   string
	DebounceUntil *time.Time
}

// InsertedRun reports the outcome of InsertRun.
type InsertedRun struct {
	RunID    uuid.UUID
	Existing bool // a run with this workflow ID already existed
	// Deduplicated: the run is the open run that holds the start's
	// deduplication ID (Existing is set too).
	Deduplicated bool
	// Debounced: the start joined a run waiting out its debounce window
	// (Existing is set too).
	Debounced bool
	// WorkflowID is the found run's workflow ID, for a start that
	// Debounced or Deduplicated ("" otherwise: the start's own).
	WorkflowID string
	Status     string
}

// insertRun inserts a run (see NewRun), claimed when @token is set. Its
// first_run_id is @continued_from, NULL here: only insertContinuedRun
// starts a run with one. Its times keep now() outside CASE, as Citus
// needs (see nowIf).
var insertRun = `
INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_version, workflow_id, input, queue, schedule_name,
                           status, owner_token, lease_expires_at, deliveries, stalled_deliveries, started_at, held_until,
                           wake_at, run_timeout_ms, deadline_at, parent_run_id, parent_seq, parent_close_policy, first_run_id, tags, trace_context)
VALUES (@run_id, @workflow_name, @workflow_version, @workflow_id, @input::jsonb, @queue, @schedule_name,
        CASE WHEN @token::uuid IS NOT NULL THEN 'running' WHEN @start_at::timestamptz IS NOT NULL THEN 'waiting' ELSE 'pending' END,
        @token::uuid,
        ` + plusMS(`now()`, `CASE WHEN @token::uuid IS NOT NULL THEN @lease_ms::bigint END`) + `,
        CASE WHEN @token::uuid IS NULL THEN 0 ELSE 1 END, CASE WHEN @token::uuid IS NULL THEN 0 ELSE 1 END,
        ` + nowIf(`@token::uuid IS NOT NULL`) + `,
        ` + plusMS(`now()`, `CASE WHEN @hold_ms::bigint > 0 THEN @hold_ms::bigint END`) + `,
        @start_at::timestamptz, nullif(@run_timeout_ms::bigint, 0), @deadline_at::timestamptz, @parent_run_id::uuid,
        @parent_seq::int, @parent_close_policy::text,
        @continued_from::uuid, @tags::jsonb, @trace_context::jsonb)
ON CONFLICT (workflow_name, workflow_id) WHERE status <> 'continued' DO NOTHING
RETURNING run_id`

var insertRunStmt = named(insertRun)

// insertContinuedRun is insertRun for a run ContinueAsNew starts
// (@continued_from the run it continues): it records its chain's first
// run, and takes the tags and trace context of the run it continues when
// it has none of its own. insertRun stays free of these subqueries: with
// them PostgreSQL plans every start anew (a custom plan folds them away,
// so it never settles on the generic one), which cost a one-at-a-time
// start 0.13 ms of its 0.45 (engine bench, start p50).
//
// It is an INSERT ... SELECT, since Citus refuses a subquery in an
// INSERT's VALUES, with the times given as insertRuns gives them (@now,
// the engine's clock, and the columns whose default is now()), since
// Citus breaks an INSERT ... SELECT that has a STABLE function.
var insertContinuedRun = named(strings.NewReplacer(
	"VALUES (@run_id,", "SELECT @run_id,",
	"now()", "@now::timestamptz",
	"parent_close_policy, first_run_id, tags, trace_context)", "parent_close_policy, first_run_id, tags, trace_context, enqueued_at, created_at)",
	"@continued_from::uuid, @tags::jsonb, @trace_context::jsonb)", `(SELECT coalesce(p.first_run_id, p.run_id) FROM pgdurable.workflow_runs p WHERE p.run_id = @continued_from::uuid),
        coalesce(@tags::jsonb, (SELECT p.tags FROM pgdurable.workflow_runs p WHERE p.run_id = @continued_from::uuid)),
        coalesce(@trace_context::jsonb, (SELECT p.trace_context FROM pgdurable.workflow_runs p WHERE p.run_id = @continued_from::uuid)),
        @now::timestamptz, @now::timestamptz`).Replace(insertRun))

// existingRun compares inputs as jsonb, so key order and whitespace do not
// matter (Stripe's rule: same key + same parameters is the same request).
// A run a chain continued into (ContinueAsNew) also matches its chain's
// first input: the start that began the chain, retried.
const existingRun = `
SELECT r.run_id, r.input = $3::jsonb OR coalesce((SELECT f.input = $3::jsonb FROM pgdurable.workflow_runs f WHERE f.run_id = r.first_run_id), false),
       r.status
FROM pgdurable.workflow_runs r
WHERE r.workflow_name = $1 AND r.workflow_id = $2 AND r.status <> 'continued'`

// InsertRun inserts r unless a run with its workflow ID exists. An existing
// run with the same input is returned with Existing set; one with another
// input returns ErrConflict. Concurrent inserts of one workflow ID serialise
// on the unique index, so exactly one wins.
func InsertRun(ctx context.Context, db DBTX, r NewRun) (*InsertedRun, error) {
	db = at(db, r.RunID)
	if r.DebounceKey != "" {
		return insertDebounced(ctx, db, r)
	}
	if r.FlowQueue != "" {
		runs := []NewRun{r}
		if err := flowTags(ctx, db, runs); err != nil {
			return nil, err
		}
		res, err := insertFlowRuns(ctx, db, runs)
		if err != nil {
			return nil, err
		}
		return res[0].Run, res[0].Err
	}
	var id uuid.UUID
	stmt, args := insertRunStmt, r.args()
	if r.ContinuedFrom != nil {
		stmt, args["now"] = insertContinuedRun, time.Now()
	}
	err := stmt.queryRow(ctx, db, args).Scan(&id)
	if err == nil {
		return &InsertedRun{RunID: id, Status: r.insertedStatus()}, nil
	}
	if err = translate(err); err != ErrNotFound {
		return nil, err
	}
	return existing(ctx, db, r)
}

// args are insertRun's arguments for r.
func (r *NewRun) args() pgx.StrictNamedArgs {
	var token *uuid.UUID
	var lease int64
	if r.Claim != nil {
		token, lease = &r.Claim.Token, ms(r.Claim.Lease)
	}
	args := pgx.StrictNamedArgs{"run_id": r.RunID, "workflow_name": r.WorkflowName, "workflow_version": r.WorkflowVersion,
		"workflow_id": r.WorkflowID, "input": r.Input, "queue": r.Queue, "schedule_name": r.ScheduleName,
		"token": token, "lease_ms": lease, "hold_ms": ms(r.Hold), "start_at": r.StartAt, "run_timeout_ms": ms(r.RunTimeout),
		"deadline_at": r.Deadline, "parent_run_id": nil, "parent_seq": nil, "parent_close_policy": nil,
		"continued_from": r.ContinuedFrom, "tags": jsonParam(r.Tags), "trace_context": jsonParam(r.TraceContext)}
	if p := r.Parent; p != nil {
		args["parent_run_id"], args["parent_seq"], args["parent_close_policy"] = p.RunID, p.Seq, p.ClosePolicy
	}
	return args
}

// insertedStatus is the status r is inserted with.
func (r *NewRun) insertedStatus() string {
	switch {
	case r.Claim != nil:
		return RunRunning
	case r.StartAt != nil:
		return RunWaiting
	}
	return RunPending
}

// existing reads the run that holds r's workflow ID.
func existing(ctx context.Context, db DBTX, r NewRun) (*InsertedRun, error) {
	out := &InsertedRun{Existing: true}
	var same bool
	if err := db.QueryRow(ctx, existingRun, r.WorkflowName, r.WorkflowID, r.Input).Scan(&out.RunID, &same, &out.Status); err != nil {
		// The conflicting row is invisible to this snapshot (a caller's
		// REPEATABLE READ transaction): let the caller retry.
		return nil, fmt.Errorf("reading existing run for workflow ID %q: %w", r.WorkflowID, translate(err))
	}
	if !same {
		return out, ErrConflict
	}
	return out, nil
}

// ClaimedRun is a run whose lease this delivery holds.
type ClaimedRun struct {
	RunID             uuid.UUID
	WorkflowName      string
	WorkflowVersion   int
	WorkflowID        string
	Input             []byte
	Deliveries        int
	StalledDeliveries int
	// LongStalled is how many of the earlier stalled deliveries heartbeat
	// after living a whole lease (see Heartbeat).
	LongStalled     int
	Status          string // running, or compensating
	CancelRequested bool
	// Deadline is when the run's timeout ends (StartOpts.RunTimeout), nil
	// for none.
	Deadline *time.Time
	// Parent is the run's parent, for a child run.
	Parent *ParentRef
	// RunTimeout is the run's timeout (0: none).
	RunTimeout time.Duration
	// TraceContext is the run's stored trace context (nil: none).
	TraceContext []byte
	// VersionWaitSince is when processes that do not register the run's
	// version began handing it back (see ReleaseUnclaimed); nil when none
	// did since a process that registers it last ran it.
	VersionWaitSince *time.Time
	// FlowQueue is the run's flow-controlled queue, "" for none.
	FlowQueue string
	Steps     []StepRecord
}

// ClaimMiss says why a delivery did not get the lease.
type ClaimMiss struct {
	Status    string     // the run's status ("" when the run does not exist)
	Leased    bool       // another delivery holds a live lease
	WakeAt    *time.Time // the run waits until then
	NotExists bool
	// FlowQueue is the run's flow-controlled queue: its admission, not a
	// ticket, claims it (see MarkReady).
	FlowQueue string
}

func scanSteps(rows pgx.Rows) ([]StepRecord, error) {
	defer rows.Close()
	var out []StepRecord
	for rows.Next() {
		var s StepRecord
		if err := rows.Scan(&s.Seq, &s.Name, &s.Kind, &s.Status, &s.Attempts, &s.RequestID, &s.Output, &s.Error,
			&s.NextAttemptAt, &s.FirstFailedAt, &s.StartedAt, &s.CompletedAt, &s.Compensation, &s.CompensationOf, &s.InputHash, &s.FailedAttempts, &s.Patches); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// stepConflict updates a step record in place: a retry's attempts, an
// activity's outcome after its stored request ID (kept), a replay's reset.
// A completed record is never overwritten (the row is left, and not
// counted as written): a tx step's retry that finds its earlier attempt
// committed must roll its own effects back.
var stepConflict = stepConflictSet + stepConflictGuard

// stepConflictSet is stepConflict's update of the record.
var stepConflictSet = `
    ON CONFLICT (run_id, seq) DO UPDATE SET
        status = excluded.status,
        attempts = excluded.attempts,
        request_id = coalesce(excluded.request_id, s.request_id),
        output = excluded.output,
        error = excluded.error,
        next_attempt_at = excluded.next_attempt_at,
        first_failed_at = coalesce(s.first_failed_at, excluded.first_failed_at),
        completed_at = excluded.completed_at,
        compensation = coalesce(excluded.compensation, s.compensation),
        compensation_of = coalesce(excluded.compensation_of, s.compensation_of),
        input_hash = coalesce(s.input_hash, excluded.input_hash),
        patches = coalesce(s.patches, excluded.patches),
        failed_attempts = CASE
            WHEN excluded.failed_attempts IS NULL
              OR (s.status = excluded.status AND s.attempts = excluded.attempts AND s.error IS NOT DISTINCT FROM excluded.error)
            THEN s.failed_attempts
            ELSE ` + keepLatest(`CASE WHEN (s.failed_attempts -> -1 ->> 'attempt')::int = excluded.attempts
                            AND s.failed_attempts -> -1 ->> 'replayed' IS NULL
                       THEN s.failed_attempts - (-1) ELSE coalesce(s.failed_attempts, '[]'::jsonb) END`) + ` || excluded.failed_attempts
        END`

// MaxFailedAttempts bounds the failed attempts a step record keeps
// (workflow_steps.failed_attempts): the latest ones.
const MaxFailedAttempts = 20

// keepLatest is the jsonb array list with its oldest entry dropped when it
// holds MaxFailedAttempts, so that one more keeps it within the bound.
func keepLatest(list string) string {
	return `(CASE WHEN jsonb_array_length(` + list + `) >= ` + strconv.Itoa(MaxFailedAttempts) + ` THEN (` + list + `) - 0 ELSE ` + list + ` END)`
}

// RunEndedChannel is the channel on which the functions that end a
// watched run (see WatchRun) notify (NotifyRunsEnded), with the run's ID
// as the payload.
const RunEndedChannel = "pgdurable_run_ended"

// WatchRun marks a run watched, so that the function that ends it
// notifies RunEndedChannel, and returns its status as of then: a run that
// ended before the mark sends nothing, and its status says so.
// ErrNotFound for an unknown run.
func WatchRun(ctx context.Context, db DBTX, runID uuid.UUID) (status string, err error) {
	db = at(db, runID)
	err = db.QueryRow(ctx, `UPDATE pgdurable.workflow_runs SET watched = true WHERE run_id = $1 RETURNING status`, runID).Scan(&status)
	return status, translate(err)
}

// StepsWritten is what WriteSteps did: whether the run's cancellation
// was requested, and how many records it wrote (a completed record is
// never overwritten, so not counted).
type StepsWritten struct {
	CancelRequested bool
	Written         int
}

// writeStepsFence extends the lease of the run @token owns, moving it to
// @run_status (NULL leaves it), after its records' INSERT.
var writeStepsFence = named(`
-- pgdurable: workflow_runs fence of a delivery's records
WITH run AS (
    UPDATE pgdurable.workflow_runs SET lease_expires_at = ` + plusMS(`now()`, `@lease_ms::bigint`) + `,
        stalled_deliveries = 0, long_stalled_deliveries = 0, status = coalesce(@run_status::text, status)
    WHERE run_id = @run_id AND owner_token = @token
    RETURNING cancel_requested_at IS NOT NULL AS cancel
)
SELECT count(*), coalesce(bool_or(cancel), false) FROM run`)

// WriteSteps records recs and extends the lease, fenced by token (one
// round trip, one transaction), moving the run to status unless it is "".
// A completed record is never overwritten. ErrLeaseLost when token no
// longer owns the run.
func WriteSteps(ctx context.Context, db DBTX, f Fence, status string, recs ...*StepRecord) (StepsWritten, error) {
	db = at(db, f.RunID)
	runID := f.RunID
	var statusArg *string
	if status != "" {
		statusArg = &status
	}
	fence := pgx.StrictNamedArgs{"run_id": uuidParam(runID), "token": uuidParam(f.Token)}
	b := &pgx.Batch{}
	if len(recs) > 0 {
		var c stepColumns // its run and token columns are not sent: the fence is one
		for _, r := range recs {
			c.add(f, r)
		}
		recordsForUpdate.queue(b, c.args(maps.Clone(fence)))
	}
	writeStepsFence.queue(b, pgx.StrictNamedArgs{"run_id": uuidParam(runID), "token": uuidParam(f.Token),
		"lease_ms": ms(f.Lease), "run_status": statusArg})
	var found int
	var out StepsWritten
	err := sendAtomic(ctx, db, b, func(br pgx.BatchResults) error {
		if len(recs) > 0 {
			tag, err := br.Exec()
			if err != nil {
				return err
			}
			out.Written = int(tag.RowsAffected())
		}
		return br.QueryRow().Scan(&found, &out.CancelRequested)
	})
	if err != nil {
		return StepsWritten{}, fmt.Errorf("recording steps of run %s: %w", runID, translate(err))
	}
	if found == 0 {
		return StepsWritten{}, ErrLeaseLost
	}
	return out, nil
}

// sendBatch sends b on db and reads its results with read, then closes
// them; the error is read's, else Close's.
func sendBatch(ctx context.Context, db DBTX, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	br := db.SendBatch(ctx, b)
	err := read(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// commitGuard is the statement after a tx step's records (CommitStep,
// CommitSteps), whose COMMIT is queued behind it in the same round trip:
// a fence that failed must not let that COMMIT commit the transaction's
// other writes, so the statement fails (division by zero, SQLSTATE 22012,
// caught as ErrStepsNotCommitted) and the COMMIT, skipped with the rest
// of the pipeline, leaves the transaction aborted. It reports whether the
// run's cancellation was requested.
//
// commitGuard only reads the run's row: the records' INSERT locked it
// (FOR SHARE) where the fence held, so that a takeover's claim (an update)
// waits for this transaction and then loads its records, and a terminate
// or a claim committed before it fails the fence. It resets the stall
// counts of a delivery that made progress only where they are set (once
// per delivery: the claim counts each one), so that a tx step writes no
// new version of the run's row; the lease is left to the heartbeat. The
// record's primary key is what makes the step's writes exactly-once
// against another delivery of the run: a second record of a completed
// step fails its INSERT, and with it the transaction.
var commitGuard = named(`
-- pgdurable: the fence of a tx step's records, committed with its transaction
WITH progress AS (
    UPDATE pgdurable.workflow_runs SET stalled_deliveries = 0, long_stalled_deliveries = 0
    WHERE run_id = @run_id AND owner_token = @token AND (stalled_deliveries > 0 OR long_stalled_deliveries > 0)
)
SELECT coalesce(bool_or(cancel_requested_at IS NOT NULL), false), 1 / count(*)::int
FROM pgdurable.workflow_runs WHERE run_id = @run_id AND owner_token = @token`)

// commitGuardExtending is commitGuardKept for a delivery's first tx step
// write, or one whose lease is a heartbeat interval old (StepCommit.Keep
// false): it resets the stall counts and extends the lease.
var commitGuardExtending = named(`
-- pgdurable: the fence of a tx step's records, committed with its transaction, extending the lease
WITH run AS (
    UPDATE pgdurable.workflow_runs SET lease_expires_at = ` + plusMS(`now()`, `@lease_ms::bigint`) + `,
        stalled_deliveries = 0, long_stalled_deliveries = 0
    WHERE run_id = @run_id AND owner_token = @token
    RETURNING cancel_requested_at IS NOT NULL AS cancel
)
SELECT coalesce(bool_or(cancel), false), 1 / count(*)::int FROM run`)

// commitGuardKept is commitGuard for CommitStep's record with
// StepCommit.Keep: the fence alone, under a share lock, as a delivery's
// later writes leave the run's row as it is. It comes before the record
// (recordValues), which the lock fences.
var commitGuardKept = named(`
-- pgdurable: the fence of a tx step's record, committed with its transaction
SELECT coalesce(bool_or(cancel), false), 1 / count(*)::int FROM (
    SELECT cancel_requested_at IS NOT NULL AS cancel FROM pgdurable.workflow_runs
    WHERE run_id = @run_id AND owner_token = @token
    FOR SHARE
) run`)

// StepCommit is what CommitStep commits: Record, fresh, fenced by Fence;
// Begun says a transaction is open on the connection (else the record is
// written on its own); Keep leaves the lease as it is (see
// RecordWrite.KeepLease), else the write extends it.
type StepCommit struct {
	Fence  Fence
	Begun  bool
	Keep   bool
	Record *StepRecord
}

// CommitStep is CommitSteps for the common case, one record that cannot
// exist yet (StepRecord.Fresh): its INSERT has scalar parameters, which
// PostgreSQL plans once, and no ON CONFLICT (no speculative insertion); a
// record that exists after all (a second delivery's) fails it. Unless
// c.Keep, the write extends the lease (commitGuardExtending).
func CommitStep(ctx context.Context, db DBTX, c StepCommit) (StepsWritten, error) {
	db = at(db, c.Fence.RunID)
	f, rec := c.Fence, c.Record
	fence := pgx.StrictNamedArgs{"run_id": uuidParam(f.RunID), "token": uuidParam(f.Token)}
	b := &pgx.Batch{}
	if c.Keep {
		commitGuardKept.queue(b, fence)
	} else {
		commitGuardExtending.queue(b, pgx.StrictNamedArgs{"run_id": fence["run_id"], "token": fence["token"], "lease_ms": ms(f.Lease)})
	}
	recordValues(true).queue(b, stepArgs(pgx.StrictNamedArgs{"run_id": fence["run_id"]}, f, rec))
	var out StepsWritten
	var guard int
	err := sendCommit(ctx, db, b, c.Begun, func(br pgx.BatchResults) error {
		if err := br.QueryRow().Scan(&out.CancelRequested, &guard); err != nil {
			return err
		}
		_, err := br.Exec()
		return err
	})
	if errors.Is(err, ErrStepsNotCommitted) {
		return StepsWritten{}, err
	}
	if err != nil {
		return StepsWritten{}, fmt.Errorf("committing step %d of run %s: %w", rec.Seq, f.RunID, err)
	}
	out.Written = 1
	return out, nil
}

// sendCommit sends b, a tx step's record and guard statements which read
// reads, and COMMIT when begun, in one round trip. Their refusals come
// back as ErrStepsNotCommitted: the guard's division by zero (a fence that
// failed, or a strict conflict with a completed record), and a fresh
// record's insert that found one (unique_violation). Other errors, the
// COMMIT's among them (a deferred constraint of the step's own writes),
// come back translated. On Citus the step's transaction commits in two
// phases when the step wrote the coordinator (see TwoPhase), so that its
// writes and its record commit together.
func sendCommit(ctx context.Context, db DBTX, b *pgx.Batch, begun bool, read func(pgx.BatchResults) error) error {
	ends := 0
	if begun {
		citus, err := onCitus(ctx, db)
		if err != nil {
			return err
		}
		if citus {
			b.Queue(db.schema().twoPhaseSQL())
			ends++
		}
		b.Queue("commit")
		ends++
	}
	br := db.SendBatch(ctx, b)
	err := read(br)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "22012" || pgErr.Code == "23505") {
		_ = br.Close()
		return ErrStepsNotCommitted
	}
	for range ends {
		if err != nil {
			break
		}
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return translate(err)
}

// ErrStepsNotCommitted is CommitSteps's refusal: the fence failed (the
// lease is lost) or a record was completed already. The transaction is
// left aborted; roll it back.
var ErrStepsNotCommitted = errors.New("store: step records not committed: lease lost or step recorded already")

// CommitSteps records recs, fenced by f's token, as the last statements of
// the transaction open on db (begun: a transaction is open, else the
// records are written on their own), and COMMITs, in one round trip.
// Unlike WriteSteps it leaves the lease as it is (the heartbeat extends
// it) and resets the stall counts only if they are set. It returns
// ErrStepsNotCommitted, with the transaction aborted and nothing
// committed, when the fence failed or any of recs was completed already;
// any other error of the COMMIT's (a deferred constraint, a
// serialization failure) as it comes. When the round trip's reply is
// lost the outcome is unknown: read the records.
func CommitSteps(ctx context.Context, db DBTX, f Fence, begun bool, recs ...*StepRecord) (StepsWritten, error) {
	db = at(db, f.RunID)
	runID := f.RunID
	var c stepColumns
	for _, r := range recs {
		c.add(f, r)
	}
	fence := pgx.StrictNamedArgs{"run_id": uuidParam(runID), "token": uuidParam(f.Token)}
	b := &pgx.Batch{}
	recordsForShareStrict.queue(b, c.args(maps.Clone(fence)))
	commitGuard.queue(b, fence)
	var guard int
	var out StepsWritten
	err := sendCommit(ctx, db, b, begun, func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil {
			return err
		}
		out.Written = int(tag.RowsAffected())
		return br.QueryRow().Scan(&out.CancelRequested, &guard)
	})
	if errors.Is(err, ErrStepsNotCommitted) {
		return StepsWritten{}, err
	}
	if err != nil {
		return StepsWritten{}, fmt.Errorf("committing steps of run %s: %w", runID, translate(err))
	}
	return out, nil
}

// XactStatus is pg_xact_status of the transaction xid (text): committed,
// aborted or in progress.
func XactStatus(ctx context.Context, db DBTX, xid string) (string, error) {
	var status *string
	if err := db.QueryRow(ctx, `SELECT pg_xact_status($1::xid8)`, xid).Scan(&status); err != nil {
		return "", fmt.Errorf("reading the status of transaction %s: %w", xid, err)
	}
	if status == nil {
		return "aborted", nil // too old to know: it cannot still be open
	}
	return *status, nil
}

// OwnsRun reports whether f's token still holds the run's lease.
func OwnsRun(ctx context.Context, db DBTX, f Fence) (bool, error) {
	db = at(db, f.RunID)
	var owns bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pgdurable.workflow_runs WHERE run_id = $1 AND owner_token = $2)`,
		f.RunID, f.Token).Scan(&owns)
	if err != nil {
		return false, fmt.Errorf("reading the lease of run %s: %w", f.RunID, err)
	}
	return owns, nil
}

// GetStep reads one step record; ErrNotFound when there is none.
func GetStep(ctx context.Context, db DBTX, runID uuid.UUID, seq int) (*StepRecord, error) {
	db = at(db, runID)
	rows, err := db.Query(ctx, `SELECT seq, name, kind, status, attempts, request_id, output, error, next_attempt_at,
       first_failed_at, started_at, completed_at, compensation, compensation_of, input_hash, failed_attempts, patches
FROM pgdurable.workflow_steps WHERE run_id = $1 AND seq = $2`, runID, seq)
	if err != nil {
		return nil, fmt.Errorf("reading step %d of run %s: %w", seq, runID, err)
	}
	steps, err := scanSteps(rows)
	if err != nil {
		return nil, fmt.Errorf("reading step %d of run %s: %w", seq, runID, err)
	}
	if len(steps) == 0 {
		return nil, ErrNotFound
	}
	return &steps[0], nil
}

func jsonText(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// A delivery that recorded progress has reset stalled_deliveries to 0 and
// is no longer a stalled one: it is not marked.
const heartbeat = `
UPDATE pgdurable.workflow_runs SET lease_expires_at = now() + $3::bigint * interval '1 millisecond',
    long_stalled_deliveries = long_stalled_deliveries + CASE WHEN $4::bool AND stalled_deliveries > 0 THEN 1 ELSE 0 END
WHERE run_id = $1 AND owner_token = $2
RETURNING cancel_requested_at IS NOT NULL, $4::bool AND stalled_deliveries > 0`

// Heartbeat extends the lease and reports (Landed true) whether
// cancellation was requested; ErrLeaseLost when token no longer owns the
// run. markLong asks to count this delivery as long-lived (it has run for
// a whole lease without progress); Marked reports whether it was, so the
// caller asks once and a hand-back can undo exactly that (SuspendParams's
// WasLong).
func Heartbeat(ctx context.Context, db DBTX, f Fence, markLong bool) (BeatResult, error) {
	db = at(db, f.RunID)
	runID := f.RunID
	res := BeatResult{Landed: true}
	err := db.QueryRow(ctx, heartbeat, runID, f.Token, ms(f.Lease), markLong).Scan(&res.CancelRequested, &res.Marked)
	if translate(err) == ErrNotFound {
		return BeatResult{}, ErrLeaseLost
	}
	if err != nil {
		return BeatResult{}, fmt.Errorf("extending lease of run %s: %w", runID, translate(err))
	}
	return res, nil
}

// CancelRun requests cancellation of an active run and returns its status
// before the request. A compensating run is left alone: it is already
// undoing its steps, and its outcome (compensated, with its error) stands.
// A waiting run becomes pending (WakeUp): the caller enqueues a delivery
// in the same transaction so compensations run now. ErrNotFound when there
// is no such run; a finished run is returned unchanged (the caller reports
// it closed).
//
// now is the time the request is recorded at.
func CancelRun(ctx context.Context, db DBTX, runID uuid.UUID, now time.Time) (CancelRunResult, error) {
	db = at(db, runID)
	var res CancelRunResult
	if err := db.QueryRow(ctx, cancelRun, runID, now).Scan(&res.Status, &res.Requested); err != nil {
		return CancelRunResult{}, translate(err)
	}
	res.WakeUp = res.Status == RunWaiting
	return res, nil
}

// CancelRunResult is what CancelRun found and did.
type CancelRunResult struct {
	Status string // the run's status before the request
	// WakeUp: the run was waiting and is now pending; the caller enqueues
	// its delivery in the same transaction.
	WakeUp bool
	// Requested: this call requested the cancellation (the run was active
	// and none was requested before), so that concurrent callers count
	// each request once.
	Requested bool
}

const cancelRun = `
WITH target AS (
    SELECT run_id, status, cancel_requested_at IS NULL AS first FROM pgdurable.workflow_runs WHERE run_id = $1 FOR UPDATE
), upd AS (
    UPDATE pgdurable.workflow_runs r SET
        cancel_requested_at = coalesce(r.cancel_requested_at, $2),
        status = CASE WHEN target.status = 'waiting' THEN 'pending' ELSE r.status END,
        wake_at = CASE WHEN target.status = 'waiting' THEN NULL ELSE r.wake_at END,
        await_signal = CASE WHEN target.status = 'waiting' THEN NULL ELSE r.await_signal END,
        enqueued_at = CASE WHEN target.status = 'waiting' THEN $2 ELSE r.enqueued_at END
    FROM target
    WHERE r.run_id = target.run_id AND target.status IN ('pending', 'running', 'waiting')
)
SELECT status, first AND status IN ('pending', 'running', 'waiting') FROM target`

// CancelRequested returns which of runIDs have a cancellation requested:
// a primary-key lookup per run, read-only.
func CancelRequested(ctx context.Context, db DBTX, runIDs []uuid.UUID) ([]uuid.UUID, error) {
	return idsByRoute(runIDs, db, func(db DBTX, runIDs []uuid.UUID) ([]uuid.UUID, error) {
		return cancelRequested(ctx, db, runIDs)
	})
}

func cancelRequested(ctx context.Context, db DBTX, runIDs []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, `SELECT run_id FROM pgdurable.workflow_runs WHERE run_id = ANY($1) AND cancel_requested_at IS NOT NULL`, runIDs)
	if err != nil {
		return nil, fmt.Errorf("reading cancellations: %w", translate(err))
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

var suspendRun = named(`
-- pgdurable: a delivery hands its run back
WITH run AS (
    UPDATE pgdurable.workflow_runs SET status = @run_status, wake_at = @wake_at, owner_token = NULL, lease_expires_at = NULL,
        enqueued_at = ` + nowIfElse(`@wake_at::timestamptz IS NULL`, `enqueued_at`) + `,
        stalled_deliveries = CASE WHEN @progress::bool THEN 0 ELSE greatest(stalled_deliveries - 1, 0) END,
        long_stalled_deliveries = CASE WHEN @progress::bool THEN 0 ELSE greatest(long_stalled_deliveries - @long::int, 0) END
    WHERE run_id = @run_id AND owner_token = @token
    RETURNING run_id
)
SELECT count(*), false FROM run`)

// SuspendParams says how SuspendRun hands a run back.
type SuspendParams struct {
	Pending *StepRecord // written in the same statement; may be nil
	Status  string      // waiting (until WakeAt), pending or compensating
	WakeAt  *time.Time  // nil: due now (the caller enqueues a ticket)
	// Progress counts the delivery as progress; false (a shutdown) leaves
	// it uncounted, and WasLong says whether Heartbeat counted it as
	// long-lived, to undo exactly that.
	Progress, WasLong bool
}

// SuspendRun hands the run f fences back without finishing it: waiting
// until p.WakeAt (a retry backoff, a timer), or pending when a shutdown
// interrupted the delivery. The caller enqueues the next delivery in the
// same transaction when there is no wake time. f.Lease is not used: the
// lease ends.
func SuspendRun(ctx context.Context, db DBTX, f Fence, p SuspendParams) error {
	db = at(db, f.RunID)
	long := 0
	if p.WasLong {
		long = 1
	}
	args := pgx.StrictNamedArgs{"run_id": f.RunID, "token": f.Token, "run_status": p.Status, "wake_at": p.WakeAt,
		"progress": p.Progress, "long": long}
	return fencedWithRecord(ctx, db, f, p.Pending, "suspending run %s", call{suspendRun, args})
}

// ReleaseUnclaimed gives back a lease this delivery took but cannot use (a
// stopping process's, or one whose workflow version this process does not
// register), without counting a delivery.
const releaseUnclaimed = `
UPDATE pgdurable.workflow_runs SET ` + releaseClaim + `
WHERE run_id = $1 AND owner_token = $2`

// releaseClaim undoes a claim: no lease, and the delivery it counted
// uncounted.
const releaseClaim = `owner_token = NULL, lease_expires_at = NULL,
    status = CASE WHEN status = 'running' THEN 'pending' ELSE status END,
    deliveries = deliveries - 1, stalled_deliveries = greatest(stalled_deliveries - 1, 0)`

// ReleaseUnclaimed undoes the claim f holds for a delivery that cannot run
// the workflow.
func ReleaseUnclaimed(ctx context.Context, db DBTX, f Fence) error {
	db = at(db, f.RunID)
	_, err := db.Exec(ctx, releaseUnclaimed, f.RunID, f.Token)
	return translate(err)
}

// releaseUnregistered is releaseUnclaimed that also stamps when the run
// began to wait for a process that registers its version (kept from the
// first hand-back on, the time a parameter, as Citus needs it), and that
// leaves a run no code ran yet unstarted: its timeout's clock starts at
// the pick-up that runs it.
const releaseUnregistered = `
UPDATE pgdurable.workflow_runs SET ` + releaseClaim + `,
    started_at = CASE WHEN deliveries = 1 THEN NULL ELSE started_at END,
    deadline_at = CASE WHEN deliveries = 1 THEN NULL ELSE deadline_at END,
    version_wait_since = coalesce(version_wait_since, $3::timestamptz)
WHERE run_id = $1 AND owner_token = $2
RETURNING version_wait_since`

// ReleaseUnregistered is ReleaseUnclaimed for a delivery by a process that
// does not register the run's workflow version, as of now: it returns
// since when the run has waited for a process that does (now, on its
// first hand-back). A claim lost meanwhile (the run swept) returns the
// zero time and no error.
func ReleaseUnregistered(ctx context.Context, db DBTX, f Fence, now time.Time) (since time.Time, err error) {
	db = at(db, f.RunID)
	err = translate(db.QueryRow(ctx, releaseUnregistered, f.RunID, f.Token, now).Scan(&since))
	if err == ErrNotFound {
		return time.Time{}, nil
	}
	return since, err
}

// ClearVersionWait ends the wait for a process that registers the run's
// version (see ReleaseUnclaimed), for the delivery that holds f: one that
// registers it.
func ClearVersionWait(ctx context.Context, db DBTX, f Fence) error {
	db = at(db, f.RunID)
	_, err := db.Exec(ctx, `UPDATE pgdurable.workflow_runs SET version_wait_since = NULL
WHERE run_id = $1 AND owner_token = $2 AND version_wait_since IS NOT NULL`, f.RunID, f.Token)
	return translate(err)
}

// UpgradeRunVersion moves the run the delivery holding f holds to workflow
// version (WorkflowOpts.AutoUpgrade), never down, and ends its wait for a
// process of its old version; false when the claim was lost (or the run
// is on version or a later one already).
func UpgradeRunVersion(ctx context.Context, db DBTX, f Fence, version int) (bool, error) {
	db = at(db, f.RunID)
	tag, err := db.Exec(ctx, `UPDATE pgdurable.workflow_runs SET workflow_version = $3, version_wait_since = NULL
WHERE run_id = $1 AND owner_token = $2 AND workflow_version < $3`, f.RunID, f.Token, version)
	if err != nil {
		return false, fmt.Errorf("upgrading run %s to version %d: %w", f.RunID, version, translate(err))
	}
	return tag.RowsAffected() == 1, nil
}

// RunVersions names the workflow versions a starting process runs: Name
// at Version, and, where Below is set (WorkflowOpts.AutoUpgrade on the
// latest version), Name below Below too.
type RunVersions struct {
	Name    string
	Version int
	Below   int
}

// WakeParams says which runs WakeVersionWaits wakes: up to Limit on Queue
// that Versions cover, as of Now.
type WakeParams struct {
	Queue    string
	Versions []RunVersions
	Now      time.Time
	Limit    int
}

// WakeVersionWaits marks for a new ticket the runs p names that wait for a
// process of their version (see ReleaseUnregistered), and returns them;
// the caller enqueues them in the same transaction. Their own tickets are
// snoozed for up to 30 s: a process of their version that starts takes
// them at once instead.
func WakeVersionWaits(ctx context.Context, tx DBTX, p WakeParams) ([]uuid.UUID, error) {
	var out []uuid.UUID
	err := eachRoute(ctx, tx, func(tx DBTX) error {
		if len(out) >= p.Limit {
			return nil
		}
		q := p
		q.Limit -= len(out)
		woken, err := wakeVersionWaits(ctx, tx, q)
		out = append(out, woken...)
		return err
	})
	return out, err
}

func wakeVersionWaits(ctx context.Context, tx DBTX, p WakeParams) ([]uuid.UUID, error) {
	names, versions, below := make([]string, len(p.Versions)), make([]int32, len(p.Versions)), make([]int32, len(p.Versions))
	for i, v := range p.Versions {
		names[i], versions[i], below[i] = v.Name, int32(v.Version), int32(v.Below)
	}
	// A read, then an update by run ID: Citus runs neither a modification
	// whose subquery has a LIMIT across shards nor FOR UPDATE there, so
	// the update repeats the read's conditions instead of locking.
	rows, err := tx.Query(ctx, `
SELECT w.run_id FROM pgdurable.workflow_runs w
JOIN unnest($2::text[], $3::int[], $4::int[]) AS v(name, version, below)
  ON w.workflow_name = v.name AND (w.workflow_version = v.version OR w.workflow_version < v.below)
WHERE w.queue = $1 AND w.version_wait_since IS NOT NULL AND w.status IN ('pending', 'compensating')
  AND w.owner_token IS NULL AND w.wake_at IS NULL
LIMIT $5`, p.Queue, names, versions, below, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("finding runs waiting for a version: %w", translate(err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	rows, err = tx.Query(ctx, `
UPDATE pgdurable.workflow_runs SET enqueued_at = $2::timestamptz
WHERE run_id = ANY($1) AND version_wait_since IS NOT NULL AND status IN ('pending', 'compensating')
  AND owner_token IS NULL AND wake_at IS NULL
RETURNING run_id`, uuids(ids), p.Now)
	if err != nil {
		return nil, fmt.Errorf("waking runs waiting for a version: %w", translate(err))
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// VersionWait is the runs of one workflow version on a queue that wait
// for a process that registers it (see ReleaseUnregistered).
type VersionWait struct {
	Workflow string
	Version  int
	Runs     int64
	Oldest   time.Time // the longest-waiting run's version_wait_since
	Overdue  int64     // how many have waited since before the overdue time
}

// MaxVersionWaits bounds the workflow versions VersionWaits returns (the
// longest-waiting first), so a scrape stays small whatever is stored.
const MaxVersionWaits = 50

// VersionWaits counts the open runs on queue waiting for a process that
// registers their version, by workflow version, longest-waiting first;
// Overdue counts those waiting since before overdue. It reads the partial
// index of such runs only.
func VersionWaits(ctx context.Context, db DBTX, queue string, overdue time.Time) ([]VersionWait, error) {
	type key struct {
		name    string
		version int
	}
	merged := map[key]*VersionWait{}
	err := eachRoute(ctx, db, func(db DBTX) error {
		waits, err := versionWaits(ctx, db, queue, overdue)
		for _, w := range waits {
			m := merged[key{w.Workflow, w.Version}]
			if m == nil {
				m = &VersionWait{Workflow: w.Workflow, Version: w.Version, Oldest: w.Oldest}
				merged[key{w.Workflow, w.Version}] = m
			}
			m.Runs, m.Overdue = m.Runs+w.Runs, m.Overdue+w.Overdue
			if w.Oldest.Before(m.Oldest) {
				m.Oldest = w.Oldest
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]VersionWait, 0, len(merged))
	for _, w := range merged {
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b VersionWait) int {
		return cmp.Or(a.Oldest.Compare(b.Oldest), cmp.Compare(a.Workflow, b.Workflow), cmp.Compare(a.Version, b.Version))
	})
	return out[:min(len(out), MaxVersionWaits)], nil
}

func versionWaits(ctx context.Context, db DBTX, queue string, overdue time.Time) ([]VersionWait, error) {
	rows, err := db.Query(ctx, `
SELECT workflow_name, workflow_version, count(*), min(version_wait_since),
       count(*) FILTER (WHERE version_wait_since < $2::timestamptz)
FROM pgdurable.workflow_runs
WHERE queue = $1 AND version_wait_since IS NOT NULL AND status IN ('pending', 'running', 'compensating')
GROUP BY workflow_name, workflow_version
ORDER BY min(version_wait_since), workflow_name, workflow_version
LIMIT $3`, queue, overdue, MaxVersionWaits)
	if err != nil {
		return nil, fmt.Errorf("counting runs waiting for a version: %w", translate(err))
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (VersionWait, error) {
		var w VersionWait
		err := r.Scan(&w.Workflow, &w.Version, &w.Runs, &w.Oldest, &w.Overdue)
		return w, err
	})
}

// Why the sweep handed a run back (SweptRun.Cause), as the sweep statement
// spells them.
const (
	SweptLeaseExpired = "lease_expired" // its worker died: enqueue it now
	SweptCrashBackoff = "crash_backoff" // died again without progress: held until WakeAt; a later sweep enqueues it
	SweptWake         = "wake"          // a waiting run is due
	SweptHeld         = "held"          // a run held by its starting process was not run in time: enqueue it now
	SweptTimedOut     = "timed_out"     // a running run passed its deadline: its cancellation is requested, its delivery hears of it
)

// SweptRun is a run the sweep handed a new delivery.
type SweptRun struct {
	RunID uuid.UUID
	Cause string // SweptLeaseExpired, SweptCrashBackoff, SweptWake, SweptHeld or SweptTimedOut
	// WakeAt and Stalled are set for crash_backoff: when the run is due,
	// and how many deliveries in a row died without progress.
	WakeAt  *time.Time
	Stalled int
}

// One statement finds runs whose lease expired (their worker died) and
// waiting runs whose wake time has come. SKIP LOCKED lets any number of
// engine processes sweep at once without blocking each other or a live
// writer. Woken runs become pending with no wake time, so the next sweep
// does not enqueue them again.
//
// A run whose delivery is the second or later in a row to die without
// recording progress is not enqueued at once: it waits (status waiting, or
// compensating) for a random delay of up to a lease (@lease_ms) ×
// 2^(stalled-2), capped at 4 leases (full jitter, as in AWS's backoff note). A worker that a
// poison run kills takes every run in flight with it; redelivered together
// each time, an innocent run would be parked for a crash loop it did not
// cause. The jitter spreads the suspects apart, so the innocent ones
// complete and only the poison run keeps crashing. A first crash costs no
// delay. The delay's random factor is a hash of the run's ID with a seed
// the caller draws for each sweep (jitter), not random(): Citus routes no
// statement that calls a VOLATILE function.
//
// A run of a flow-controlled queue whose lease expired (and that is not
// held back) is made ready in the same update, keeping its fair-queuing
// tag, as an admission's readyExpired would: left neither leased nor
// ready until its ticket's delivery made it ready, it held no slot of its
// key, and an admission in between started the key's next run first. Its
// ticket still goes out, to make a process admit it now.
var sweep = named(`
WITH expired AS (
    SELECT run_id FROM pgdurable.workflow_runs
    WHERE status IN ('running', 'compensating') AND queue = @queue AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT @limit
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT run_id FROM pgdurable.workflow_runs
    WHERE wake_at <= @now AND queue = @queue AND status IN ('waiting', 'compensating')
    ORDER BY wake_at
    LIMIT @limit
    FOR UPDATE SKIP LOCKED
), cancelled AS (
    SELECT run_id FROM pgdurable.workflow_runs
    WHERE status = 'waiting' AND queue = @queue AND cancel_requested_at IS NOT NULL
    LIMIT @limit
    FOR UPDATE SKIP LOCKED
), held AS (
    SELECT run_id FROM pgdurable.workflow_runs
    WHERE held_until <= now() AND queue = @queue
    ORDER BY held_until
    LIMIT @limit
    FOR UPDATE SKIP LOCKED
), timed_out AS (
    SELECT run_id, status FROM pgdurable.workflow_runs
    WHERE deadline_at <= @now AND queue = @queue AND cancel_requested_at IS NULL AND status IN ('pending', 'running', 'waiting')
    ORDER BY deadline_at
    LIMIT @limit
    FOR UPDATE SKIP LOCKED
), swept AS (
    UPDATE pgdurable.workflow_runs r SET owner_token = NULL, lease_expires_at = NULL,
        status = CASE WHEN r.stalled_deliveries >= 2 AND r.status = 'running' THEN 'waiting' ELSE r.status END,
        wake_at = ` + plusMS(`@now::timestamptz`, `CASE WHEN r.stalled_deliveries >= 2 THEN 1 END * `+jitter(`r.run_id`, `@seed::bigint`)+`
            * least(2 ^ (r.stalled_deliveries - 2), 4) * @lease_ms::bigint`) + `,
        enqueued_at = now(),
        ready_at = CASE WHEN r.flow_queue IS NOT NULL AND r.stalled_deliveries < 2 THEN @now::timestamptz ELSE r.ready_at END
    FROM expired WHERE r.run_id = expired.run_id
    RETURNING r.run_id, r.wake_at, r.stalled_deliveries
), woken AS (
    UPDATE pgdurable.workflow_runs r SET status = CASE WHEN r.status = 'waiting' THEN 'pending' ELSE r.status END,
        wake_at = NULL, await_signal = NULL, enqueued_at = now()
    WHERE r.run_id IN (SELECT run_id FROM due UNION SELECT run_id FROM cancelled)
      AND r.run_id NOT IN (SELECT run_id FROM timed_out)
    RETURNING r.run_id
), timeout_cancelled AS (
    UPDATE pgdurable.workflow_runs r SET cancel_requested_at = now(),
        status = CASE WHEN t.status = 'waiting' THEN 'pending' ELSE r.status END,
        wake_at = CASE WHEN t.status = 'waiting' THEN NULL ELSE r.wake_at END,
        await_signal = CASE WHEN t.status = 'waiting' THEN NULL ELSE r.await_signal END,
        enqueued_at = ` + nowIfElse(`t.status = 'waiting'`, `r.enqueued_at`) + `
    FROM timed_out t WHERE r.run_id = t.run_id
    RETURNING r.run_id, t.status = 'waiting' AS woken
), released AS (
    UPDATE pgdurable.workflow_runs r SET held_until = NULL, enqueued_at = now()
    FROM held WHERE r.run_id = held.run_id
    RETURNING r.run_id
)
SELECT run_id, CASE WHEN wake_at IS NULL THEN 'lease_expired' ELSE 'crash_backoff' END, wake_at, stalled_deliveries FROM swept
UNION ALL
SELECT run_id, 'wake', NULL, 0 FROM woken
UNION ALL
SELECT run_id, 'held', NULL, 0 FROM released
UNION ALL
SELECT run_id, CASE WHEN woken THEN 'wake' ELSE 'timed_out' END, NULL, 0 FROM timeout_cancelled`)

// jitter is a number in [0, 1) drawn from the SQL uuid id and bigint seed:
// the low 52 bits of their 64-bit hash, as a fraction of 2^52 (a float8
// holds them exactly). For one seed, distinct runs get independent,
// uniformly spread values; a new seed draws anew. IMMUTABLE, where
// random() is VOLATILE.
func jitter(id, seed string) string {
	return `((uuid_hash_extended(` + id + `, ` + seed + `) & 4503599627370495)::float8 / 4503599627370496.0)`
}

// SweepParams says which runs Sweep looks at: up to Limit of each kind on
// Queue, due or expired as of Now; Lease scales the crash backoff.
type SweepParams struct {
	Queue string
	Now   time.Time
	Lease time.Duration
	Limit int
}

// Sweep hands runs back for delivery; the caller enqueues a ticket in the
// same transaction for each whose Cause is not crash_backoff.
func Sweep(ctx context.Context, tx DBTX, p SweepParams) ([]SweptRun, error) {
	var out []SweptRun
	err := eachRoute(ctx, tx, func(tx DBTX) error {
		rows, err := sweep.query(ctx, tx, pgx.StrictNamedArgs{"limit": p.Limit, "queue": p.Queue, "now": p.Now, "lease_ms": ms(p.Lease),
			"seed": rand.Int64()})
		if err != nil {
			return fmt.Errorf("sweeping runs: %w", err)
		}
		swept, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SweptRun, error) {
			var s SweptRun
			err := r.Scan(&s.RunID, &s.Cause, &s.WakeAt, &s.Stalled)
			return s, err
		})
		out = append(out, swept...)
		return err
	})
	return out, err
}

// An orphaned ticket is one River fetched (it is running) whose process
// died before claiming the run: the run has no lease, so the lease sweep
// cannot see it. Given the run IDs of tickets running for longer than
// olderThan, this re-enqueues those runs that are still unclaimed and whose
// latest ticket is older than that, and stamps enqueued_at so a run is
// re-enqueued at most once per olderThan.
const reenqueueOrphans = `
UPDATE pgdurable.workflow_runs SET enqueued_at = now()
WHERE run_id = ANY($1) AND owner_token IS NULL
  AND status IN ('pending', 'running', 'compensating') AND wake_at IS NULL
  AND enqueued_at < now() - $2::bigint * interval '1 millisecond'
RETURNING run_id`

// An unowned run is one no delivery holds (owner_token NULL) that is not
// finished or waiting: a claim lost in a PostgreSQL crash leaves one behind
// (the claim commits asynchronously, see claimRun).
const reenqueueUnowned = `
UPDATE pgdurable.workflow_runs SET enqueued_at = now()
WHERE run_id = $1 AND owner_token IS NULL AND status IN ('pending', 'running', 'compensating') AND wake_at IS NULL
RETURNING run_id`

// ReenqueueUnowned marks runID for a new ticket if no delivery holds it and
// it is not finished or waiting; true when the caller must enqueue one (in
// the same transaction).
func ReenqueueUnowned(ctx context.Context, tx DBTX, runID uuid.UUID) (bool, error) {
	tx = at(tx, runID)
	tag, err := tx.Exec(ctx, reenqueueUnowned, runID)
	if err != nil {
		return false, fmt.Errorf("re-enqueueing run %s: %w", runID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReenqueueOrphans marks which of runIDs need a new ticket; the caller
// enqueues them in the same transaction.
func ReenqueueOrphans(ctx context.Context, tx DBTX, runIDs []uuid.UUID, olderThan time.Duration) ([]uuid.UUID, error) {
	return idsByRoute(runIDs, tx, func(tx DBTX, runIDs []uuid.UUID) ([]uuid.UUID, error) {
		return reenqueue(ctx, tx, runIDs, olderThan)
	})
}

func reenqueue(ctx context.Context, tx DBTX, runIDs []uuid.UUID, olderThan time.Duration) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, reenqueueOrphans, runIDs, ms(olderThan))
	if err != nil {
		return nil, fmt.Errorf("re-enqueueing orphaned runs: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// releaseHeld ends the hold on runs a stopping process held (see
// NewRun.Hold) and has not claimed.
const releaseHeld = `
UPDATE pgdurable.workflow_runs SET held_until = NULL, enqueued_at = now()
WHERE run_id = ANY($1) AND held_until IS NOT NULL
RETURNING run_id`

// ReleaseHeld ends the hold on those of runIDs still held and returns
// them; the caller enqueues their River jobs in the same transaction.
func ReleaseHeld(ctx context.Context, tx DBTX, runIDs []uuid.UUID) ([]uuid.UUID, error) {
	return idsByRoute(runIDs, tx, func(tx DBTX, runIDs []uuid.UUID) ([]uuid.UUID, error) {
		return releaseHeldRuns(ctx, tx, runIDs)
	})
}

func releaseHeldRuns(ctx context.Context, tx DBTX, runIDs []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, releaseHeld, runIDs)
	if err != nil {
		return nil, fmt.Errorf("releasing held runs: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// startNow wakes a delayed run that no delivery has picked up yet: one
// waiting, never started, and not waiting for a signal.
const startNow = `
WITH target AS (
    SELECT run_id, status, started_at IS NULL AND await_signal IS NULL AS delayed
    FROM pgdurable.workflow_runs WHERE run_id = $1 FOR UPDATE
), woken AS (
    UPDATE pgdurable.workflow_runs r SET status = 'pending', wake_at = NULL, enqueued_at = now()
    FROM target
    WHERE r.run_id = target.run_id AND target.status = 'waiting' AND target.delayed
    RETURNING r.run_id
)
SELECT status, (SELECT count(*) FROM woken) > 0 FROM target`

// StartNowResult is what StartNow found and did: the run's status, and
// whether it woke it.
type StartNowResult struct {
	Status string
	Woken  bool
}

// StartNow makes a delayed run (inserted with NewRun.StartAt, not yet
// due) due now and pending; Woken false leaves it as it was, with Status
// saying why (another status, or waiting after it started: a timer or a
// signal). The caller enqueues its delivery in the same transaction.
// ErrNotFound for no such run.
func StartNow(ctx context.Context, tx DBTX, runID uuid.UUID) (StartNowResult, error) {
	tx = at(tx, runID)
	var res StartNowResult
	err := tx.QueryRow(ctx, startNow, runID).Scan(&res.Status, &res.Woken)
	return res, translate(err)
}

// continueRun ends the run its fence holds as continued by run @next,
// notifying RunEndedChannel if it is watched.
var continueRun = named(`
WITH run AS (
    UPDATE pgdurable.workflow_runs SET status = 'continued', continued_run_id = @next, owner_token = NULL, lease_expires_at = NULL,
        completed_at = now(), wake_at = NULL, deadline_at = NULL, await_signal = NULL,
        stalled_deliveries = 0, long_stalled_deliveries = 0
    WHERE run_id = @run_id AND owner_token = @token AND cancel_requested_at IS NULL
    RETURNING run_id, watched AS notify
)
SELECT count(*), (SELECT cancel_requested_at IS NOT NULL FROM pgdurable.workflow_runs WHERE run_id = @run_id AND owner_token = @token),
       coalesce(bool_or(notify), false)
FROM run`)

// ErrCancelRequested: the run's cancellation was requested; it cannot
// continue as new.
var ErrCancelRequested = errors.New("cancellation requested")

const moveSignals = `UPDATE pgdurable.workflow_signals SET run_id = $2 WHERE run_id = $1 AND consumed_seq IS NULL`

// ContinueRun, in tx, ends the run f fences as continued by next, a run
// the caller inserts next in the same transaction, then hands the signals
// over with MoveSignals. ErrLeaseLost when f no longer holds;
// ErrCancelRequested when the run's cancellation was requested (the run
// compensates instead: a cancellation accepted before the run ends wins).
func ContinueRun(ctx context.Context, tx DBTX, f Fence, next uuid.UUID) error {
	tx = at(tx, f.RunID)
	var n int
	var cancel *bool
	var notify bool
	if err := continueRun.queryRow(ctx, tx, pgx.StrictNamedArgs{"run_id": f.RunID, "token": f.Token, "next": next}).Scan(&n, &cancel, &notify); err != nil {
		return fmt.Errorf("continuing run %s: %w", f.RunID, translate(err))
	}
	switch {
	case n > 0 && notify:
		notifyEnded(ctx, tx, []uuid.UUID{f.RunID})
		return nil
	case n > 0:
		return nil
	case cancel != nil && *cancel:
		return ErrCancelRequested
	}
	return ErrLeaseLost
}

// MoveSignals hands the signals run from had not consumed to run to (a
// continued run's to the run that continues it), so none is lost between
// the two.
func MoveSignals(ctx context.Context, tx DBTX, from, to uuid.UUID) error {
	tx = at(tx, from) // a continued run and the run continuing it share their workflow ID's route
	if _, err := tx.Exec(ctx, moveSignals, from, to); err != nil {
		return fmt.Errorf("moving the signals of run %s to run %s: %w", from, to, translate(err))
	}
	return nil
}

// LatestRun returns the run that holds a workflow ID now: the latest of
// its chain of continued runs.
func LatestRun(ctx context.Context, db DBTX, workflowName, workflowID string) (uuid.UUID, error) {
	routes, err := Routes(ctx, db)
	if err != nil {
		return uuid.Nil, err
	}
	db = onRoute(db, workflowRoute(db, workflowName, workflowID, routes))
	var id uuid.UUID
	err = db.QueryRow(ctx, `SELECT run_id FROM pgdurable.workflow_runs WHERE workflow_name = $1 AND workflow_id = $2 AND status <> 'continued'`,
		workflowName, workflowID).Scan(&id)
	return id, translate(err)
}

const runParent = `SELECT parent_run_id, parent_seq, status, workflow_name FROM pgdurable.workflow_runs WHERE run_id = $1`

// terminateRun ends an active or dead run at once: no delivery may write
// it again (its owner token is cleared, so a delivery still running it
// finds its lease lost at its next write), its open dead job is resolved
// as discarded, and a watched run's end is notified.
var terminateRun = named(`
WITH run AS (
    UPDATE pgdurable.workflow_runs SET status = 'terminated', error = @error::jsonb, owner_token = NULL, lease_expires_at = NULL,
        completed_at = now(), wake_at = NULL, deadline_at = NULL, await_signal = NULL, held_until = NULL, ready_at = NULL
    WHERE run_id = @run_id AND status IN ('pending', 'running', 'waiting', 'compensating', 'dead')
    RETURNING run_id, watched AS notify
), job AS (
    UPDATE pgdurable.dead_jobs j SET resolved_at = now(), resolution = 'discarded', resolved_by = @resolved_by, note = @note
    FROM run WHERE j.run_id = run.run_id AND j.resolved_at IS NULL
)
SELECT count(*), coalesce(bool_or(notify), false) FROM run`)

// Terminated is what TerminateRun did.
type Terminated struct {
	Status   string // the run's status before (terminated when it already was)
	Workflow string
	Parent   *ParentRef // its parent, for a child (ClosePolicy not set)
	Ended    bool       // this call ended it
}

// TerminateParams says which run TerminateRun ends, with what error (JSON),
// and who (By) ends it, with what note: they resolve its open dead job.
type TerminateParams struct {
	RunID    uuid.UUID
	Error    []byte
	By, Note string
}

// TerminateRun, in tx, ends p.RunID as terminated with p.Error as its
// error (an open dead job is resolved as discarded by p.By, with p.Note),
// after locking its parent's row (ancestors first, see LockRun). A run
// already closed is left as it is (Status says how it ended). ErrNotFound
// when there is no such run.
func TerminateRun(ctx context.Context, tx DBTX, p TerminateParams) (Terminated, error) {
	runID := p.RunID
	root := tx
	tx = at(tx, runID)
	var t Terminated
	var parent *uuid.UUID
	var seq *int
	if err := tx.QueryRow(ctx, runParent, runID).Scan(&parent, &seq, &t.Status, &t.Workflow); err != nil {
		return t, translate(err)
	}
	if parent != nil && seq != nil {
		t.Parent = &ParentRef{RunID: *parent, Seq: *seq}
		if err := LockRun(ctx, root, *parent); err != nil {
			return t, err
		}
	}
	var n int
	var notify bool
	args := pgx.StrictNamedArgs{"run_id": runID, "error": string(p.Error), "resolved_by": p.By, "note": p.Note}
	if err := terminateRun.queryRow(ctx, tx, args).Scan(&n, &notify); err != nil {
		return t, fmt.Errorf("terminating run %s: %w", runID, translate(err))
	}
	if notify {
		notifyEnded(ctx, tx, []uuid.UUID{runID})
	}
	t.Ended = n > 0
	if !t.Ended {
		// It ended meanwhile (its row was locked by its end): say how.
		if err := tx.QueryRow(ctx, `SELECT status FROM pgdurable.workflow_runs WHERE run_id = $1`, runID).Scan(&t.Status); err != nil {
			return t, fmt.Errorf("reading run %s: %w", runID, translate(err))
		}
	}
	return t, nil
}

// insertSteps writes a run's steps as a recorded history holds them
// (engine.Replay), unfenced: the run is one no delivery has claimed yet.
var insertSteps = named(`INSERT INTO pgdurable.workflow_steps
    (run_id, seq, name, kind, status, attempts, request_id, output, error, next_attempt_at, started_at, completed_at,
     compensation, compensation_of, input_hash, patches)
SELECT @run_id, s.seq, s.name, s.kind, s.status, s.attempts, s.request_id, s.output::jsonb, s.error::jsonb, s.next_attempt_at,
       s.started_at, s.completed_at, s.compensation, s.compensation_of, s.input_hash, s.patches
FROM unnest(@seq::int[], @name::text[], @kind::text[], @status::text[], @attempts::int[], @request_id::uuid[],
            @output::text[], @error::text[], @next_attempt_at::timestamptz[], @started_at::timestamptz[], @completed_at::timestamptz[],
            @compensation::text[], @compensation_of::int[], @input_hash::bigint[], @patches::text[])
    AS s(seq, name, kind, status, attempts, request_id, output, error, next_attempt_at, started_at, completed_at,
         compensation, compensation_of, input_hash, patches)`)

// InsertSteps writes recs, the steps of run runID as a history recorded
// them, to a run no delivery has claimed (engine.Replay's scratch run).
func InsertSteps(ctx context.Context, db DBTX, runID uuid.UUID, recs []*StepRecord) error {
	db = at(db, runID)
	var c stepColumns // its run and token columns are not sent: the run is @run_id
	for _, r := range recs {
		c.add(Fence{RunID: runID}, r)
	}
	_, err := insertSteps.exec(ctx, db, pgx.StrictNamedArgs{"run_id": runID, "seq": c.seq, "name": c.name, "kind": c.kind,
		"status": c.status, "attempts": c.attempts, "request_id": c.requestID, "output": c.output, "error": c.errs,
		"next_attempt_at": c.next, "started_at": c.started, "completed_at": c.completed, "compensation": c.comp,
		"compensation_of": c.compOf, "input_hash": c.inputHash, "patches": c.patches})
	if err != nil {
		return fmt.Errorf("inserting the steps of run %s: %w", runID, err)
	}
	return nil
}
