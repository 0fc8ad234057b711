package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Flow control. A run of a flow-controlled queue is never claimed by a
// River ticket: a ticket for it makes it ready (MarkReady), and the
// queue's admission (LockQueue, Candidates, Admit, in one transaction that
// holds the queue's row lock) claims the ready runs that fit the queue's
// limits. Every limit is counted from the rows that hold a live lease
// when the lock is held, so nothing is released: a lease that expires
// frees its slot by itself.

// insertFlowRuns inserts runs of flow-controlled queues: ready now (pending,
// ready_at @now) unless delayed (waiting, like any delayed start, and
// made ready when a ticket wakes it). A run's fair-queuing tag follows its
// key's latest ready run, or its queue's virtual time (@vtime, see
// queueVTimes) when that is later (start-time fair queuing): a key with 10,000
// runs waiting has tags far ahead, so a key that starts one run now is
// admitted within about one round of the keys. Runs of one key in one
// statement take successive tags, in the statement's order: @acc is each
// run's sum of its key's steps up to it in the batch. ON CONFLICT has no
// target: a taken workflow ID and a taken deduplication ID both skip the
// row.
//
// Citus routes it to the node of the runs' shard: the queue's virtual
// time and the sums are parameters, not a join with the queues' table
// (which stays on the coordinator: Citus refuses "direct joins between
// distributed and local tables") or a window function, and the times are
// parameters, as insertRuns's are.
var insertFlowRunsStmt = named(insertFlowRunsSQL + `
FROM unnest(@run_id::uuid[], @workflow_name::text[], @workflow_version::int[], @workflow_id::text[], @input::text[],
            @queue::text[], @schedule_name::text[], @start_at::timestamptz[], @run_timeout_ms::bigint[],
            @parent_run_id::uuid[], @parent_seq::int[], @parent_close_policy::text[], @continued_from::uuid[],
            @tags::text[], @trace_context::text[], @flow_queue::text[], @flow_key::text[], @priority::int[],
            @vtime::float8[], @acc::float8[], @dedup_id::text[])
    AS u(` + flowRunColumns + `)
ON CONFLICT DO NOTHING
RETURNING run_id`)

// insertFlowRunStmt is insertFlowRunsStmt for one run, its values scalar
// parameters: PostgreSQL settles on a generic plan of it after a few
// calls, where it plans the arrays' statement anew on every call, since
// it estimates an array parameter's length from its value (0.3 ms of
// planning a start). Citus refuses a forced generic plan of an INSERT ...
// SELECT, so the one start that is most of them gets a statement of its
// own; on plain PostgreSQL, a batch forces one (see insertFlowBatch).
// Not on Citus: there a scalar start_at folds the CASE around the
// fair-tag subquery away, and Citus 13.2 then plans the INSERT ... SELECT
// pushed down to no shard at all ("Task Count: 0"): a delayed start
// inserted nothing and reported no error. The arrays' values are not
// constants to fold, and Citus plans every call anew either way.
var insertFlowRunStmt = named(insertFlowRunsSQL + `
FROM (VALUES (@run_id::uuid, @workflow_name::text, @workflow_version::int, @workflow_id::text, @input::text,
              @queue::text, @schedule_name::text, @start_at::timestamptz, @run_timeout_ms::bigint,
              @parent_run_id::uuid, @parent_seq::int, @parent_close_policy::text, @continued_from::uuid,
              @tags::text, @trace_context::text, @flow_queue::text, @flow_key::text, @priority::int,
              @vtime::float8, @acc::float8, @dedup_id::text))
    AS u(` + flowRunColumns + `)
ON CONFLICT DO NOTHING
RETURNING run_id`)

// flowRunColumns name insertFlowRunsSQL's source u's columns.
const flowRunColumns = `run_id, name, version, workflow_id, input, queue, schedule, start_at, timeout_ms, parent, parent_seq, policy,
         continued_from, tags, trace, flow_queue, flow_key, priority, vtime, acc, dedup_id`

// insertFlowRunsSQL is the insert of insertFlowRunsStmt and
// insertFlowRunStmt, but for its source u.
const insertFlowRunsSQL = `
INSERT INTO pgdurable.workflow_runs (run_id, workflow_name, workflow_version, workflow_id, input, queue, schedule_name,
                           status, wake_at, run_timeout_ms, parent_run_id, parent_seq, parent_close_policy, first_run_id,
                           tags, trace_context, flow_queue, flow_key, priority, fair_tag, ready_at, dedup_id,
                           enqueued_at, created_at)
SELECT u.run_id, u.name, u.version, u.workflow_id, u.input::jsonb, u.queue, u.schedule,
       CASE WHEN u.start_at IS NOT NULL THEN 'waiting' ELSE 'pending' END,
       u.start_at, nullif(u.timeout_ms, 0), u.parent, u.parent_seq, u.policy,
       (SELECT coalesce(p.first_run_id, p.run_id) FROM pgdurable.workflow_runs p WHERE p.run_id = u.continued_from),
       coalesce(u.tags::jsonb, (SELECT p.tags FROM pgdurable.workflow_runs p WHERE p.run_id = u.continued_from)),
       coalesce(u.trace::jsonb, (SELECT p.trace_context FROM pgdurable.workflow_runs p WHERE p.run_id = u.continued_from)),
       u.flow_queue, u.flow_key, u.priority,
       CASE WHEN u.start_at IS NULL
            THEN greatest(u.vtime, coalesce((SELECT max(r.fair_tag) FROM pgdurable.workflow_runs r
                                             WHERE r.flow_queue = u.flow_queue AND r.flow_key = u.flow_key
                                               AND r.ready_at IS NOT NULL), 0)) + u.acc END,
       CASE WHEN u.start_at IS NULL THEN @now::timestamptz END,
       u.dedup_id, @now::timestamptz, @now::timestamptz`

// dedupHolder finds the open run of a queue that holds a deduplication ID.
const dedupHolder = `
SELECT run_id, status, workflow_id FROM pgdurable.workflow_runs
WHERE flow_queue = $1 AND dedup_id = $2 AND status IN ('pending', 'running', 'waiting', 'compensating')`

// insertFlowRuns is InsertRuns for runs whose FlowQueue is set. A run not
// inserted is found as InsertRun finds it: by its workflow ID, else (its
// deduplication ID was taken) as the open run that holds its
// deduplication ID, Deduplicated. A holder that ended between the insert
// and the read frees the ID: the run is inserted again, up to 3 times.
func insertFlowRuns(ctx context.Context, db DBTX, runs []NewRun) ([]InsertedRunResult, error) {
	out := make([]InsertedRunResult, len(runs))
	todo := make([]int, len(runs))
	for i := range todo {
		todo[i] = i
	}
	for try := 0; len(todo) > 0; try++ {
		batch := make([]NewRun, len(todo))
		for j, i := range todo {
			batch[j] = runs[i]
		}
		inserted, err := insertFlowBatch(ctx, db, batch)
		if err != nil {
			return nil, err
		}
		var again []int
		for _, i := range todo {
			r := runs[i]
			if inserted[r.RunID] {
				out[i].Run = &InsertedRun{RunID: r.RunID, Status: r.insertedStatus()}
				continue
			}
			ins, err := existing(ctx, db, r)
			if !errors.Is(err, ErrNotFound) || r.DedupID == "" {
				out[i].Run, out[i].Err = ins, err
				continue
			}
			holder := &InsertedRun{Existing: true, Deduplicated: true}
			err = db.QueryRow(ctx, dedupHolder, r.FlowQueue, r.DedupID).Scan(&holder.RunID, &holder.Status, &holder.WorkflowID)
			switch {
			case err == nil:
				out[i].Run = holder
			case errors.Is(err, pgx.ErrNoRows) && try < 3:
				again = append(again, i)
			default:
				out[i].Err = fmt.Errorf("reading the run that holds deduplication ID %q: %w", r.DedupID, translate(err))
			}
		}
		todo = again
	}
	return out, nil
}

