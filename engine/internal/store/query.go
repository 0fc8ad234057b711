package store

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// RunRow is one row of workflow_runs.
type RunRow struct {
	RunID             uuid.UUID
	WorkflowName      string
	WorkflowVersion   int
	WorkflowID        string
	Status            string
	Input             []byte
	Output            []byte
	Error             []byte
	Deliveries        int
	Stalled           int
	OwnerToken        *uuid.UUID
	LeaseExpiresAt    *time.Time
	WakeAt            *time.Time
	AwaitSignal       *string
	ScheduleName      *string
	Queue             string
	CreatedAt         time.Time
	StartedAt         *time.Time
	CompletedAt       *time.Time
	CancelRequestedAt *time.Time
	RunTimeoutMS      *int64
	DeadlineAt        *time.Time
	ParentRunID       *uuid.UUID
	ParentSeq         *int
	ParentClosePolicy *string
	ContinuedRunID    *uuid.UUID
	FirstRunID        *uuid.UUID
	Tags              []byte // a JSON object of strings, nil for none
	VersionWaitSince  *time.Time
	FlowQueue         *string // the flow-controlled queue, nil for none
	FlowKey           *string
	Priority          int
	ReadyAt           *time.Time // ready for its queue's admission since
}

const runColumns = `run_id, workflow_name, workflow_version, workflow_id, status, input, output, error,
    deliveries, stalled_deliveries, owner_token, lease_expires_at, wake_at, await_signal, schedule_name, queue, created_at, started_at, completed_at,
    cancel_requested_at, run_timeout_ms, deadline_at, parent_run_id, parent_seq, parent_close_policy, continued_run_id, first_run_id, tags, version_wait_since,
    flow_queue, flow_key, priority, ready_at`

func scanRun(row pgx.Row) (*RunRow, error) {
	var r RunRow
	err := row.Scan(&r.RunID, &r.WorkflowName, &r.WorkflowVersion, &r.WorkflowID, &r.Status, &r.Input, &r.Output,
		&r.Error, &r.Deliveries, &r.Stalled, &r.OwnerToken, &r.LeaseExpiresAt, &r.WakeAt, &r.AwaitSignal, &r.ScheduleName, &r.Queue, &r.CreatedAt,
		&r.StartedAt, &r.CompletedAt, &r.CancelRequestedAt, &r.RunTimeoutMS, &r.DeadlineAt, &r.ParentRunID, &r.ParentSeq, &r.ParentClosePolicy, &r.ContinuedRunID, &r.FirstRunID, &r.Tags, &r.VersionWaitSince,
		&r.FlowQueue, &r.FlowKey, &r.Priority, &r.ReadyAt)
	if err != nil {
		return nil, translate(err)
	}
	return &r, nil
}

// Signal is one row of workflow_signals.
type Signal struct {
	ID          int64
	Name        string
	Payload     []byte
	CreatedAt   time.Time
	ConsumedSeq *int
	ConsumedAt  *time.Time
	Key         *string
}

// MaxListedChildren bounds the children GetRun lists.
const MaxListedChildren = 1000

// RunDetail is a run with its steps, its signals and its children (up
// to MaxListedChildren of them, by position; a continue-as-new chain once,
// at its latest run).
type RunDetail struct {
	Run      *RunRow
	Steps    []StepRecord
	Signals  []Signal
	Children []ChildRow
}

// RunParts trims what GetRun reads (the zero value reads everything).
type RunParts struct {
	StepsFrom  int  // only the steps at positions from it on
	NoSignals  bool // no signals
	NoPayloads bool // no run input, step outputs or signal payloads (NULL)
}

// GetRun reads a run, its steps, its signals and its children in one
// round trip; ErrNotFound when absent.
func GetRun(ctx context.Context, db DBTX, runID uuid.UUID) (*RunDetail, error) {
	return GetRunParts(ctx, db, runID, RunParts{})
}

// stepKindChild is the kind of the step that starts a child run (the
// engine's KindChild).
const stepKindChild = "child"

// runWithoutInput is the run's row with its input left out.
var runWithoutInput = strings.Replace(runColumns, " input,", " NULL::jsonb AS input,", 1)

