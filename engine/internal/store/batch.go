package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Fence is the right of one delivery to write a run's records: the run,
// the owner token its claim set, and how long each fenced write extends the
// lease.
type Fence struct {
	RunID uuid.UUID
	Token uuid.UUID
	Lease time.Duration
	// Patches, when set, gives the change IDs (engine.Patched) to record
	// with the step record at a position, newline-separated (nil: none),
	// for records that carry none themselves (StepRecord.Patches): every
	// write of the delivery's records consults it, so no kind of record
	// can be written without them.
	Patches func(seq int) *string
}

// patchesOf is what r records as its patches under f.
func (f Fence) patchesOf(r *StepRecord) *string {
	if r.Patches != nil || f.Patches == nil {
		return r.Patches
	}
	return f.Patches(r.Seq)
}

// RecordWrite is one delivery's fenced write in a group commit: step
// records to upsert and, optionally, a new run status or the run's end.
type RecordWrite struct {
	Fence   Fence
	Records []*StepRecord
	// Status moves the run to this status ("" leaves it); with Finish set
	// it is the terminal status.
	Status string
	// Finish ends the run: the lease is released and Output (completed) or
	// Error (failed) is stored with the completion time.
	Finish bool
	Output []byte
	Error  []byte
	// KeepLease checks the fence under a share lock on the run row instead
	// of updating it: the write neither extends the lease nor resets the
	// run's stalled-delivery counts, and writes no new version of the run
	// row (which, with the run's indexes and its pruning, cost more than
	// the record itself). Ignored with Status or Finish. The lock makes a
	// concurrent claim wait for this write's commit, so the claim's step
	// load sees the record or the write is fenced out; never both missed.
	KeepLease bool
}

// WriteResult is what one write of a batch learned.
type WriteResult struct {
	// Landed: the fence held and the write is committed. False means
	// another delivery owns the run (ErrLeaseLost for this write alone).
	Landed bool
	// CancelRequested: the run's cancellation was requested.
	CancelRequested bool
}

// A batch of deliveries' writes (WriteRecords: the @w_ parameters, one
// array element per write; the @step_ ones, one per step record, tagged
// with its write's run) is one transaction of two statements (three when
// it has both fresh records and others) sent in one round trip: the
// fences (writeFences), then the records (batchRecords). A write that
// ends the run releases the lease and stores its outcome; any other
// extends the lease, or (@w_keep) only checks the fence under a share
// lock.
//
// The fences statement fails unless every write's fence held, so the
// records need no fence of their own: each run row they belong to is one
// this transaction locked, whose owner was the record's write. A batch
// that holds a zombie's write (a delivery whose lease passed on) so fails
// as a whole, and writeBatch reads which writes' tokens no longer own
// their runs and writes the others again, as one transaction. That is
// rare (a lease lost while its delivery ran) and costs that batch two
// more round trips. Each statement is one Citus routes to the node of the
// runs' shard.
//
// Measured on a single PostgreSQL (engine bench, 3-step row, alternating
// binaries): this form ran at the rate of the one it replaced, a single
// statement with the records' INSERTs in CTEs after the fences' UPDATE
// (which Citus splits into distributed subplans). Two forms that checked
// each record's fence again did not: the records first, joined to their
// runs' rows and locking them, then the fences (0.75); the fences first,
// then each record joined to its run's row where the write's owner token
// still held it (0.71).

// writeFences applies a batch's fences and returns the rows whose fence
// held, and whether each is a watched run that ended (for
// NotifyRunsEnded), then a row with a NULL run ID that fails the statement
// (division by zero, SQLSTATE 22012) unless all @writes writes held their
// fence. The leading comment names the statement within the first KiB
// that pg_stat_activity shows of a query. The @w_ arrays are read twice
// rather than from a CTE, which Citus would plan apart.
var writeFences = named(`
-- pgdurable: workflow_steps records of a batch of deliveries, their fences: the workflow_runs rows
WITH extended AS (
    UPDATE pgdurable.workflow_runs r SET
        status = coalesce(f.status, r.status),
        lease_expires_at = ` + plusMS(`now()`, `CASE WHEN f.finish THEN NULL ELSE f.lease_ms END`) + `,
        owner_token = CASE WHEN f.finish THEN NULL ELSE r.owner_token END,
        output = CASE WHEN f.finish THEN f.output::jsonb ELSE r.output END,
        error = CASE WHEN f.finish THEN f.error::jsonb ELSE r.error END,
        completed_at = ` + nowIfElse(`f.finish`, `r.completed_at`) + `,
        wake_at = CASE WHEN f.finish THEN NULL ELSE r.wake_at END,
        deadline_at = CASE WHEN f.finish THEN NULL ELSE r.deadline_at END,
        await_signal = CASE WHEN f.finish THEN NULL ELSE r.await_signal END,
        stalled_deliveries = 0, long_stalled_deliveries = 0
    FROM ` + fenceArrays + `
    WHERE r.run_id = f.run_id AND r.owner_token = f.token AND NOT f.keep
    RETURNING r.run_id, f.token, r.cancel_requested_at IS NOT NULL AS cancel, f.finish AND r.watched AS notify
), kept AS (
    SELECT r.run_id, f.token, r.cancel_requested_at IS NOT NULL AS cancel, false AS notify
    FROM pgdurable.workflow_runs r JOIN ` + fenceArrays + ` ON r.run_id = f.run_id AND r.owner_token = f.token
    WHERE f.keep
    FOR SHARE OF r
)
SELECT run_id, token, cancel, notify FROM extended
UNION ALL SELECT run_id, token, cancel, notify FROM kept
UNION ALL SELECT NULL, NULL, 1 / (count(*) = @writes::int)::int = 1, NULL
          FROM (SELECT run_id FROM extended UNION ALL SELECT run_id FROM kept) fenced`)