// insertFlowBatch runs insertFlowRunsStmt (insertFlowRunStmt for one
// run) and returns the IDs it inserted, with the virtual time of the runs'
// queues from queueVTimes (a queue no process defined yet has none: 0).
func insertFlowBatch(ctx context.Context, db DBTX, runs []NewRun) (map[uuid.UUID]bool, error) {
	n := len(runs)
	var (
		runID, parent, continued = make(uuidArray, n), make(uuidArray, n), make(uuidArray, n)
		name, workflowID, input  = make([]string, n), make([]string, n), make([]string, n)
		queue, flowQueue, key    = make([]string, n), make([]string, n), make([]string, n)
		schedule, policy         = make(pgtype.FlatArray[pgtype.Text], n), make(pgtype.FlatArray[pgtype.Text], n)
		tags, trace, dedup       = make(pgtype.FlatArray[pgtype.Text], n), make(pgtype.FlatArray[pgtype.Text], n), make(pgtype.FlatArray[pgtype.Text], n)
		version, priority        = make([]int32, n), make([]int32, n)
		parentSeq                = make(pgtype.FlatArray[pgtype.Int4], n)
		startAt                  = make(pgtype.FlatArray[pgtype.Timestamptz], n)
		timeout                  = make([]int64, n)
		vtime, acc               = make([]float64, n), make([]float64, n)
	)
	type queueKey struct{ queue, key string }
	sums := map[queueKey]float64{}
	for i, r := range runs {
		runID[i], name[i], version[i], workflowID[i] = uuidParam(r.RunID), r.WorkflowName, int32(r.WorkflowVersion), r.WorkflowID
		input[i], queue[i], schedule[i], startAt[i], timeout[i] = string(r.Input), r.Queue, textOrNull(r.ScheduleName), timeOrNull(r.StartAt), ms(r.RunTimeout)
		if p := r.Parent; p != nil {
			parent[i], parentSeq[i], policy[i] = uuidParam(p.RunID), int4OrNull(&p.Seq), textOrNull(&p.ClosePolicy)
		}
		continued[i], tags[i], trace[i] = uuidOrNull(r.ContinuedFrom), jsonParam(r.Tags), jsonParam(r.TraceContext)
		flowQueue[i], key[i], priority[i] = r.FlowQueue, r.FlowKey, int32(r.Priority)
		if r.StartAt == nil {
			k := queueKey{r.FlowQueue, r.FlowKey}
			sums[k] += cmp.Or(max(r.TagStep, 0), 1)
			acc[i] = sums[k]
		}
		if r.DedupID != "" {
			dedup[i] = pgtype.Text{String: r.DedupID, Valid: true}
		}
	}
	vtimes, err := queueVTimes(ctx, db, flowQueue)
	if err != nil {
		return nil, err
	}
	for i, q := range flowQueue {
		vtime[i] = vtimes[q]
	}
	for i, r := range runs {
		if r.tags != nil { // with routes: see flowTags
			vtime[i], acc[i] = max(vtime[i], r.tags.floor), r.tags.acc
		}
	}
	args := pgx.StrictNamedArgs{"run_id": runID, "workflow_name": name,
		"workflow_version": version, "workflow_id": workflowID, "input": input, "queue": queue, "schedule_name": schedule,
		"start_at": startAt, "run_timeout_ms": timeout, "parent_run_id": parent, "parent_seq": parentSeq,
		"parent_close_policy": policy, "continued_from": continued, "tags": tags, "trace_context": trace,
		"flow_queue": flowQueue, "flow_key": key, "priority": priority, "vtime": vtime, "acc": acc, "dedup_id": dedup}
	citus, err := onCitus(ctx, db)
	if err != nil {
		return nil, err
	}
	stmt := insertFlowRunsStmt
	if n == 1 && !citus {
		// Each array's one element is the scalar parameter.
		stmt = insertFlowRunStmt
		for k, v := range args {
			args[k] = reflect.ValueOf(v).Index(0).Interface()
		}
	}
	args["now"] = time.Now()
	if n == 1 || citus {
		rows, err := stmt.query(ctx, db, args)
		return insertedIDs(rows, err, n)
	}
	// A generic plan, in the same round trip (see insertFlowRunStmt):
	// planning the arrays' statement anew cost the payment row of engine
	// bench 13% of its rate. Citus refuses it ("could not create
	// distributed plan"), and plans a distributed statement on every call
	// anyway.
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`)
	stmt.queue(b, args)
	b.Queue(`RESET plan_cache_mode`)
	br := db.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("inserting %d runs: %w", n, translate(err))
	}
	rows, err := br.Query()
	inserted, err := insertedIDs(rows, err, n)
	if err != nil {
		return nil, err
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("inserting %d runs: %w", n, translate(err))
	}
	return inserted, br.Close()
}

// flowTag is a run's fair-queuing tag's floor (the highest tag of its
// key's ready runs in every route) and its key's accumulated share of its
// start's batch up to it (see flowTags).
type flowTag struct {
	floor, acc float64
}

// flowTags sets, with routes, each ready run's flowTag (NewRun.tags), in
// the order of runs, which is the starts' order: a key's runs are in
// several routes, and the insert, which takes the highest tag of the
// key's ready runs in its own route, would start each route's tags anew;
// the floor over every route, read before any of them is inserted, and
// the key's share accumulated over the whole batch give a key's runs tags
// in start order whatever route each is in (a tie, from starts that
// raced, goes to the older run ID: start order too). Runs inserted
// waiting (StartAt) take their tags when they become ready.
func flowTags(ctx context.Context, db DBTX, runs []NewRun) error {
	var queues, keys []string
	for _, r := range runs {
		if r.FlowQueue != "" && r.StartAt == nil {
			queues, keys = append(queues, r.FlowQueue), append(keys, r.FlowKey)
		}
	}
	if len(queues) == 0 {
		return nil
	}
	routes, err := Routes(ctx, db)
	if err != nil || routes == 1 {
		return err
	}
	type queueKey struct{ queue, key string }
	floors := map[queueKey]float64{}
	for k := range routes {
		rows, err := onRoute(db, k).Query(ctx, `
SELECT r.flow_queue, r.flow_key, max(r.fair_tag)
FROM pgdurable.workflow_runs r JOIN unnest($1::text[], $2::text[]) AS u(queue, key) ON r.flow_queue = u.queue AND r.flow_key = u.key
WHERE r.ready_at IS NOT NULL
GROUP BY r.flow_queue, r.flow_key`, queues, keys)
		if err != nil {
			return fmt.Errorf("reading the fair-queuing tags of route %d: %w", k, translate(err))
		}
		for rows.Next() {
			var qk queueKey
			var tag float64
			if err := rows.Scan(&qk.queue, &qk.key, &tag); err != nil {
				rows.Close()
				return fmt.Errorf("reading the fair-queuing tags of route %d: %w", k, err)
			}
			floors[qk] = max(floors[qk], tag)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("reading the fair-queuing tags of route %d: %w", k, translate(err))
		}
	}
	sums := map[queueKey]float64{}
	for i := range runs {
		r := &runs[i]
		if r.FlowQueue == "" || r.StartAt != nil {
			continue
		}
		k := queueKey{r.FlowQueue, r.FlowKey}
		sums[k] += cmp.Or(max(r.TagStep, 0), 1)
		r.tags = &flowTag{floor: floors[k], acc: sums[k]}
	}
	return nil
}

// vtimeFresh is how long a queue's virtual time, once seen, stands for
// the queue's own in a start's fair-queuing tag (see queueVTimes).
const vtimeFresh = time.Second

// queueVTimes is the virtual time of each queue of queues (repeats
// allowed; a queue without a row has none and is left out): as db's
// handle saw it within vtimeFresh (its process's own admissions of the
// queue note theirs), else as read now. Reading it for every start was a
// round trip more per start, which cost the payment row of engine bench
// a quarter of its rate; a virtual time up to vtimeFresh old gives a key
// with no ready run a tag at most that second's admissions ahead of
// where the queue stands, and changes nothing for a key with ready runs
// (their tags are later).
func queueVTimes(ctx context.Context, db DBTX, queues []string) (map[string]float64, error) {
	srv := serverOf(db)
	out := make(map[string]float64, 1)
	var stale []string
	now := time.Now()
	if srv != nil {
		srv.mu.Lock()
		for _, q := range queues {
			if seen, ok := srv.vtimes[q]; ok && now.Sub(seen.at) < vtimeFresh {
				out[q] = seen.v
			} else if !slices.Contains(stale, q) {
				stale = append(stale, q)
			}
		}
		srv.mu.Unlock()
		if len(stale) == 0 {
			return out, nil
		}
	} else {
		stale = queues
	}
	rows, err := db.Query(ctx, `SELECT name, vtime FROM pgdurable.queues WHERE name = ANY($1)`, stale)
	if err != nil {
		return nil, fmt.Errorf("reading the virtual time of queues: %w", translate(err))
	}
	read := map[string]float64{}
	for rows.Next() {
		var name string
		var v float64
		if err := rows.Scan(&name, &v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading the virtual time of queues: %w", err)
		}
		read[name] = v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the virtual time of queues: %w", err)
	}
	for q, v := range read {
		out[q] = v
		noteVTime(db, q, v, now)
	}
	return out, nil
}

// noteVTime notes v, queue's virtual time as of at, with db's handle,
// unless it has seen a later one.
func noteVTime(db DBTX, queue string, v float64, at time.Time) {
	srv := serverOf(db)
	if srv == nil {
		return
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.vtimes == nil {
		srv.vtimes = map[string]vtimeSeen{}
	}
	if seen, ok := srv.vtimes[queue]; ok && seen.v > v {
		v = seen.v
	}
	srv.vtimes[queue] = vtimeSeen{v: v, at: at}
}

// markReady makes a run of a flow-controlled queue ready, as a ticket for
// it would have claimed it: open, no live lease (an expired one is ended,
// as readyExpired does), not waiting for a later time. A run that has a
// fair-queuing tag (it ran before) keeps it, so a run that wakes goes
// ahead of the runs started after it; a delayed start, ready for the first
// time, takes one as insertFlowRunsStmt gives it, its queue's virtual
// time @vtime a parameter (see queueVTimes), as there.
var markReady = named(`
UPDATE pgdurable.workflow_runs r SET ready_at = @now, owner_token = NULL, lease_expires_at = NULL,
    fair_tag = coalesce(r.fair_tag,
        greatest(@vtime::float8,
                 coalesce((SELECT max(o.fair_tag) FROM pgdurable.workflow_runs o
                           WHERE o.flow_queue = r.flow_queue AND o.flow_key = r.flow_key AND o.ready_at IS NOT NULL), 0)) + 1)
WHERE r.run_id = @run_id AND r.flow_queue = @queue AND r.ready_at IS NULL
  AND r.status IN ('pending', 'running', 'waiting', 'compensating')
  AND (r.owner_token IS NULL OR r.lease_expires_at < @now)
  AND (r.wake_at IS NULL OR r.wake_at <= @now)
RETURNING r.flow_queue`)

// MarkReady makes runID, a run of the flow-controlled queue queue, ready
// for its queue's admission (see markReady) and returns the queue; ""
// when the run is not one to make ready (not of queue, ready already,
// leased, closed or not due).
func MarkReady(ctx context.Context, db DBTX, runID uuid.UUID, queue string, now time.Time) (string, error) {
	db = at(db, runID)
	vtimes, err := queueVTimes(ctx, db, []string{queue})
	if err != nil {
		return "", err
	}
	err = markReady.queryRow(ctx, db, pgx.StrictNamedArgs{"run_id": runID, "queue": queue, "vtime": vtimes[queue], "now": now}).Scan(&queue)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("making run %s ready: %w", runID, translate(err))
	}
	return queue, nil
}

// Rate is a rate limit: Limit per Period, Burst at once (0: 1).
type Rate struct {
	Limit  int
	Period time.Duration
	Burst  int
}

// QueueDef is a flow-controlled queue's definition (0: no limit).
type QueueDef struct {
	Name           string
	Concurrency    int
	KeyConcurrency int
	Rate, KeyRate  Rate
	PriorityAging  time.Duration
}

// DefineQueue writes q's definition, keeping the queue's pause and its
// admission state.
func DefineQueue(ctx context.Context, db DBTX, q QueueDef) error {
	_, err := db.Exec(ctx, `
INSERT INTO pgdurable.queues (name, concurrency, key_concurrency, rate_limit, rate_period_ms, rate_burst,
                              key_rate_limit, key_rate_period_ms, key_rate_burst, priority_aging_ms)
VALUES (@name, @concurrency, @key_concurrency, @rate_limit, @rate_period_ms, @rate_burst,
        @key_rate_limit, @key_rate_period_ms, @key_rate_burst, @priority_aging_ms)
ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, key_concurrency = excluded.key_concurrency,
    rate_limit = excluded.rate_limit, rate_period_ms = excluded.rate_period_ms, rate_burst = excluded.rate_burst,
    key_rate_limit = excluded.key_rate_limit, key_rate_period_ms = excluded.key_rate_period_ms,
    key_rate_burst = excluded.key_rate_burst, priority_aging_ms = excluded.priority_aging_ms, defined_at = excluded.defined_at`,
		pgx.StrictNamedArgs{"name": q.Name, "concurrency": q.Concurrency, "key_concurrency": q.KeyConcurrency,
			"rate_limit": q.Rate.Limit, "rate_period_ms": ms(q.Rate.Period), "rate_burst": q.Rate.Burst,
			"key_rate_limit": q.KeyRate.Limit, "key_rate_period_ms": ms(q.KeyRate.Period), "key_rate_burst": q.KeyRate.Burst,
			"priority_aging_ms": ms(q.PriorityAging)})
	if err != nil {
		return fmt.Errorf("defining queue %q: %w", q.Name, translate(err))
	}
	return nil
}

// EnsureQueue makes sure queue q.Name has a row, leaving the definition
// of one that has as it is (a process that serves the queue without
// defining it).
func EnsureQueue(ctx context.Context, db DBTX, q QueueDef) error {
	if _, err := db.Exec(ctx, `INSERT INTO pgdurable.queues (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, q.Name); err != nil {
		return fmt.Errorf("defining queue %q: %w", q.Name, translate(err))
	}
	return nil
}