// GetRunParts is GetRun, reading only the parts p asks for.
func GetRunParts(ctx context.Context, db DBTX, runID uuid.UUID, p RunParts) (*RunDetail, error) {
	routes, err := Routes(ctx, db)
	if err != nil {
		return nil, err
	}
	root := db
	db = at(db, runID)
	b := &pgx.Batch{}
	runCols, stepOutput, payload := runColumns, "output", "payload"
	if p.NoPayloads {
		runCols, stepOutput, payload = runWithoutInput, "NULL::jsonb", "NULL::jsonb"
	}
	b.Queue(`SELECT `+runCols+` FROM pgdurable.workflow_runs WHERE run_id = $1`, runID)
	b.Queue(`SELECT seq, name, kind, status, attempts, request_id, `+stepOutput+`, error, next_attempt_at,
       first_failed_at, started_at, completed_at, compensation, compensation_of, input_hash, failed_attempts, patches
FROM pgdurable.workflow_steps WHERE run_id = $1 AND seq >= $2 ORDER BY seq`, runID, p.StepsFrom)
	if p.NoSignals {
		b.Queue(`SELECT id, name, payload, created_at, consumed_seq, consumed_at, idempotency_key FROM pgdurable.workflow_signals WHERE false`)
	} else {
		b.Queue(`SELECT id, name, `+payload+`, created_at, consumed_seq, consumed_at, idempotency_key FROM pgdurable.workflow_signals WHERE run_id = $1 ORDER BY id`, runID)
	}
	if routes == 1 {
		b.Queue(listChildren, runID, MaxListedChildren)
	}
	br := db.SendBatch(ctx, b)
	defer br.Close()
	run, err := scanRun(br.QueryRow())
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("loading steps of run %s: %w", runID, err)
	}
	steps, err := scanSteps(rows)
	if err != nil {
		return nil, fmt.Errorf("loading steps of run %s: %w", runID, err)
	}
	rows, err = br.Query()
	if err != nil {
		return nil, fmt.Errorf("loading signals of run %s: %w", runID, err)
	}
	signals, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Signal, error) {
		var s Signal
		err := r.Scan(&s.ID, &s.Name, &s.Payload, &s.CreatedAt, &s.ConsumedSeq, &s.ConsumedAt, &s.Key)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("loading signals of run %s: %w", runID, err)
	}
	var children []ChildRow
	if routes == 1 {
		rows, err = br.Query()
		if err != nil {
			return nil, fmt.Errorf("listing the children of run %s: %w", runID, err)
		}
		if children, err = collectChildren(rows); err != nil {
			return nil, fmt.Errorf("listing the children of run %s: %w", runID, err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	if routes > 1 && (p.StepsFrom > 0 || slices.ContainsFunc(steps, func(s StepRecord) bool { return s.Kind == stepKindChild })) {
		// A child's rows are in its own workflow ID's route; a run
		// whose steps (all read) start none has none to look for.
		err := eachRoute(ctx, root, func(db DBTX) error {
			rows, err := db.Query(ctx, listChildren, runID, MaxListedChildren)
			if err != nil {
				return fmt.Errorf("listing the children of run %s: %w", runID, err)
			}
			part, err := collectChildren(rows)
			if err != nil {
				return fmt.Errorf("listing the children of run %s: %w", runID, err)
			}
			children = append(children, part...)
			return nil
		})
		if err != nil {
			return nil, err
		}
		slices.SortFunc(children, func(a, b ChildRow) int {
			return cmp.Or(cmp.Compare(a.Seq, b.Seq), bytes.Compare(a.RunID[:], b.RunID[:]))
		})
		children = children[:min(len(children), MaxListedChildren)]
	}
	return &RunDetail{Run: run, Steps: steps, Signals: signals, Children: children}, nil
}

// RunFilter selects runs for ListRuns; zero fields match all.
type RunFilter struct {
	Workflow         string
	Status           string
	WorkflowIDPrefix string     // runs whose workflow ID starts with it
	Before           *uuid.UUID // keyset cursor: run IDs older than this (UUID v7 order)
	Limit            int
	// Created and finished time ranges ([after, before); nil: open). The
	// creation range is a run ID range: run IDs are UUID v7, ordered by
	// creation time, so the primary key serves it.
	CreatedAfter, CreatedBefore   *time.Time
	FinishedAfter, FinishedBefore *time.Time
	// Tags, a JSON object (nil: no filter), keeps the runs whose tags
	// hold all of its pairs, through workflow_runs_tags_idx.
	Tags []byte
	// TopLevel keeps the runs without a parent (parent_run_id IS NULL).
	TopLevel bool
	// Patched keeps the runs that took this change (a step record whose
	// patches name it, or a marker row of kind patch so named, as written
	// before); Unpatched those that did not.
	// "": no filter.
	Patched, Unpatched string
	// Version keeps the runs of this workflow version (0: any).
	Version int
}

const listRuns = `SELECT ` + runColumns + ` FROM pgdurable.workflow_runs
WHERE (@workflow::text = '' OR workflow_name = @workflow)
  AND (@status::text = '' OR status = @status
       OR (@status = 'open' AND status IN ('pending', 'running', 'waiting', 'compensating', 'dead')))
  AND (@version::int = 0 OR workflow_version = @version)
  AND (@before::uuid IS NULL OR run_id < @before)
  AND (@workflow_id_prefix::text = '' OR starts_with(workflow_id, @workflow_id_prefix))
  AND (@created_from::uuid IS NULL OR run_id >= @created_from) AND (@created_to::uuid IS NULL OR run_id < @created_to)
  AND (@finished_after::timestamptz IS NULL OR completed_at >= @finished_after)
  AND (@finished_before::timestamptz IS NULL OR completed_at < @finished_before)
  AND (NOT @top_level::bool OR parent_run_id IS NULL)
  AND (@patched::text = '' OR EXISTS (SELECT 1 FROM pgdurable.workflow_steps s
       WHERE s.run_id = workflow_runs.run_id AND ((s.kind = 'patch' AND s.name = @patched)
         OR @patched = ANY (string_to_array(s.patches, E'\n')))))
  AND (@unpatched::text = '' OR NOT EXISTS (SELECT 1 FROM pgdurable.workflow_steps s
       WHERE s.run_id = workflow_runs.run_id AND ((s.kind = 'patch' AND s.name = @unpatched)
         OR @unpatched = ANY (string_to_array(s.patches, E'\n')))))
ORDER BY run_id DESC
LIMIT @limit`

var listRunsStmt = named(listRuns)

// listTaggedRuns is listRuns with a tag filter, as its own statement: a
// condition that is there or not ("@tags IS NULL OR ...") would keep a
// generic plan from the partial index.
var listTaggedRuns = named(strings.Replace(listRuns, "ORDER BY run_id DESC", "  AND tags IS NOT NULL AND tags @> @tags::jsonb\nORDER BY run_id DESC", 1))

func floorOrNull(t *time.Time) *uuid.UUID {
	if t == nil {
		return nil
	}
	id := uuidFloor(*t)
	return &id
}

// ListRuns returns runs newest first.
func ListRuns(ctx context.Context, db DBTX, f RunFilter) ([]*RunRow, error) {
	stmt, args := listRunsStmt, pgx.StrictNamedArgs{"workflow": f.Workflow, "status": f.Status, "before": f.Before,
		"limit": f.Limit, "workflow_id_prefix": f.WorkflowIDPrefix, "created_from": floorOrNull(f.CreatedAfter),
		"created_to": floorOrNull(f.CreatedBefore), "finished_after": f.FinishedAfter, "finished_before": f.FinishedBefore,
		"top_level": f.TopLevel, "patched": f.Patched, "unpatched": f.Unpatched, "version": f.Version}
	if f.Tags != nil {
		stmt, args["tags"] = listTaggedRuns, string(f.Tags)
	}
	return newestFirst(ctx, db, f.Limit, func(db DBTX) ([]*RunRow, error) {
		rows, err := stmt.query(ctx, db, args)
		if err != nil {
			return nil, fmt.Errorf("listing runs: %w", err)
		}
		defer rows.Close()
		var out []*RunRow
		for rows.Next() {
			r, err := scanRun(rows)
			if err != nil {
				return nil, fmt.Errorf("listing runs: %w", err)
			}
			out = append(out, r)
		}
		return out, rows.Err()
	}, func(r *RunRow) uuid.UUID { return r.RunID })
}

// Stats is the queue's state.
type Stats struct {
	Pending, Running, Waiting, OpenDeadJobs int64
	OldestPendingAge                        time.Duration
}

const stats = `
SELECT
    count(*) FILTER (WHERE status = 'pending'),
    count(*) FILTER (WHERE status IN ('running', 'compensating') AND wake_at IS NULL),
    count(*) FILTER (WHERE status = 'waiting' OR (status = 'compensating' AND wake_at IS NOT NULL)),
    coalesce(extract(epoch FROM now() - min(enqueued_at) FILTER (WHERE status = 'pending')), 0)::float8,
    (SELECT count(*) FROM pgdurable.dead_jobs WHERE resolved_at IS NULL)
FROM pgdurable.workflow_runs
WHERE queue = $1 AND status IN ('pending', 'running', 'waiting', 'compensating')`

// GetStats reads the queue's state.
func GetStats(ctx context.Context, db DBTX, queue string) (*Stats, error) {
	var s Stats
	var oldest float64
	err := eachRoute(ctx, db, func(db DBTX) error {
		var r Stats
		var old float64
		if err := db.QueryRow(ctx, stats, queue).Scan(&r.Pending, &r.Running, &r.Waiting, &old, &r.OpenDeadJobs); err != nil {
			return err
		}
		s.Pending, s.Running, s.Waiting, s.OpenDeadJobs = s.Pending+r.Pending, s.Running+r.Running, s.Waiting+r.Waiting, s.OpenDeadJobs+r.OpenDeadJobs
		oldest = max(oldest, old)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.OldestPendingAge = time.Duration(oldest * float64(time.Second))
	return &s, nil
}

// Activity is what the web UI's overview reads: open runs by status, and the runs
// started and finished lately.
type Activity struct {
	Open                    map[string]int64 // pending, running, waiting, compensating, dead
	Started1m, Started15m   int64
	Finished1m, Finished15m int64
}

// GetActivity counts open runs through workflow_runs_open_status_idx, and
// starts and ends among the runs created in the last hour through the
// primary key (UUID v7): a run that finished lately but was created
// earlier (a long sleep) is not counted, which bounds the work by an
// hour's starts.
func GetActivity(ctx context.Context, db DBTX, now time.Time) (*Activity, error) {
	var a Activity
	// The 15-minute window for starts; the hour for ends.
	from15, from1, fromHour := uuidFloor(now.Add(-15*time.Minute)), uuidFloor(now.Add(-time.Minute)), uuidFloor(now.Add(-time.Hour))
	a.Open = map[string]int64{}
	err := eachRoute(ctx, db, func(db DBTX) error {
		r, err := activityOn(ctx, db, from15, from1, fromHour)
		if err != nil {
			return err
		}
		for k, v := range r.Open {
			a.Open[k] += v
		}
		a.Started1m, a.Started15m, a.Finished1m, a.Finished15m = a.Started1m+r.Started1m, a.Started15m+r.Started15m,
			a.Finished1m+r.Finished1m, a.Finished15m+r.Finished15m
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &a, nil
}

// activityOn is GetActivity on one route.
func activityOn(ctx context.Context, db DBTX, from15, from1, fromHour uuid.UUID) (*Activity, error) {
	var a Activity
	var starts15, ends1, ends15 int64
	err := db.QueryRow(ctx, `
SELECT (SELECT coalesce(jsonb_object_agg(status, n), '{}') FROM (
            SELECT status, count(*) AS n FROM pgdurable.workflow_runs
            WHERE status IN ('pending', 'running', 'waiting', 'compensating', 'dead') GROUP BY status) o),
       count(*) FILTER (WHERE run_id >= $2),
       count(*) FILTER (WHERE run_id >= $1),
       count(*) FILTER (WHERE completed_at >= now() - interval '1 minute'),
       count(*) FILTER (WHERE completed_at >= now() - interval '15 minutes')
FROM pgdurable.workflow_runs WHERE run_id >= $3`, from15, from1, fromHour).Scan(&a.Open, &a.Started1m, &starts15, &ends1, &ends15)
	if err != nil {
		return nil, fmt.Errorf("reading activity: %w", translate(err))
	}
	a.Started15m, a.Finished1m, a.Finished15m = starts15, ends1, ends15
	return &a, nil
}

// HoldsRuns reports whether any route of db's installation holds a run.
func HoldsRuns(ctx context.Context, db DBTX) (bool, error) {
	var held bool
	err := eachRoute(ctx, db, func(db DBTX) error {
		if held {
			return nil
		}
		return db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pgdurable.workflow_runs)`).Scan(&held)
	})
	return held, err
}