// fenceArrays unnests the @w_ parameters as f.
const fenceArrays = `unnest(@w_run_id::uuid[], @w_token::uuid[], @w_status::text[], @w_finish::bool[], @w_output::text[],
                  @w_error::text[], @w_lease_ms::bigint[], @w_keep::bool[])
        AS f(run_id, token, status, finish, output, error, lease_ms, keep)`

// batchRecords[fresh] writes the records of the @step_ arrays after
// writeFences, which failed unless every write's fence held and locked its
// run's row: fresh ones (StepRecord.Fresh) without ON CONFLICT, the others
// with stepConflict, each in its own statement when the batch has both.
// Neither checks a fence again. Each reads that its run exists (which the
// fences ensured), as Citus needs: it routes the statement to the node of
// the shard it names, and pulls an INSERT ... SELECT from parameters alone
// through the coordinator.
var batchRecords = map[bool]*namedStmt{true: named(batchRecordsSQL), false: named(batchRecordsSQL + stepConflict)}

var batchRecordsSQL = `
-- pgdurable: workflow_steps records of a batch of deliveries
INSERT INTO pgdurable.workflow_steps AS s (` + stepColumnList + `)
SELECT ` + strings.Replace(stepArrayValues, "r.run_id", "u.run_id", 1) + `
FROM ` + unnestSteps("@step_run_id::uuid[], ", "run_id, ") + `
WHERE EXISTS (SELECT FROM pgdurable.workflow_runs r WHERE r.run_id = u.run_id)`

// writeFence is writeFences for one write, with scalar parameters: its
// generic plan is as good as a custom one, so PostgreSQL stops planning
// it after a few calls, where the arrays of writeFences make it plan
// every call (it cannot know their length). A batch of one is what a
// delivery writes at low load, where its latency shows. It comes first,
// before the write's record (recordValues), and a fence that failed fails
// it (division by zero, SQLSTATE 22012), so that the record's INSERT,
// skipped with the rest of the round trip, needs no fence of its own:
// the row lock this statement took holds it.
var writeFence = named(`
-- pgdurable: workflow_steps record of one delivery, its fence first: the workflow_runs row
WITH extended AS (
    UPDATE pgdurable.workflow_runs r SET
        status = coalesce(@run_status::text, r.status),
        lease_expires_at = ` + plusMS(`now()`, `CASE WHEN @finish::bool THEN NULL ELSE @lease_ms::bigint END`) + `,
        owner_token = CASE WHEN @finish::bool THEN NULL ELSE r.owner_token END,
        output = CASE WHEN @finish::bool THEN @output::jsonb ELSE r.output END,
        error = CASE WHEN @finish::bool THEN @error::jsonb ELSE r.error END,
        completed_at = ` + nowIfElse(`@finish::bool`, `r.completed_at`) + `,
        wake_at = CASE WHEN @finish::bool THEN NULL ELSE r.wake_at END,
        deadline_at = CASE WHEN @finish::bool THEN NULL ELSE r.deadline_at END,
        await_signal = CASE WHEN @finish::bool THEN NULL ELSE r.await_signal END,
        stalled_deliveries = 0, long_stalled_deliveries = 0
    WHERE r.run_id = @run_id AND r.owner_token = @token AND NOT @keep::bool
    RETURNING r.cancel_requested_at IS NOT NULL AS cancel, @finish::bool AND r.watched AS notify
), kept AS (
    SELECT r.cancel_requested_at IS NOT NULL AS cancel, false AS notify
    FROM pgdurable.workflow_runs r WHERE r.run_id = @run_id AND r.owner_token = @token AND @keep::bool
    FOR SHARE
)
SELECT coalesce(bool_or(cancel), false), coalesce(bool_or(notify), false), 1 / count(*)::int
FROM (SELECT * FROM extended UNION ALL SELECT * FROM kept) run`)

// nowIf is now() where the boolean SQL cond holds, else NULL, written as
// Citus can route it in an UPDATE's SET (see plusMS): now() stays outside
// the CASE.
func nowIf(cond string) string { return plusMS(`now()`, `CASE WHEN `+cond+` THEN 0 END`) }

// keeps reports whether w leaves the run row as it is (see
// RecordWrite.KeepLease).
func (w *RecordWrite) keeps() bool { return w.KeepLease && w.Status == "" && !w.Finish }