// QueueState is a queue as its admission finds it with the queue's row
// locked: the definition, the pause, the admission state and the runs
// holding a live lease, in all and by key.
type QueueState struct {
	Def          QueueDef
	Paused       bool
	VTime        float64
	RateTAT      *time.Time
	Running      int
	RunningByKey map[string]int
}

// admissionSettings apply to the rest of an admission's transaction: its
// commit is asynchronous (see AdmitWrite), and its reads take the indexes
// whose order they ask for. Without statistics (a young database, or a
// backlog that grew since autovacuum last analyzed the table) PostgreSQL
// took the 10,000 ready runs of a queue for 5 and read them all through
// the index by age, then sorted them, for every admission: 9 ms each,
// where the index in admission order reads the first few rows.
const admissionSettings = `SELECT set_config('synchronous_commit', 'off', true), set_config('enable_sort', 'off', true),
       set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)`

const lockQueue = `
SELECT concurrency, key_concurrency, rate_limit, rate_period_ms, rate_burst, key_rate_limit, key_rate_period_ms,
       key_rate_burst, priority_aging_ms, paused_at IS NOT NULL, vtime, rate_tat
FROM pgdurable.queues WHERE name = $1 FOR UPDATE`

// readyExpired makes the queue's runs whose lease expired (their process
// died, or stalled past its lease) ready again, under the queue's lock,
// before the admission reads its candidates. The lease is ended too: the
// process that held it, if it still lives, finds it lost at its next
// write, so a ready run is never also a leased one. Each keeps its fair-queuing
// tag, so it goes ahead of the runs of its key started after it. Without
// this the slot its expiry frees went to the next run of its key, since
// the run itself became ready only when the lease sweep found it.
const readyExpired = `
UPDATE pgdurable.workflow_runs SET ready_at = $2, owner_token = NULL, lease_expires_at = NULL
WHERE flow_queue = $1 AND owner_token IS NOT NULL AND lease_expires_at < $2 AND ready_at IS NULL
  AND status IN ('pending', 'running', 'waiting', 'compensating')`

// anyExpired reads whether readyExpired has runs to make ready.
const anyExpired = `
SELECT EXISTS (SELECT 1 FROM pgdurable.workflow_runs
WHERE flow_queue = $1 AND owner_token IS NOT NULL AND lease_expires_at < $2 AND ready_at IS NULL
  AND status IN ('pending', 'running', 'waiting', 'compensating'))`

// runningByKey counts the runs of a queue that hold a live lease, by key.
const runningByKey = `
SELECT flow_key, count(*) FROM pgdurable.workflow_runs
WHERE flow_queue = $1 AND owner_token IS NOT NULL AND lease_expires_at >= $2
GROUP BY flow_key`

// VersionRange is a workflow's versions a process takes: Lo to Hi.
type VersionRange struct {
	Name   string
	Lo, Hi int
}

// Candidate is a ready run an admission may claim.
type Candidate struct {
	RunID    uuid.UUID
	Key      string
	Priority int
	Tag      float64
	ReadyAt  time.Time
	// Aged: it has waited the queue's priority aging while runs of a
	// higher priority went first.
	Aged bool
}

// ReadParams say what an admission of Queue reads as of Now: the ready
// runs of the workflow versions in Versions, at most Limit of each kind
// (aged, and in admission order).
type ReadParams struct {
	Queue    string
	Now      time.Time
	Versions []VersionRange
	Limit    int
}

// candidateFilter is what makes a ready run a candidate: of the versions
// given, and not of a key at its concurrency limit (counted, as in
// runningByKey, once the queue's row is locked).
const candidateFilter = `r.flow_queue = @queue AND r.ready_at IS NOT NULL
  AND r.status IN ('pending', 'running', 'waiting', 'compensating')
  AND r.flow_key NOT IN (SELECT s.flow_key FROM pgdurable.workflow_runs s
                         WHERE s.flow_queue = @queue AND s.owner_token IS NOT NULL AND s.lease_expires_at >= @now
                         GROUP BY s.flow_key
                         HAVING count(*) >= (SELECT nullif(q.key_concurrency, 0) FROM pgdurable.queues q WHERE q.name = @queue))
  AND EXISTS (SELECT 1 FROM unnest(@names::text[], @lo::int[], @hi::int[]) AS v(name, lo, hi)
              WHERE v.name = r.workflow_name AND r.workflow_version BETWEEN v.lo AND v.hi)`

var freshCandidates = named(`
SELECT r.run_id, r.flow_key, r.priority, r.fair_tag, r.ready_at, false FROM pgdurable.workflow_runs r
WHERE ` + candidateFilter + `
ORDER BY r.priority DESC, r.fair_tag, r.run_id
LIMIT @limit`)

// agedCandidates are the ready runs that waited the queue's priority
// aging with a priority below the highest ready, oldest first. When the
// ready runs share one priority (the usual case) the first condition,
// which PostgreSQL evaluates once, skips the scan: otherwise a backlog
// older than the aging would be read whole at every admission to find no
// run of a lower priority.
var agedCandidates = named(`
SELECT r.run_id, r.flow_key, r.priority, r.fair_tag, r.ready_at, true FROM pgdurable.workflow_runs r
WHERE (SELECT min(t.priority) FROM pgdurable.workflow_runs t WHERE t.flow_queue = @queue AND t.ready_at IS NOT NULL)
      < (SELECT max(t.priority) FROM pgdurable.workflow_runs t WHERE t.flow_queue = @queue AND t.ready_at IS NOT NULL)
  AND ` + candidateFilter + `
  AND r.ready_at < @now::timestamptz - (SELECT q.priority_aging_ms FROM pgdurable.queues q WHERE q.name = @queue) * interval '1 millisecond'
  AND (SELECT q.priority_aging_ms FROM pgdurable.queues q WHERE q.name = @queue) > 0
  AND r.priority < (SELECT max(t.priority) FROM pgdurable.workflow_runs t WHERE t.flow_queue = @queue AND t.ready_at IS NOT NULL)
ORDER BY r.ready_at, r.run_id
LIMIT @limit`)