func writeOne(ctx context.Context, db DBTX, w *RecordWrite) (WriteResult, []uuid.UUID, error) {
	var status *string
	if w.Status != "" {
		status = &w.Status
	}
	f := w.Fence
	b := &pgx.Batch{}
	writeFence.queue(b, pgx.StrictNamedArgs{"run_id": uuidParam(f.RunID), "token": uuidParam(f.Token),
		"lease_ms": ms(f.Lease), "run_status": status, "finish": w.Finish, "output": w.Output, "error": w.Error, "keep": w.keeps()})
	if len(w.Records) == 1 {
		rec := w.Records[0]
		recordValues(rec.Fresh).queue(b, stepArgs(pgx.StrictNamedArgs{"run_id": uuidParam(f.RunID)}, f, rec))
	}
	var res WriteResult
	var notify bool
	var guard int
	err := sendAtomic(ctx, db, b, func(br pgx.BatchResults) error {
		if err := br.QueryRow().Scan(&res.CancelRequested, &notify, &guard); err != nil {
			return err
		}
		if b.Len() > 1 {
			_, err := br.Exec()
			return err
		}
		return nil
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22012" {
		return WriteResult{}, nil, nil // fenced out
	}
	if err != nil {
		return WriteResult{}, nil, fmt.Errorf("recording steps of run %s: %w", f.RunID, translate(err))
	}
	res.Landed = true
	if notify {
		return res, []uuid.UUID{f.RunID}, nil
	}
	return res, nil, nil
}

// WriteRecords commits writes in one round trip and one transaction (a
// group commit: the writes of many deliveries share one WAL flush), each
// fenced on its own, and then notifies RunEndedChannel of the watched
// runs the writes ended. The result at i belongs to writes[i]. The error
// is the transaction's: it fails every write of the batch (the caller may
// retry them one by one to find the write PostgreSQL refused).
//
// A batch must not hold two writes with the same fence, nor two records
// with the same (run, seq): one delivery has one write in flight. In a
// transaction, pass one write: a write that is fenced out there (Landed
// false) leaves the transaction aborted, for the caller to roll back.
// The writes of runs of different routes (see Routes) commit route by
// route, each route's as above: an error may come after an earlier
// route's writes landed, so a caller with routes sends one route's
// writes per batch.
func WriteRecords(ctx context.Context, db DBTX, writes []*RecordWrite) ([]WriteResult, error) {
	return byRoute(writes, db, func(w *RecordWrite) uuid.UUID { return w.Fence.RunID }, func(db DBTX, writes []*RecordWrite) ([]WriteResult, error) {
		out, ended, err := writeBatch(ctx, db, writes)
		if err != nil {
			return nil, err
		}
		notifyEnded(ctx, db, ended)
		return out, nil
	})
}

func writeBatch(ctx context.Context, db DBTX, writes []*RecordWrite) ([]WriteResult, []uuid.UUID, error) {
	if len(writes) == 1 && len(writes[0].Records) <= 1 {
		res, ended, err := writeOne(ctx, db, writes[0])
		if err != nil {
			return nil, nil, err
		}
		return []WriteResult{res}, ended, nil
	}
	n := len(writes)
	var (
		runID, token    = make(uuidArray, n), make(uuidArray, n)
		status          = make(pgtype.FlatArray[pgtype.Text], n)
		finish, keep    = make([]bool, n), make([]bool, n)
		lease           = make([]int64, n)
		output, errText = make(pgtype.FlatArray[pgtype.Text], n), make(pgtype.FlatArray[pgtype.Text], n)
		recs            = map[bool]*stepColumns{} // by StepRecord.Fresh
	)
	for i, w := range inRunOrder(writes, func(w *RecordWrite) uuid.UUID { return w.Fence.RunID }) {
		runID[i], token[i], finish[i], lease[i] = uuidParam(w.Fence.RunID), uuidParam(w.Fence.Token), w.Finish, ms(w.Fence.Lease)
		keep[i] = w.keeps()
		if w.Status != "" {
			status[i] = pgtype.Text{String: w.Status, Valid: true}
		}
		output[i], errText[i] = jsonParam(w.Output), jsonParam(w.Error)
		for _, r := range w.Records {
			if recs[r.Fresh] == nil {
				recs[r.Fresh] = &stepColumns{}
			}
			recs[r.Fresh].add(w.Fence, r)
		}
	}
	type key struct{ run, token uuid.UUID }
	type result struct{ cancel, notify bool }
	landed := make(map[key]result, n)
	b := &pgx.Batch{}
	writeFences.queue(b, pgx.StrictNamedArgs{"w_run_id": runID, "w_token": token, "w_status": status, "w_finish": finish,
		"w_output": output, "w_error": errText, "w_lease_ms": lease, "w_keep": keep, "writes": n})
	for _, fresh := range []bool{true, false} {
		if r := recs[fresh]; r != nil {
			batchRecords[fresh].queue(b, r.batchArgs(pgx.StrictNamedArgs{}))
		}
	}
	err := sendAtomic(ctx, db, b, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var k struct{ run, token *uuid.UUID }
			var r struct{ cancel, notify *bool }
			if err := rows.Scan(&k.run, &k.token, &r.cancel, &r.notify); err != nil {
				rows.Close()
				return err
			}
			if k.run != nil { // not the guard's row
				landed[key{*k.run, *k.token}] = result{*r.cancel, *r.notify}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for range b.Len() - 1 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		return nil
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22012" {
		// A write was fenced out (writeFences): nothing of the batch
		// landed. The others go again, as one transaction still.
		return writeBatchWithout(ctx, db, writes)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("recording steps of %d runs: %w", n, translate(err))
	}
	out := make([]WriteResult, n)
	var ended []uuid.UUID
	for i, w := range writes {
		r, ok := landed[key{w.Fence.RunID, w.Fence.Token}]
		out[i] = WriteResult{Landed: ok, CancelRequested: r.cancel}
		if r.notify {
			ended = append(ended, w.Fence.RunID)
		}
	}
	return out, ended, nil
}

// writeBatchWithout writes writes, a batch whose fences statement failed
// because one of them was fenced out, without the ones whose run their
// token no longer owns (Landed false), in one transaction as writeBatch
// does: the batch's error stays the error of every write, none of which
// committed. A lease that passes on meanwhile fails the fences again and
// drops that write too.
func writeBatchWithout(ctx context.Context, db DBTX, writes []*RecordWrite) ([]WriteResult, []uuid.UUID, error) {
	out := make([]WriteResult, len(writes))
	if len(writes) == 1 {
		return out, nil, nil // fenced out
	}
	ids := make(uuidArray, len(writes))
	for i, w := range writes {
		ids[i] = uuidParam(w.Fence.RunID)
	}
	rows, _ := db.Query(ctx, `SELECT run_id, owner_token FROM pgdurable.workflow_runs WHERE run_id = ANY($1) AND owner_token IS NOT NULL`, ids)
	owned, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Fence, error) {
		var f Fence
		return f, r.Scan(&f.RunID, &f.Token)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("reading the fences of %d runs: %w", len(writes), translate(err))
	}
	owners := make(map[uuid.UUID]uuid.UUID, len(owned))
	for _, f := range owned {
		owners[f.RunID] = f.Token
	}
	var live []*RecordWrite
	var at []int
	for i, w := range writes {
		if owners[w.Fence.RunID] == w.Fence.Token {
			live, at = append(live, w), append(at, i)
		}
	}
	if len(live) == len(writes) {
		// Every token still owns its run, yet a fence failed: not a lease
		// that passed on, so not one to write around.
		return nil, nil, fmt.Errorf("recording steps of %d runs: a fence failed with every lease in place", len(writes))
	}
	if len(live) == 0 {
		return out, nil, nil
	}
	res, ended, err := writeBatch(ctx, db, live)
	if err != nil {
		return nil, nil, err
	}
	for j, i := range at {
		out[i] = res[j]
	}
	return out, ended, nil
}

// inRunOrder is items sorted by run ID (a copy). The batch statements lock
// run rows in the order of their arrays, and a process's write, heartbeat
// and claim batches run concurrently and may share runs (a delivery's
// record write and its heartbeat; a zombie's write and the run's new
// claim): in one order, two of them wait for each other instead of
// deadlocking (which PostgreSQL breaks only after deadlock_timeout, a
// second, by failing one).
func inRunOrder[T any](items []T, run func(T) uuid.UUID) []T {
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b T) int {
		x, y := run(a), run(b)
		return bytes.Compare(x[:], y[:])
	})
	return sorted
}