// AdmitRead begins an admission of p.Queue on db, a connection out of a
// transaction, in one round trip: it begins the transaction, locks the
// queue's row (admissions of one queue take turns, so each counts what the
// one before it claimed), and reads the queue's state and its candidates:
// the aged ones first (oldest first), then the rest in admission order
// (priority, then fair-queuing tag); a run can be in both. The caller
// ends the transaction with AdmitWrite, or with a rollback. ErrNotFound:
// no process defined the queue.
func AdmitRead(ctx context.Context, db DBTX, p ReadParams) (*AdmitView, error) {
	n := len(p.Versions)
	names, lo, hi := make([]string, n), make([]int32, n), make([]int32, n)
	for i, v := range p.Versions {
		names[i], lo[i], hi[i] = v.Name, int32(v.Lo), int32(v.Hi)
	}
	args := pgx.StrictNamedArgs{"queue": p.Queue, "now": p.Now, "names": names, "lo": lo, "hi": hi, "limit": p.Limit}
	routes, err := Routes(ctx, db)
	if err != nil {
		return nil, err
	}
	// With routes, every route's reads go in this one round trip. On one
	// PostgreSQL each kind of candidate is read from every route in one
	// statement, under one snapshot: read route by route, a run started
	// after an earlier one of its key could be seen in its route while
	// the earlier one, in a route read before it committed, was not, and
	// be admitted first. On Citus no statement sees every node at one
	// instant (a UNION ALL over routes on several nodes would be planned
	// as subplans, each its own snapshot anyway), so each route's
	// candidates are their own statement, sent to its node in this same
	// round trip: the admission costs one round trip whatever the routes.
	together := 1
	citus := false
	if routes > 1 {
		together = routes
		if citus, err = onCitus(ctx, db); err != nil {
			return nil, err
		}
	}
	root := db.schema().root()
	var candStmts []string
	var candArgs []any
	switch {
	case routes > 1 && !citus:
		for _, st := range []*namedStmt{everyRoute(agedCandidates, root, routes), everyRoute(freshCandidates, root, routes)} {
			candStmts, candArgs = append(candStmts, st.sql), append(candArgs, st.bind(args))
		}
	default:
		for k := range together {
			for _, st := range []*namedStmt{routeStmt(agedCandidates, root, k), routeStmt(freshCandidates, root, k)} {
				candStmts, candArgs = append(candStmts, st.sql), append(candArgs, st.bind(args))
			}
		}
	}
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(admissionSettings)
	b.Queue(lockQueue, p.Queue)
	for k := range together {
		r, _ := root.Route(k)
		b.Queue(r.SQL(anyExpired), p.Queue, p.Now)
	}
	for k := range together {
		r, _ := root.Route(k)
		b.Queue(r.SQL(runningByKey), p.Queue, p.Now)
	}
	for i, q := range candStmts {
		b.Queue(q, candArgs[i])
	}
	br := db.SendBatch(ctx, b)
	defer br.Close()
	fail := func(what string, err error) (*AdmitView, error) {
		return nil, fmt.Errorf("%s of queue %q: %w", what, p.Queue, translate(err))
	}
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return fail("beginning the admission", err)
		}
	}
	s := &QueueState{Def: QueueDef{Name: p.Queue}, RunningByKey: map[string]int{}}
	var ratePeriod, keyRatePeriod, aging int64
	err = br.QueryRow().Scan(&s.Def.Concurrency, &s.Def.KeyConcurrency, &s.Def.Rate.Limit, &ratePeriod, &s.Def.Rate.Burst,
		&s.Def.KeyRate.Limit, &keyRatePeriod, &s.Def.KeyRate.Burst, &aging, &s.Paused, &s.VTime, &s.RateTAT)
	if err != nil {
		return fail("locking the row", err)
	}
	s.Def.Rate.Period, s.Def.KeyRate.Period = time.Duration(ratePeriod)*time.Millisecond, time.Duration(keyRatePeriod)*time.Millisecond
	s.Def.PriorityAging = time.Duration(aging) * time.Millisecond
	noteVTime(db, p.Queue, s.VTime, time.Now())
	var expired []int
	for k := range together {
		var found bool
		if err := br.QueryRow().Scan(&found); err != nil {
			return fail("reading the runs whose lease expired", err)
		}
		if found {
			expired = append(expired, k)
		}
	}
	// readRunning reads the runningByKey results of every route into s.
	readRunning := func(br pgx.BatchResults) error {
		s.RunningByKey, s.Running = map[string]int{}, 0
		for range together {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			for rows.Next() {
				var key string
				var n int
				if err := rows.Scan(&key, &n); err != nil {
					rows.Close()
					return err
				}
				s.RunningByKey[key] += n
				s.Running += n
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := readRunning(br); err != nil {
		return fail("counting the running runs", err)
	}
	readCands := func(br pgx.BatchResults) ([]Candidate, error) {
		var cands []Candidate
		for range candStmts {
			rows, err := br.Query()
			if err != nil {
				return nil, err
			}
			for rows.Next() {
				var c Candidate
				if err := rows.Scan(&c.RunID, &c.Key, &c.Priority, &c.Tag, &c.ReadyAt, &c.Aged); err != nil {
					rows.Close()
					return nil, err
				}
				cands = append(cands, c)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return nil, err
			}
		}
		return cands, nil
	}
	cands, err := readCands(br)
	if err != nil {
		return fail("reading the ready runs", err)
	}
	if err := br.Close(); err != nil {
		return fail("reading", err)
	}
	if len(expired) > 0 {
		// Rare (a process died or stalled): make those runs ready and read
		// the running runs and the candidates again, now with them. Read
		// first, the admission writes a route only when it claims there:
		// on Citus a write to every route's node would commit each
		// admission in two phases.
		//
		// Both are read again, after the update: on Citus the admission
		// before this one commits on the coordinator (releasing the
		// queue's lock) before its claims commit on the worker node, so
		// the first reads can see a run it claimed as still expired, not
		// running. The update waits for that claim's row and the reads
		// after it see it; running counts from before it with candidates
		// from after it would count the claimed run nowhere, and admit
		// the next run of its key beside it.
		b := &pgx.Batch{}
		for _, k := range expired {
			r, _ := root.Route(k)
			b.Queue(r.SQL(readyExpired), p.Queue, p.Now)
		}
		for k := range together {
			r, _ := root.Route(k)
			b.Queue(r.SQL(runningByKey), p.Queue, p.Now)
		}
		for i, q := range candStmts {
			b.Queue(q, candArgs[i])
		}
		err := sendBatch(ctx, db, b, func(br pgx.BatchResults) error {
			for range expired {
				if _, err := br.Exec(); err != nil {
					return err
				}
			}
			if err := readRunning(br); err != nil {
				return err
			}
			cands, err = readCands(br)
			return err
		})
		if err != nil {
			return fail("making the runs whose lease expired ready", err)
		}
	}
	if routes > 1 {
		cands = mergeCandidates(cands, p.Limit)
	}
	return &AdmitView{State: s, Candidates: cands}, nil
}

// routeStmts are routeStmt's and everyRoute's statements, by
// routeStmtKey.
var routeStmts sync.Map

// routeStmtKey is a statement made of stmt for root's installation: on
// route n, or over n routes when every.
type routeStmtKey struct {
	stmt  *namedStmt
	root  *Schema
	n     int
	every bool
}

// routeStmtOf is the statement k names, made by sql the first time.
func routeStmtOf(k routeStmtKey, sql func() string) *namedStmt {
	if v, ok := routeStmts.Load(k); ok {
		return v.(*namedStmt)
	}
	v, _ := routeStmts.LoadOrStore(k, named(sql()))
	return v.(*namedStmt)
}

// everyRoute is stmt, a SELECT, over every route of root's installation
// at once: its statement on each route, in parentheses, joined by UNION
// ALL, which PostgreSQL reads under one snapshot.
func everyRoute(stmt *namedStmt, root *Schema, routes int) *namedStmt {
	return routeStmtOf(routeStmtKey{stmt, root, routes, true}, func() string {
		parts := make([]string, routes)
		for i := range routes {
			parts[i] = "(" + routeStmt(stmt, root, i).source + ")"
		}
		return strings.Join(parts, "\nUNION ALL\n")
	})
}

// routeStmt is stmt on route k of root's installation, which may be sent
// in a batch of root's handle (its tables are named in full, so the
// handle leaves them as they are).
func routeStmt(stmt *namedStmt, root *Schema, k int) *namedStmt {
	return routeStmtOf(routeStmtKey{stmt, root, k, false}, func() string {
		r, _ := root.Route(k)
		return r.SQL(stmt.source)
	})
}

// mergeCandidates puts the candidates of several routes in AdmitRead's
// order, at most limit of each kind. Each route gave at most limit of
// each kind, its first: the first limit of all of them in order are
// among those.
func mergeCandidates(cands []Candidate, limit int) []Candidate {
	var aged, fresh []Candidate
	for _, c := range cands {
		if c.Aged {
			aged = append(aged, c)
		} else {
			fresh = append(fresh, c)
		}
	}
	slices.SortFunc(aged, func(a, b Candidate) int {
		return cmp.Or(a.ReadyAt.Compare(b.ReadyAt), bytes.Compare(a.RunID[:], b.RunID[:]))
	})
	slices.SortFunc(fresh, func(a, b Candidate) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), cmp.Compare(a.Tag, b.Tag), bytes.Compare(a.RunID[:], b.RunID[:]))
	})
	return append(aged[:min(len(aged), limit)], fresh[:min(len(fresh), limit)]...)
}

// AdmitView is what AdmitRead read: the queue's state and its candidates.
type AdmitView struct {
	State      *QueueState
	Candidates []Candidate
}

// KeyRates reads the rate-limit state (GCRA theoretical arrival times) of
// keys of queue, in an admission's transaction; a key without a row has
// none.
func KeyRates(ctx context.Context, tx DBTX, queue string, keys []string) (map[string]time.Time, error) {
	rows, err := tx.Query(ctx, `SELECT key, rate_tat FROM pgdurable.queue_keys WHERE queue = $1 AND key = ANY($2)`, queue, keys)
	if err != nil {
		return nil, fmt.Errorf("reading the key rates of queue %q: %w", queue, err)
	}
	out := make(map[string]time.Time, len(keys))
	for rows.Next() {
		var k string
		var t time.Time
		if err := rows.Scan(&k, &t); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading the key rates of queue %q: %w", queue, err)
		}
		out[k] = t
	}
	rows.Close()
	return out, rows.Err()
}

// Admission is what an admission writes: the runs it claims (each under
// its own token), the queue's new virtual time and rate state, and the
// new rate state of the keys it admitted (with a key rate limit).
type Admission struct {
	Queue   string
	Now     time.Time
	Claims  []Fence
	VTime   float64
	RateTAT *time.Time
	KeyTATs map[string]time.Time
}

// admitClaim is claimRuns for an admission: only ready runs of the queue,
// which stop being ready (tested as a join clause, as claimRuns does).
var admitClaim = named(strings.Replace(strings.Replace(claimRunsSQL,
	"    held_until = NULL,\n", "    held_until = NULL,\n    ready_at = NULL,\n", 1),
	"WHERE r.run_id = u.run_id\n", "WHERE r.run_id = u.run_id AND "+onlyWhen("r.flow_queue = @flow_queue AND r.ready_at IS NOT NULL")+"\n", 1))

// AdmitWrite ends the admission AdmitRead began on db, in one round trip:
// it claims a's runs and loads their steps, writes the queue's (and
// keys') admission state, and commits, asynchronously as a claim does (a
// claim that a PostgreSQL crash loses leaves the run ready, and its
// delivery's fenced writes fail). It returns the runs claimed; a run that
// stopped being claimable since AdmitRead read it (ended, say) is left
// out.
func AdmitWrite(ctx context.Context, db DBTX, a Admission) ([]*ClaimedRun, error) {
	b := &pgx.Batch{}
	b.Queue(`UPDATE pgdurable.queues SET vtime = greatest(vtime, $2), rate_tat = $3 WHERE name = $1`, a.Queue, a.VTime, a.RateTAT)
	if len(a.KeyTATs) > 0 {
		keys, tats := make([]string, 0, len(a.KeyTATs)), make([]time.Time, 0, len(a.KeyTATs))
		for k, t := range a.KeyTATs {
			keys, tats = append(keys, k), append(tats, t)
		}
		b.Queue(`INSERT INTO pgdurable.queue_keys (queue, key, rate_tat) SELECT $1, k, t FROM unnest($2::text[], $3::timestamptz[]) AS u(k, t)
ON CONFLICT (queue, key) DO UPDATE SET rate_tat = excluded.rate_tat`, a.Queue, keys, tats)
		// Rows whose time has passed say nothing: keep the table to the
		// keys limited now.
		b.Queue(`DELETE FROM pgdurable.queue_keys WHERE queue = $1 AND rate_tat < $2`, a.Queue, a.Now)
	}
	writes := b.Len()
	if len(a.Claims) == 0 {
		b.Queue(`COMMIT`)
		if err := execBatch(ctx, db, b, fmt.Sprintf("admitting runs of queue %q", a.Queue)); err != nil {
			return nil, err
		}
		noteVTime(db, a.Queue, a.VTime, time.Now())
		return nil, nil
	}
	// Runs of several routes: every route's claim in the admission's one
	// round trip, each to its route's tables.
	mixed := mixedRoutes(a.Claims)
	on := at(db, a.Claims[0].RunID)
	if mixed {
		on = db
	}
	res, err := claimWith(ctx, on, admitClaim, pgx.StrictNamedArgs{"flow_queue": a.Queue}, a.Claims, a.Now,
		claimBatch{before: b, skip: writes, commit: true, mixed: mixed})
	if err != nil {
		return nil, err
	}
	noteVTime(db, a.Queue, a.VTime, time.Now())
	var claimed []*ClaimedRun
	for _, r := range res {
		if r.Run != nil {
			claimed = append(claimed, r.Run)
		}
	}
	return claimed, nil
}

// mixedRoutes reports whether fences name runs of more than one route.
func mixedRoutes(fences []Fence) bool {
	for _, f := range fences[1:] {
		if RouteOfRun(f.RunID) != RouteOfRun(fences[0].RunID) {
			return true
		}
	}
	return false
}

// execBatch sends b and reads each statement's result.
func execBatch(ctx context.Context, db DBTX, b *pgx.Batch, what string) error {
	br := db.SendBatch(ctx, b)
	for range b.Len() {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return fmt.Errorf("%s: %w", what, translate(err))
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("%s: %w", what, translate(err))
	}
	return nil
}

// QueuePeek is what an idle admitter reads of its queue: whether it has a
// ready run, and whether it is paused.
type QueuePeek struct {
	Ready, Paused bool
}

// peekQueue reads PeekQueue's QueuePeek.
const peekQueue = `SELECT EXISTS (SELECT 1 FROM pgdurable.workflow_runs WHERE flow_queue = $1 AND ready_at IS NOT NULL),
       coalesce((SELECT paused_at IS NOT NULL FROM pgdurable.queues WHERE name = $1), false)`

// PeekQueue reads queue's QueuePeek, taking no lock.
func PeekQueue(ctx context.Context, db DBTX, queue string) (QueuePeek, error) {
	var p QueuePeek
	err := eachRoute(ctx, db, func(db DBTX) error {
		if p.Ready {
			return nil
		}
		var q QueuePeek
		if err := db.QueryRow(ctx, peekQueue, queue).Scan(&q.Ready, &q.Paused); err != nil {
			return fmt.Errorf("reading whether queue %q has ready runs: %w", queue, err)
		}
		p.Ready, p.Paused = q.Ready, q.Paused
		return nil
	})
	return p, err
}

// Pause is a queue's pause: who and why, for the record, as of Now.
type Pause struct {
	Queue, By, Reason string
	Now               time.Time
}

// PauseQueue pauses p.Queue and reports whether it was running; a paused
// queue keeps its first pause's record. ErrNotFound: no process defined
// the queue.
func PauseQueue(ctx context.Context, db DBTX, p Pause) (bool, error) {
	queue := p.Queue
	var was bool
	err := db.QueryRow(ctx, `UPDATE pgdurable.queues q SET paused_at = coalesce(q.paused_at, $2), paused_by = coalesce(q.paused_by, $3),
    pause_reason = coalesce(q.pause_reason, $4)
FROM (SELECT paused_at FROM pgdurable.queues WHERE name = $1 FOR UPDATE) old
WHERE q.name = $1 RETURNING old.paused_at IS NULL`, queue, p.Now, textOrEmpty(p.By), textOrEmpty(p.Reason)).Scan(&was)
	if err != nil {
		return false, fmt.Errorf("pausing queue %q: %w", queue, translate(err))
	}
	return was, nil
}