// stepColumns holds step records as the parallel arrays unnest reads.
type stepColumns struct {
	runID                        uuidArray
	seq, attempts                []int32
	name, kind, status           []string
	requestID                    uuidArray
	output, errs, comp           pgtype.FlatArray[pgtype.Text]
	compOf                       pgtype.FlatArray[pgtype.Int4]
	inputHash                    pgtype.FlatArray[pgtype.Int8]
	patches                      pgtype.FlatArray[pgtype.Text]
	next, firstFailed, completed pgtype.FlatArray[pgtype.Timestamptz]
	started                      []time.Time
	failed                       pgtype.FlatArray[pgtype.Text]
}

func (s *stepColumns) add(f Fence, r *StepRecord) {
	s.runID = append(s.runID, uuidParam(f.RunID))
	s.seq, s.attempts = append(s.seq, int32(r.Seq)), append(s.attempts, int32(r.Attempts))
	s.name, s.kind, s.status = append(s.name, r.Name), append(s.kind, r.Kind), append(s.status, r.Status)
	s.requestID = append(s.requestID, uuidOrNull(r.RequestID))
	s.output, s.errs, s.comp = append(s.output, jsonParam(r.Output)), append(s.errs, jsonParam(r.Error)), append(s.comp, textOrNull(r.Compensation))
	s.compOf = append(s.compOf, int4OrNull(r.CompensationOf))
	s.inputHash = append(s.inputHash, int8OrNull(r.InputHash))
	s.patches = append(s.patches, textOrNull(f.patchesOf(r)))
	s.next, s.firstFailed = append(s.next, timeOrNull(r.NextAttemptAt)), append(s.firstFailed, timeOrNull(r.FirstFailedAt))
	s.completed = append(s.completed, timeOrNull(r.CompletedAt))
	s.started = append(s.started, r.StartedAt)
	s.failed = append(s.failed, failedAttempt(r, time.Now()))
}

// args binds s to the @step_ array parameters of stepArrays, in args, and
// returns args.
func (s *stepColumns) args(args pgx.StrictNamedArgs) pgx.StrictNamedArgs {
	for k, v := range map[string]any{"step_seq": s.seq, "step_name": s.name, "step_kind": s.kind, "step_status": s.status,
		"step_attempts": s.attempts, "step_request_id": s.requestID, "step_output": s.output, "step_error": s.errs,
		"step_next_attempt_at": s.next, "step_first_failed_at": s.firstFailed, "step_started_at": s.started,
		"step_completed_at": s.completed, "step_compensation": s.comp, "step_compensation_of": s.compOf,
		"step_input_hash": s.inputHash, "step_patches": s.patches, "step_failed_attempts": s.failed} {
		args[k] = v
	}
	return args
}

// batchArgs is args with each record's run, for batchRecords, in args.
func (s *stepColumns) batchArgs(args pgx.StrictNamedArgs) pgx.StrictNamedArgs {
	args["step_run_id"] = s.runID
	return s.args(args)
}

// insertRuns inserts any number of runs in one statement (one array element
// per run), each unless a run with its workflow ID exists, already claimed
// where its token is set (see NewRun.Claim). Only the inserted rows come
// back. A run whose ID exists is skipped too (InsertRuns then finds it by
// its workflow ID); that guard also makes the statement one Citus routes
// to the node of the table's shard, where it pulls an INSERT ... SELECT
// FROM unnest alone through the coordinator (a multi-row VALUES, routed
// as well, made engine bench's 3-step row 15% slower).
//
// Its times are @now, the engine's clock, and every column whose default
// is now() is given: Citus evaluates a STABLE function of an INSERT ...
// SELECT on the coordinator and then writes the statement for the worker
// node again, and for a table of a distributed schema that rewrite is
// broken (Citus 13.2 adds a test of a distribution column the table does
// not have: "syntax error at or near NOT" on the worker node). So a batch
// start's first lease runs by the engine's clock, where every other lease
// runs by PostgreSQL's: a skew between the two makes that one lease
// longer or shorter by the skew, and never lets two deliveries write
// (their owner tokens fence them).
var insertRuns = named(`
INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_version, workflow_id, input, queue, schedule_name,
                           status, owner_token, lease_expires_at, deliveries, stalled_deliveries, started_at, held_until,
                           wake_at, run_timeout_ms, deadline_at, tags, trace_context, enqueued_at, created_at)
SELECT u.run_id, u.name, u.version, u.workflow_id, u.input::jsonb, u.queue, u.schedule,
       CASE WHEN u.token IS NOT NULL THEN 'running' WHEN u.start_at IS NOT NULL THEN 'waiting' ELSE 'pending' END, u.token,
       ` + plusMS(`@now::timestamptz`, `CASE WHEN u.token IS NOT NULL THEN u.lease_ms END`) + `,
       CASE WHEN u.token IS NULL THEN 0 ELSE 1 END, CASE WHEN u.token IS NULL THEN 0 ELSE 1 END,
       ` + plusMS(`@now::timestamptz`, `CASE WHEN u.token IS NOT NULL THEN 0 END`) + `,
       ` + plusMS(`@now::timestamptz`, `CASE WHEN u.hold_ms > 0 THEN u.hold_ms END`) + `,
       u.start_at, nullif(u.timeout_ms, 0), u.deadline, u.tags::jsonb, u.trace::jsonb, @now::timestamptz, @now::timestamptz
FROM unnest(@run_id::uuid[], @workflow_name::text[], @workflow_version::int[], @workflow_id::text[], @input::text[],
            @queue::text[], @schedule_name::text[], @token::uuid[], @lease_ms::bigint[], @hold_ms::bigint[],
            @start_at::timestamptz[], @run_timeout_ms::bigint[], @deadline_at::timestamptz[], @tags::text[],
            @trace_context::text[])
    AS u(run_id, name, version, workflow_id, input, queue, schedule, token, lease_ms, hold_ms, start_at, timeout_ms, deadline, tags, trace)
WHERE NOT EXISTS (SELECT FROM pgdurable.workflow_runs x WHERE x.run_id = u.run_id)
ON CONFLICT (workflow_name, workflow_id) WHERE status <> 'continued' DO NOTHING
RETURNING run_id`)