// ResumeQueue resumes queue and reports whether it was paused.
// ErrNotFound: no process defined the queue.
func ResumeQueue(ctx context.Context, db DBTX, queue string) (bool, error) {
	var was bool
	err := db.QueryRow(ctx, `UPDATE pgdurable.queues q SET paused_at = NULL, paused_by = NULL, pause_reason = NULL
FROM (SELECT paused_at FROM pgdurable.queues WHERE name = $1 FOR UPDATE) old
WHERE q.name = $1 RETURNING old.paused_at IS NOT NULL`, queue).Scan(&was)
	if err != nil {
		return false, fmt.Errorf("resuming queue %q: %w", queue, translate(err))
	}
	return was, nil
}

func textOrEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// QueueRow is a queue as ListQueues reads it: its definition and pause
// (Defined false for a queue that runs name but no process defined), its
// ready runs (how many, since when the oldest), the runs holding a live
// lease, and its rate state.
type QueueRow struct {
	Def              QueueDef
	Defined          bool
	PausedAt         *time.Time
	PausedBy, Reason *string
	Ready, Running   int
	OldestReady      *time.Time
	RateTAT          *time.Time
	DefinedAt        *time.Time
}

// listQueues reads ListQueues's rows.
const listQueues = `
WITH ready AS (
  SELECT flow_queue, count(*) AS n, min(ready_at) AS oldest FROM pgdurable.workflow_runs
  WHERE ready_at IS NOT NULL GROUP BY flow_queue
), running AS (
  SELECT flow_queue, count(*) AS n FROM pgdurable.workflow_runs
  WHERE flow_queue IS NOT NULL AND owner_token IS NOT NULL AND lease_expires_at >= $1 GROUP BY flow_queue
), names AS (
  SELECT name FROM pgdurable.queues UNION SELECT flow_queue FROM ready UNION SELECT flow_queue FROM running
)
SELECT n.name, q.name IS NOT NULL, coalesce(q.concurrency, 0), coalesce(q.key_concurrency, 0), coalesce(q.rate_limit, 0),
       coalesce(q.rate_period_ms, 0), coalesce(q.rate_burst, 0), coalesce(q.key_rate_limit, 0), coalesce(q.key_rate_period_ms, 0),
       coalesce(q.key_rate_burst, 0), coalesce(q.priority_aging_ms, 0), q.paused_at, q.paused_by, q.pause_reason,
       coalesce(r.n, 0), coalesce(u.n, 0), r.oldest, q.rate_tat, q.defined_at
FROM names n LEFT JOIN pgdurable.queues q ON q.name = n.name LEFT JOIN ready r ON r.flow_queue = n.name
LEFT JOIN running u ON u.flow_queue = n.name
ORDER BY n.name`