// InsertedRunResult is one run's outcome in InsertRuns: Run, or Err
// (ErrConflict with Run set, for a workflow ID taken with another input).
type InsertedRunResult struct {
	Run *InsertedRun
	Err error
}

// InsertRuns inserts runs in one statement and reports, at i, what
// InsertRun would have for runs[i]: a run with a workflow ID that exists
// (or appears earlier in runs) is looked up as InsertRun looks it up. The
// error is the statement's and fails every run (the caller may insert them
// one by one to find the run PostgreSQL refused).
func InsertRuns(ctx context.Context, db DBTX, runs []NewRun) ([]InsertedRunResult, error) {
	if len(runs) == 1 {
		// Scalar parameters plan once (see writeRecord).
		ins, err := InsertRun(ctx, db, runs[0])
		if err != nil && !errors.Is(err, ErrConflict) {
			return nil, err
		}
		return []InsertedRunResult{{Run: ins, Err: err}}, nil
	}
	// In start order: a key's fair-queuing tags follow it.
	if err := flowTags(ctx, db, runs); err != nil {
		return nil, err
	}
	// In key order, so that two batches that share workflow IDs take the
	// unique index's entries in the same order and cannot deadlock.
	order := make([]int, len(runs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(runs[a].WorkflowName, runs[b].WorkflowName), cmp.Compare(runs[a].WorkflowID, runs[b].WorkflowID))
	})
	sorted := make([]NewRun, len(runs))
	for i, j := range order {
		sorted[i] = runs[j]
	}
	res, err := byRoute(sorted, db, func(r NewRun) uuid.UUID { return r.RunID }, func(db DBTX, runs []NewRun) ([]InsertedRunResult, error) {
		return insertSplit(ctx, db, runs)
	})
	if err != nil {
		return nil, err
	}
	out := make([]InsertedRunResult, len(runs))
	for i, j := range order {
		out[j] = res[i]
	}
	return out, nil
}

// insertedIDs reads the run IDs an insert of n runs returned (rows and
// err are its query's).
func insertedIDs(rows pgx.Rows, err error, n int) (map[uuid.UUID]bool, error) {
	if err != nil {
		return nil, fmt.Errorf("inserting %d runs: %w", n, translate(err))
	}
	inserted := make(map[uuid.UUID]bool, n)
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("inserting %d runs: %w", n, err)
		}
		inserted[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inserting %d runs: %w", n, translate(err))
	}
	return inserted, nil
}

// insertSplit inserts the runs of flow-controlled queues with their own
// statement (insertFlowRuns) and the others with insertSorted; the result
// at i belongs to runs[i].
func insertSplit(ctx context.Context, db DBTX, runs []NewRun) ([]InsertedRunResult, error) {
	if slices.ContainsFunc(runs, func(r NewRun) bool { return r.DebounceKey != "" }) {
		// One by one: a debounced start may join a run another of them
		// inserts.
		out := make([]InsertedRunResult, len(runs))
		for i, r := range runs {
			ins, err := InsertRun(ctx, db, r)
			if err != nil && !errors.Is(err, ErrConflict) {
				return nil, err
			}
			out[i] = InsertedRunResult{Run: ins, Err: err}
		}
		return out, nil
	}
	flow := 0
	for _, r := range runs {
		if r.FlowQueue != "" {
			flow++
		}
	}
	switch flow {
	case 0:
		return insertSorted(ctx, db, runs)
	case len(runs):
		return insertFlowRuns(ctx, db, runs)
	}
	var plain, queued []NewRun
	for _, r := range runs {
		if r.FlowQueue != "" {
			queued = append(queued, r)
		} else {
			plain = append(plain, r)
		}
	}
	a, err := insertSorted(ctx, db, plain)
	if err != nil {
		return nil, err
	}
	b, err := insertFlowRuns(ctx, db, queued)
	if err != nil {
		return nil, err
	}
	out := make([]InsertedRunResult, 0, len(runs))
	for _, r := range runs {
		if r.FlowQueue != "" {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return out, nil
}

func insertSorted(ctx context.Context, db DBTX, runs []NewRun) ([]InsertedRunResult, error) {
	n := len(runs)
	var (
		runID, token     = make(uuidArray, n), make(uuidArray, n)
		name, workflowID = make([]string, n), make([]string, n)
		input, queue     = make([]string, n), make([]string, n)
		schedule         = make(pgtype.FlatArray[pgtype.Text], n)
		version          = make([]int32, n)
		lease, hold      = make([]int64, n), make([]int64, n)
		startAt          = make(pgtype.FlatArray[pgtype.Timestamptz], n)
		timeout          = make([]int64, n)
		deadline         = make(pgtype.FlatArray[pgtype.Timestamptz], n)
		tags             = make(pgtype.FlatArray[pgtype.Text], n)
		trace            = make(pgtype.FlatArray[pgtype.Text], n)
	)
	for i, r := range runs {
		runID[i], name[i], version[i], workflowID[i] = uuidParam(r.RunID), r.WorkflowName, int32(r.WorkflowVersion), r.WorkflowID
		input[i], queue[i], schedule[i] = string(r.Input), r.Queue, textOrNull(r.ScheduleName)
		if r.Claim != nil {
			token[i], lease[i] = uuidParam(r.Claim.Token), ms(r.Claim.Lease)
		}
		hold[i], startAt[i] = ms(r.Hold), timeOrNull(r.StartAt)
		timeout[i], deadline[i], tags[i], trace[i] = ms(r.RunTimeout), timeOrNull(r.Deadline), jsonParam(r.Tags), jsonParam(r.TraceContext)
	}
	rows, err := insertRuns.query(ctx, db, pgx.StrictNamedArgs{"run_id": runID, "workflow_name": name, "workflow_version": version,
		"workflow_id": workflowID, "input": input, "queue": queue, "schedule_name": schedule, "token": token, "lease_ms": lease,
		"hold_ms": hold, "start_at": startAt, "run_timeout_ms": timeout, "deadline_at": deadline, "tags": tags,
		"trace_context": trace, "now": time.Now()})
	inserted, err := insertedIDs(rows, err, n)
	if err != nil {
		return nil, err
	}
	out := make([]InsertedRunResult, n)
	for i, r := range runs {
		if inserted[r.RunID] {
			out[i].Run = &InsertedRun{RunID: r.RunID, Status: r.insertedStatus()}
			continue
		}
		out[i].Run, out[i].Err = existing(ctx, db, r)
	}
	return out, nil
}

// A claim takes the lease with a new owner token, counts the delivery
// before any workflow code runs (so a crash still counts), and is sent in one
// batch with the step load: one round trip, one transaction.
//
// The claim commits without waiting for the WAL flush
// (synchronous_commit = off for that transaction only): a worker that dies
// still leaves it committed, and only a PostgreSQL crash within the WAL
// writer's delay (200 ms by default) can lose it. A lost claim has no
// effect to undo: the run reverts to unclaimed, the worker's fenced writes
// fail, and the orphan sweep redelivers it. Every later write of the
// delivery is a synchronous commit that flushes the claim with it, since
// WAL is flushed in order. This saves one of the five fsync waits of a
// 3-step workflow.
//
// Any number of runs are claimed in one statement, each with its own token
// (@run_id, @token, @lease_ms: one element per run), as of @now.
//
// A run of a flow-controlled queue is claimed only by its queue's
// admission (admitClaim): a ticket's claim skips it. The test is written
// as a join clause (onlyWhen), never as a filter on r alone: as
// "AND r.flow_queue IS NULL" it made each claim a third slower (0.85
// against 0.59 ms for 9 runs, pg_stat_statements over engine bench) and
// the 3-step row 0.83x, with the same plan shape; as a join clause it
// costs nothing measurable.
var claimRuns = named(strings.Replace(claimRunsSQL, "WHERE r.run_id = u.run_id\n", "WHERE r.run_id = u.run_id AND "+onlyWhen("r.flow_queue IS NULL")+"\n", 1))

// onlyWhen is cond on the claimed row r made a join clause with u (no
// lease is negative: the disjunct is never true), so that PostgreSQL
// does not take it as a restriction of r (see claimRuns).
func onlyWhen(cond string) string { return "(" + cond + " OR u.lease_ms < 0)" }

// plusMS is the SQL of ts (a timestamptz expression) plus ms milliseconds
// (an integer expression), computed in UTC: timestamptz + interval is
// STABLE (a time zone's days vary in length), its UTC counterparts are
// IMMUTABLE, and the result is the same for an interval of milliseconds.
// Citus refuses, in an UPDATE's SET on a distributed table, a STABLE
// function or operator applied to a column (and any inside CASE or
// COALESCE), so per-row times are written with this.
func plusMS(ts, ms string) string {
	return "(((" + ts + ") AT TIME ZONE 'UTC') + (" + ms + ") * interval '1 millisecond') AT TIME ZONE 'UTC'"
}

// claimRunsSQL is the claim both claimRuns and admitClaim make.
//
// Its status test is written on an expression of the status (the status
// with an empty string appended), which no index matches: written on the
// column, it lets
// PostgreSQL read the runs through the open-status index and join the
// claimed IDs to each of them, a plan its statistics favour whenever open
// runs were few when the table was last analyzed. With a backlog (10,000
// runs waiting in a queue) that plan read every open run for every claim
// batch: 62 ms for a batch of 40 where the primary key takes 0.16 ms, and
// the queue rows of engine bench fell to 0.53-0.82 of the unlimited row
// once the bench analyzed its tables.
//
// Its times are written as Citus can route them (see plusMS): least()
// rather than coalesce() around now() (a run's first start is the earliest
// it will have), and the deadline's arithmetic immutable.
var claimRunsSQL = `
UPDATE pgdurable.workflow_runs r SET
    owner_token = u.token,
    lease_expires_at = ` + plusMS(`now()`, `u.lease_ms`) + `,
    status = CASE WHEN r.status = 'compensating' THEN r.status ELSE 'running' END,
    deliveries = r.deliveries + 1,
    stalled_deliveries = r.stalled_deliveries + 1,
    started_at = least(r.started_at, now()),
    wake_at = NULL,
    await_signal = NULL,
    held_until = NULL,
    deadline_at = coalesce(r.deadline_at, ` + plusMS(`@now::timestamptz`, `r.run_timeout_ms`) + `)
FROM unnest(@run_id::uuid[], @token::uuid[], @lease_ms::bigint[]) AS u(run_id, token, lease_ms)
WHERE r.run_id = u.run_id
  AND (r.status || '') IN ('pending', 'running', 'waiting', 'compensating')
  AND (r.owner_token IS NULL OR r.lease_expires_at < now())
  AND (r.wake_at IS NULL OR r.wake_at <= @now)
RETURNING r.run_id, u.token, r.workflow_name, r.workflow_version, r.workflow_id, r.input, r.deliveries,
          r.stalled_deliveries, r.long_stalled_deliveries, r.status, r.cancel_requested_at IS NOT NULL, r.deadline_at,
          r.parent_run_id, r.parent_seq, r.parent_close_policy, r.run_timeout_ms, r.trace_context, r.version_wait_since,
          coalesce(r.flow_queue, '')`

// claimSettings applies to the rest of the claim batch's implicit
// transaction: its commit is asynchronous (a claim that a PostgreSQL crash
// loses leaves no lease behind, and the delivery that held it fails its
// ticket, so River delivers the run again), and its statements, which
// look rows up by key, use the keys' indexes. Without
// statistics (a young database: autovacuum analyzes a table a minute or
// more after its first rows) PostgreSQL takes a step record's run_id as
// matching a two-hundredth of the table, so the step load of a batch of
// 50 claims matched a quarter of it and was planned as a sequential scan,
// which read every step record of every run for each claim batch as the
// table grew (97 scans of 384,000 rows in a bench of 3,000 runs).
const claimSettings = `SELECT set_config('synchronous_commit', 'off', true), set_config('enable_seqscan', 'off', true)`

const loadStepsOfRuns = `
SELECT run_id, seq, name, kind, status, attempts, request_id, output, error, next_attempt_at,
       first_failed_at, started_at, completed_at, compensation, compensation_of, input_hash, patches
FROM pgdurable.workflow_steps WHERE run_id = ANY($1) ORDER BY run_id, seq`

const claimMisses = `
SELECT run_id, status, owner_token IS NOT NULL AND lease_expires_at >= now(), wake_at, coalesce(flow_queue, '')
FROM pgdurable.workflow_runs WHERE run_id = ANY($1)`

// ClaimResult is one run's outcome in ClaimRuns: Run when claimed, else
// Miss says why not.
type ClaimResult struct {
	Run  *ClaimedRun
	Miss *ClaimMiss
}

// ClaimRuns is Claim for many deliveries at once: the claims and the step
// loads in one round trip and one transaction (committed asynchronously,
// as Claim's), and one more read for the runs not claimed. The result at i
// belongs to fences[i]. Two fences for one run in a batch (duplicate
// deliveries) claim it at most once: the other finds it leased.
func ClaimRuns(ctx context.Context, db DBTX, fences []Fence, now time.Time) ([]ClaimResult, error) {
	return byRoute(fences, db, func(f Fence) uuid.UUID { return f.RunID }, func(db DBTX, fences []Fence) ([]ClaimResult, error) {
		return claimWith(ctx, db, claimRuns, pgx.StrictNamedArgs{}, fences, now, claimBatch{settings: true, misses: true})
	})
}

// claimBatch says what else a claim's round trip holds: before, statements
// sent first (skip of them, whose results are read and dropped); the
// claim's transaction settings (claimSettings); a COMMIT after the step
// load; and whether the runs not claimed are read (ClaimResult.Miss).
type claimBatch struct {
	before           *pgx.Batch
	skip             int
	settings, commit bool
	misses           bool
	// mixed: the fences name runs of several routes, db is bound to the
	// installation's root, and each route's claim goes to its tables
	// (not with misses).
	mixed bool
}

// claimWith is ClaimRuns with stmt, a claimRunsSQL whose further
// parameters are in args, sent as cb says.
func claimWith(ctx context.Context, db DBTX, stmt *namedStmt, args pgx.StrictNamedArgs, fences []Fence, now time.Time, cb claimBatch) ([]ClaimResult, error) {
	n := len(fences)
	// One claim and one step load per route, in the same round trip; with
	// runs of one route (any claim but a mixed admission's), db is bound
	// to it and the statements are sent as they are.
	type group struct {
		claim *namedStmt
		steps string
		ids   uuidArray
		token uuidArray
		lease []int64
		args  pgx.StrictNamedArgs
	}
	var groups []*group
	ofRoute := map[int]*group{}
	for _, f := range inRunOrder(fences, func(f Fence) uuid.UUID { return f.RunID }) {
		k := 0
		if cb.mixed {
			k = RouteOfRun(f.RunID)
		}
		g := ofRoute[k]
		if g == nil {
			g = &group{claim: stmt, steps: loadStepsOfRuns, args: maps.Clone(args)}
			if cb.mixed {
				root := db.schema().root()
				r, _ := root.Route(k)
				g.claim, g.steps = routeStmt(stmt, root, k), r.SQL(loadStepsOfRuns)
			}
			ofRoute[k] = g
			groups = append(groups, g)
		}
		g.ids, g.token, g.lease = append(g.ids, uuidParam(f.RunID)), append(g.token, uuidParam(f.Token)), append(g.lease, ms(f.Lease))
	}
	b := cb.before
	if b == nil {
		b = &pgx.Batch{}
	}
	if cb.settings {
		b.Queue(claimSettings)
		cb.skip++
	}
	for _, g := range groups {
		g.args["run_id"], g.args["token"], g.args["lease_ms"], g.args["now"] = g.ids, g.token, g.lease, now
		g.claim.queue(b, g.args)
		b.Queue(g.steps, g.ids)
	}
	if cb.commit {
		b.Queue(`COMMIT`)
	}
	br := db.SendBatch(ctx, b)
	defer br.Close()
	fail := func(err error) ([]ClaimResult, error) {
		return nil, fmt.Errorf("claiming %d runs: %w", n, translate(err))
	}
	for range cb.skip {
		if _, err := br.Exec(); err != nil {
			return fail(err)
		}
	}
	type key struct{ run, token uuid.UUID }
	claimed := make(map[key]*ClaimedRun, n)
	byRun := make(map[uuid.UUID]*ClaimedRun, n)
	for range groups {
		rows, err := br.Query()
		if err != nil {
			return fail(err)
		}
		for rows.Next() {
			c := &ClaimedRun{}
			var token uuid.UUID
			var parent *uuid.UUID
			var parentSeq *int
			var policy *string
			var timeout *int64
			if err := rows.Scan(&c.RunID, &token, &c.WorkflowName, &c.WorkflowVersion, &c.WorkflowID, &c.Input, &c.Deliveries,
				&c.StalledDeliveries, &c.LongStalled, &c.Status, &c.CancelRequested, &c.Deadline, &parent, &parentSeq,
				&policy, &timeout, &c.TraceContext, &c.VersionWaitSince, &c.FlowQueue); err != nil {
				rows.Close()
				return fail(err)
			}
			if parent != nil && parentSeq != nil && policy != nil {
				c.Parent = &ParentRef{RunID: *parent, Seq: *parentSeq, ClosePolicy: *policy}
			}
			if timeout != nil {
				c.RunTimeout = time.Duration(*timeout) * time.Millisecond
			}
			claimed[key{c.RunID, token}] = c
			byRun[c.RunID] = c
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fail(err)
		}
		if rows, err = br.Query(); err != nil {
			return fail(err)
		}
		for rows.Next() {
			var runID uuid.UUID
			var s StepRecord
			if err := rows.Scan(&runID, &s.Seq, &s.Name, &s.Kind, &s.Status, &s.Attempts, &s.RequestID, &s.Output, &s.Error,
				&s.NextAttemptAt, &s.FirstFailedAt, &s.StartedAt, &s.CompletedAt, &s.Compensation, &s.CompensationOf, &s.InputHash, &s.Patches); err != nil {
				rows.Close()
				return fail(err)
			}
			if c := byRun[runID]; c != nil {
				c.Steps = append(c.Steps, s)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fail(err)
		}
	}
	if cb.commit {
		if _, err := br.Exec(); err != nil {
			return fail(err)
		}
	}
	if err := br.Close(); err != nil {
		return fail(err)
	}
	out := make([]ClaimResult, n)
	var missed []uuid.UUID
	for i, f := range fences {
		if c := claimed[key{f.RunID, f.Token}]; c != nil {
			out[i].Run = c
		} else {
			missed = append(missed, f.RunID)
		}
	}
	if len(missed) == 0 || !cb.misses {
		return out, nil
	}
	rows, err := db.Query(ctx, claimMisses, uuids(missed))
	if err != nil {
		return fail(err)
	}
	misses := make(map[uuid.UUID]*ClaimMiss, len(missed))
	for rows.Next() {
		var runID uuid.UUID
		m := &ClaimMiss{}
		if err := rows.Scan(&runID, &m.Status, &m.Leased, &m.WakeAt, &m.FlowQueue); err != nil {
			rows.Close()
			return fail(err)
		}
		misses[runID] = m
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	for i, f := range fences {
		if out[i].Run != nil {
			continue
		}
		if out[i].Miss = misses[f.RunID]; out[i].Miss == nil {
			out[i].Miss = &ClaimMiss{NotExists: true}
		}
	}
	return out, nil
}

// Beat is one delivery's heartbeat in a batch (see Heartbeat).
type Beat struct {
	Fence    Fence
	MarkLong bool
}

// BeatResult is what one heartbeat of a batch learned: Landed false means
// ErrLeaseLost for that delivery alone.
type BeatResult struct {
	Landed, CancelRequested, Marked bool
}

var heartbeats = `
UPDATE pgdurable.workflow_runs r SET lease_expires_at = ` + plusMS(`now()`, `u.lease_ms`) + `,
    long_stalled_deliveries = r.long_stalled_deliveries + CASE WHEN u.mark AND r.stalled_deliveries > 0 THEN 1 ELSE 0 END
FROM unnest($1::uuid[], $2::uuid[], $3::bigint[], $4::bool[]) AS u(run_id, token, lease_ms, mark)
WHERE r.run_id = u.run_id AND r.owner_token = u.token
RETURNING r.run_id, u.token, r.cancel_requested_at IS NOT NULL, u.mark AND r.stalled_deliveries > 0`

// Heartbeats is Heartbeat for many deliveries in one statement, each
// fenced on its own; the result at i belongs to beats[i].
func Heartbeats(ctx context.Context, db DBTX, beats []Beat) ([]BeatResult, error) {
	return byRoute(beats, db, func(b Beat) uuid.UUID { return b.Fence.RunID }, func(db DBTX, beats []Beat) ([]BeatResult, error) {
		return heartbeatsOn(ctx, db, beats)
	})
}

func heartbeatsOn(ctx context.Context, db DBTX, beats []Beat) ([]BeatResult, error) {
	if len(beats) == 1 {
		b := beats[0]
		res, err := Heartbeat(ctx, db, b.Fence, b.MarkLong)
		switch {
		case errors.Is(err, ErrLeaseLost):
			return []BeatResult{{}}, nil
		case err != nil:
			return nil, err
		}
		return []BeatResult{res}, nil
	}
	n := len(beats)
	ids, tokens, lease, mark := make(uuidArray, n), make(uuidArray, n), make([]int64, n), make([]bool, n)
	for i, b := range inRunOrder(beats, func(b Beat) uuid.UUID { return b.Fence.RunID }) {
		ids[i], tokens[i], lease[i], mark[i] = uuidParam(b.Fence.RunID), uuidParam(b.Fence.Token), ms(b.Fence.Lease), b.MarkLong
	}
	rows, err := db.Query(ctx, heartbeats, ids, tokens, lease, mark)
	if err != nil {
		return nil, fmt.Errorf("extending %d leases: %w", n, translate(err))
	}
	defer rows.Close()
	type key struct{ run, token uuid.UUID }
	got := make(map[key]BeatResult, n)
	for rows.Next() {
		var k key
		r := BeatResult{Landed: true}
		if err := rows.Scan(&k.run, &k.token, &r.CancelRequested, &r.Marked); err != nil {
			return nil, fmt.Errorf("extending %d leases: %w", n, err)
		}
		got[k] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("extending %d leases: %w", n, translate(err))
	}
	out := make([]BeatResult, n)
	for i, b := range beats {
		out[i] = got[key{b.Fence.RunID, b.Fence.Token}]
	}
	return out, nil
}