// ListQueues reads every queue that is defined or has open runs, by name.
// Counting a backlog reads its index: an operator's view, not a hot path.
func ListQueues(ctx context.Context, db DBTX, now time.Time) ([]QueueRow, error) {
	var out []QueueRow
	at := map[string]int{}
	err := eachRoute(ctx, db, func(db DBTX) error {
		part, err := listQueuesOn(ctx, db, now)
		for _, q := range part {
			i, seen := at[q.Def.Name]
			if !seen {
				at[q.Def.Name] = len(out)
				out = append(out, q)
				continue
			}
			m := &out[i]
			m.Ready, m.Running = m.Ready+q.Ready, m.Running+q.Running
			if q.OldestReady != nil && (m.OldestReady == nil || q.OldestReady.Before(*m.OldestReady)) {
				m.OldestReady = q.OldestReady
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b QueueRow) int { return cmp.Compare(a.Def.Name, b.Def.Name) })
	return out, nil
}

// listQueuesOn is ListQueues on one route.
func listQueuesOn(ctx context.Context, db DBTX, now time.Time) ([]QueueRow, error) {
	rows, err := db.Query(ctx, listQueues, now)
	if err != nil {
		return nil, fmt.Errorf("listing queues: %w", err)
	}
	defer rows.Close()
	var out []QueueRow
	for rows.Next() {
		var q QueueRow
		var ratePeriod, keyRatePeriod, aging int64
		if err := rows.Scan(&q.Def.Name, &q.Defined, &q.Def.Concurrency, &q.Def.KeyConcurrency, &q.Def.Rate.Limit, &ratePeriod,
			&q.Def.Rate.Burst, &q.Def.KeyRate.Limit, &keyRatePeriod, &q.Def.KeyRate.Burst, &aging, &q.PausedAt, &q.PausedBy,
			&q.Reason, &q.Ready, &q.Running, &q.OldestReady, &q.RateTAT, &q.DefinedAt); err != nil {
			return nil, fmt.Errorf("listing queues: %w", err)
		}
		q.Def.Rate.Period, q.Def.KeyRate.Period = time.Duration(ratePeriod)*time.Millisecond, time.Duration(keyRatePeriod)*time.Millisecond
		q.Def.PriorityAging = time.Duration(aging) * time.Millisecond
		out = append(out, q)
	}
	return out, rows.Err()
}

// KeyWait is what holds a ready run's key: its runs holding a live lease,
// and its rate state (nil for none).
type KeyWait struct {
	Running int
	RateTAT *time.Time
	// Ahead counts the queue's ready runs an admission takes before the
	// run (higher priority, or equal with an earlier tag).
	Ahead int
}

// MaxCountedAhead bounds KeyWait.Ahead: counting a backlog's runs reads
// them.
const MaxCountedAhead = 10_000

// ReadyRun names a ready run of a queue, with its key, as of Now.
type ReadyRun struct {
	Queue, Key string
	RunID      uuid.UUID
	Now        time.Time
}

// keyWait reads KeyWaitOf's KeyWait: its key's runs holding a live
// lease, its rate state and the ready runs ahead of it.
var keyWait = `
SELECT (SELECT count(*) FROM pgdurable.workflow_runs WHERE flow_queue = $1 AND flow_key = $2 AND owner_token IS NOT NULL AND lease_expires_at >= $4),
       (SELECT rate_tat FROM pgdurable.queue_keys WHERE queue = $1 AND key = $2),
       (SELECT count(*) FROM (SELECT 1 FROM pgdurable.workflow_runs o, pgdurable.workflow_runs r
        WHERE r.run_id = $3 AND o.flow_queue = $1 AND o.ready_at IS NOT NULL
          AND (o.priority > r.priority OR o.priority = r.priority AND (o.fair_tag, o.run_id) < (r.fair_tag, r.run_id))
        LIMIT ` + fmt.Sprint(MaxCountedAhead) + `) a)`

// keyWaitElsewhere is keyWait's counts in a route other than the run's,
// with the run's priority and tag given.
var keyWaitElsewhere = `
SELECT (SELECT count(*) FROM pgdurable.workflow_runs WHERE flow_queue = $1 AND flow_key = $2 AND owner_token IS NOT NULL AND lease_expires_at >= $3),
       (SELECT count(*) FROM (SELECT 1 FROM pgdurable.workflow_runs o
        WHERE o.flow_queue = $1 AND o.ready_at IS NOT NULL
          AND (o.priority > $4 OR o.priority = $4 AND (o.fair_tag, o.run_id) < ($5, $6))
        LIMIT ` + fmt.Sprint(MaxCountedAhead) + `) a)`

// KeyWaitOf reads what holds the ready run r.
func KeyWaitOf(ctx context.Context, db DBTX, r ReadyRun) (KeyWait, error) {
	queue, key, runID, now := r.Queue, r.Key, r.RunID, r.Now
	var w KeyWait
	err := at(db, runID).QueryRow(ctx, keyWait, queue, key, runID, now).Scan(&w.Running, &w.RateTAT, &w.Ahead)
	if err != nil {
		return w, fmt.Errorf("reading what holds run %s in queue %q: %w", runID, queue, translate(err))
	}
	routes, err := Routes(ctx, db)
	if err != nil || routes == 1 {
		return w, err
	}
	// The other routes' runs of the key, and their ready runs ahead of
	// the run's priority and tag.
	var priority *int
	var tag *float64
	if err := at(db, runID).QueryRow(ctx, `SELECT priority, fair_tag FROM pgdurable.workflow_runs WHERE run_id = $1`, runID).Scan(&priority, &tag); err != nil {
		return w, fmt.Errorf("reading run %s: %w", runID, translate(err))
	}
	own := RouteOfRun(runID)
	for k := range routes {
		if k == own {
			continue
		}
		var running, ahead int
		err := onRoute(db, k).QueryRow(ctx, keyWaitElsewhere, queue, key, now, priority, tag, runID).Scan(&running, &ahead)
		if err != nil {
			return w, fmt.Errorf("reading what holds run %s in queue %q: %w", runID, queue, translate(err))
		}
		w.Running, w.Ahead = w.Running+running, min(w.Ahead+ahead, MaxCountedAhead)
	}
	return w, nil
}

// DefineRateLimit writes the definition of the rate limit name, keeping
// its state.
func DefineRateLimit(ctx context.Context, db DBTX, name string, r Rate) error {
	_, err := db.Exec(ctx, `INSERT INTO pgdurable.rate_limits (name, rate_limit, period_ms, burst) VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE SET rate_limit = excluded.rate_limit, period_ms = excluded.period_ms, burst = excluded.burst, defined_at = excluded.defined_at`,
		name, r.Limit, ms(r.Period), max(r.Burst, 1))
	if err != nil {
		return fmt.Errorf("defining rate limit %q: %w", name, translate(err))
	}
	return nil
}

// takeRate takes one attempt's turn of a rate limit as of @now, in one
// statement under the row's lock: GCRA, where a schedule less than one
// interval behind goes on from where it stands. Unlike a queue's rate
// (see flow.CatchUp) it does not catch up further: a downstream API's
// limit is a ceiling, and an attempt that waited longer loses the time
// rather than bunch with the next. It returns whether the turn was taken, and when the next turn
// may go.
var takeRate = named(`
WITH cur AS (
  SELECT name, period_ms::float8 / rate_limit AS interval_ms, (burst - 1) * period_ms::float8 / rate_limit AS tolerance_ms, tat
  FROM pgdurable.rate_limits WHERE name = @name FOR UPDATE
), base AS (
  SELECT name, interval_ms, tolerance_ms,
         CASE WHEN tat > @now::timestamptz - interval_ms * interval '1 millisecond' THEN tat ELSE @now::timestamptz END AS at
  FROM cur
), upd AS (
  UPDATE pgdurable.rate_limits r SET tat = base.at + base.interval_ms * interval '1 millisecond'
  FROM base WHERE r.name = base.name AND base.at - base.tolerance_ms * interval '1 millisecond' <= @now::timestamptz
  RETURNING r.tat
)
SELECT EXISTS (SELECT 1 FROM upd), base.at - base.tolerance_ms * interval '1 millisecond' FROM base`)

// RateTurn is what TakeRate got: the turn, or when the next may go.
type RateTurn struct {
	Taken  bool
	NextAt time.Time
}

// TakeRate takes a turn of the rate limit name as of now (see takeRate),
// in a transaction of its own committed asynchronously: a turn that a
// PostgreSQL crash forgets lets one attempt more go, which the limit's
// users tolerate better than a wait on every attempt. ErrNotFound: no
// process defined the limit.
func TakeRate(ctx context.Context, db DBTX, name string, now time.Time) (RateTurn, error) {
	var t RateTurn
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	takeRate.queue(b, pgx.StrictNamedArgs{"name": name, "now": now})
	br := db.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return t, fmt.Errorf("taking a turn of rate limit %q: %w", name, translate(err))
	}
	if err := br.QueryRow().Scan(&t.Taken, &t.NextAt); err != nil {
		return t, fmt.Errorf("taking a turn of rate limit %q: %w", name, translate(err))
	}
	return t, br.Close()
}

// insertDebouncedStmt inserts a debounced start, or joins the run of its
// workflow and key that waits out its window (see NewRun.DebounceKey):
// the input is the latest start's, and the start time its window's end,
// bounded by the first start's maximum wait. A run made ready for its
// queue stops being ready: it is ready again when its new time comes.
var insertDebouncedStmt = named(`
INSERT INTO pgdurable.workflow_runs AS w (run_id, workflow_name, workflow_version, workflow_id, input, queue, schedule_name,
                           status, wake_at, run_timeout_ms, tags, trace_context, flow_queue, flow_key, priority,
                           debounce_key, debounce_until)
VALUES (@run_id, @workflow_name, @workflow_version, @workflow_id, @input::jsonb, @queue, @schedule_name,
        'waiting', @start_at::timestamptz, nullif(@run_timeout_ms::bigint, 0), @tags::jsonb, @trace_context::jsonb,
        @flow_queue, @flow_key, @priority, @debounce_key, @debounce_until::timestamptz)
ON CONFLICT (workflow_name, debounce_key) WHERE debounce_key IS NOT NULL AND status = 'waiting' AND started_at IS NULL
DO UPDATE SET input = excluded.input, wake_at = least(excluded.wake_at, coalesce(w.debounce_until, excluded.wake_at)),
    ready_at = NULL, flow_key = excluded.flow_key, priority = excluded.priority
RETURNING run_id, workflow_id`)

// insertDebounced inserts r, a debounced start (see insertDebouncedStmt).
func insertDebounced(ctx context.Context, db DBTX, r NewRun) (*InsertedRun, error) {
	var flowQueue, flowKey *string
	if r.FlowQueue != "" {
		flowQueue, flowKey = &r.FlowQueue, &r.FlowKey
	}
	out := &InsertedRun{Status: RunWaiting}
	err := insertDebouncedStmt.queryRow(ctx, db, pgx.StrictNamedArgs{"run_id": r.RunID, "workflow_name": r.WorkflowName,
		"workflow_version": r.WorkflowVersion, "workflow_id": r.WorkflowID, "input": r.Input, "queue": r.Queue,
		"schedule_name": r.ScheduleName, "start_at": r.StartAt, "run_timeout_ms": ms(r.RunTimeout), "tags": jsonParam(r.Tags),
		"trace_context": jsonParam(r.TraceContext), "flow_queue": flowQueue, "flow_key": flowKey, "priority": r.Priority,
		"debounce_key": r.DebounceKey, "debounce_until": r.DebounceUntil}).Scan(&out.RunID, &out.WorkflowID)
	if err != nil {
		return nil, fmt.Errorf("inserting a debounced run: %w", translate(err))
	}
	out.Debounced = out.RunID != r.RunID
	out.Existing = out.Debounced
	return out, nil
}
