package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Finished runs a prune may delete: ended for good (dead runs only once
// every dead job of theirs is resolved, before the cutoff), not a child
// whose parent still runs or is dead (it may yet read the child's
// outcome), and not a continued run whose chain's latest run still runs
// or is dead (a retried start is matched against the chain's first run,
// and a Wait on an earlier run ID follows the chain). The run IDs are UUID v7, ordered by creation time, so the
// primary key finds the runs created before the cutoff without an index
// of its own; @floor is the smallest UUID v7 of the cutoff's millisecond,
// @cutoff the cutoff.
var prunable = `
    r.run_id < @floor AND r.completed_at < @cutoff
    AND r.status IN ` + terminalStatuses + `
    AND (r.status <> 'dead' OR NOT EXISTS (
         SELECT 1 FROM pgdurable.dead_jobs j WHERE j.run_id = r.run_id AND (j.resolved_at IS NULL OR j.resolved_at >= @cutoff)))
    AND (r.parent_run_id IS NULL OR NOT EXISTS (
         SELECT 1 FROM pgdurable.workflow_runs p WHERE p.run_id = r.parent_run_id
         AND p.status IN ('pending', 'running', 'waiting', 'compensating', 'dead')))
    AND (r.status <> 'continued' OR NOT EXISTS (
         SELECT 1 FROM pgdurable.workflow_runs h WHERE h.workflow_name = r.workflow_name AND h.workflow_id = r.workflow_id
         AND h.status IN ('pending', 'running', 'waiting', 'compensating', 'dead')))
    AND (@route::int < 0 OR CASE WHEN @cross::bool
                                 THEN r.parent_run_id IS NOT NULL AND ` + sqlRoute(`r.parent_run_id`) + ` <> @route
                                 ELSE r.parent_run_id IS NULL OR ` + sqlRoute(`r.parent_run_id`) + ` = @route END)
    AND (@ids::uuid[] IS NULL OR r.run_id = ANY (@ids))`

// With routes, a child's parent may be in another route, where the
// parent check above cannot look: a prune of route @route takes the
// children whose parent is in it (@cross false) as above, and those
// whose parent is elsewhere (@cross true) only by @ids, the ones whose
// parent the caller found closed (crossChildren). @route -1 is one route:
// every parent is at hand. @ids NULL: no such restriction.

// crossChildren lists the prunable children of route @route whose parent
// is in another route, with their parent.
var crossChildren = named(`SELECT r.run_id, r.parent_run_id FROM pgdurable.workflow_runs r WHERE ` + prunable + `
  AND (@after::uuid IS NULL OR r.run_id > @after)
ORDER BY r.run_id LIMIT @limit`)

// crossPage is how many children whose parent is in another route a prune
// reads at once, looking for those whose parent closed.
const crossPage = 500

// sqlRoute is the route of the SQL uuid id, as RunRoute reads it (0 for
// an ID that carries none): immutable, as Citus needs.
func sqlRoute(id string) string {
	return `(CASE WHEN get_byte(uuid_send(` + id + `), 6) >> 4 = 8 THEN get_byte(uuid_send(` + id + `), 15) ELSE 0 END)`
}

// pruneRuns deletes one batch: the runs are locked SKIP LOCKED, so a
// prune never waits for (or blocks) a worker or another prune, and their
// steps, signals and dead jobs go in the same statement.
var pruneRuns = named(`
WITH doomed AS (
    SELECT r.run_id FROM pgdurable.workflow_runs r
    WHERE ` + prunable + `
    ORDER BY r.run_id
    LIMIT @limit
    FOR UPDATE SKIP LOCKED
), steps AS (
    DELETE FROM pgdurable.workflow_steps s USING doomed WHERE s.run_id = doomed.run_id RETURNING 1
), signals AS (
    DELETE FROM pgdurable.workflow_signals s USING doomed WHERE s.run_id = doomed.run_id RETURNING 1
), jobs AS (
    DELETE FROM pgdurable.dead_jobs j USING doomed WHERE j.run_id = doomed.run_id RETURNING 1
), runs AS (
    DELETE FROM pgdurable.workflow_runs r USING doomed WHERE r.run_id = doomed.run_id RETURNING 1
)
SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM steps), (SELECT count(*) FROM signals), (SELECT count(*) FROM jobs)`)

var countPrunable = named(`
SELECT count(*),
       coalesce(sum((SELECT count(*) FROM pgdurable.workflow_steps s WHERE s.run_id = r.run_id)), 0),
       coalesce(sum((SELECT count(*) FROM pgdurable.workflow_signals s WHERE s.run_id = r.run_id)), 0),
       coalesce(sum((SELECT count(*) FROM pgdurable.dead_jobs j WHERE j.run_id = r.run_id)), 0)
FROM pgdurable.workflow_runs r WHERE ` + prunable)

const pruneFires = `
DELETE FROM pgdurable.schedule_fires f USING (
    SELECT schedule_name, fire_at FROM pgdurable.schedule_fires WHERE recorded_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED
) old WHERE f.schedule_name = old.schedule_name AND f.fire_at = old.fire_at`

// Pruned counts the rows one prune deleted (or, dry, would delete).
type Pruned struct {
	Runs, Steps, Signals, DeadJobs, ScheduleFires int64
}

// PruneBatch deletes up to limit finished runs that ended before cutoff,
// with their steps, signals and dead jobs, and up to limit schedule fires
// recorded before it.
func PruneBatch(ctx context.Context, db DBTX, cutoff time.Time, limit int) (Pruned, error) {
	var p Pruned
	err := prunePerRoute(ctx, db, cutoff, limit, func(db DBTX, args pgx.StrictNamedArgs) error {
		args["limit"] = limit
		var q Pruned
		if err := pruneRuns.queryRow(ctx, db, args).Scan(&q.Runs, &q.Steps, &q.Signals, &q.DeadJobs); err != nil {
			return fmt.Errorf("pruning runs: %w", translate(err))
		}
		p.Runs, p.Steps, p.Signals, p.DeadJobs = p.Runs+q.Runs, p.Steps+q.Steps, p.Signals+q.Signals, p.DeadJobs+q.DeadJobs
		return nil
	})
	if err != nil {
		return p, err
	}
	tag, err := db.Exec(ctx, pruneFires, cutoff, limit)
	if err != nil {
		return p, fmt.Errorf("pruning schedule fires: %w", translate(err))
	}
	p.ScheduleFires = tag.RowsAffected()
	return p, nil
}

// CountPrunable counts what pruning everything that ended before cutoff
// would delete.
func CountPrunable(ctx context.Context, db DBTX, cutoff time.Time) (Pruned, error) {
	var p Pruned
	err := prunePerRoute(ctx, db, cutoff, 0, func(db DBTX, args pgx.StrictNamedArgs) error {
		var q Pruned
		if err := countPrunable.queryRow(ctx, db, args).Scan(&q.Runs, &q.Steps, &q.Signals, &q.DeadJobs); err != nil {
			return fmt.Errorf("counting prunable runs: %w", translate(err))
		}
		p.Runs, p.Steps, p.Signals, p.DeadJobs = p.Runs+q.Runs, p.Steps+q.Steps, p.Signals+q.Signals, p.DeadJobs+q.DeadJobs
		return nil
	})
	if err != nil {
		return p, err
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pgdurable.schedule_fires WHERE recorded_at < $1`, cutoff).Scan(&p.ScheduleFires); err != nil {
		return p, fmt.Errorf("counting prunable schedule fires: %w", translate(err))
	}
	return p, nil
}

// uuidFloor is the smallest UUID v7 of t's millisecond: every run created
// before t has a smaller run ID (clock skew between processes aside,
// which completed_at's check covers).
func uuidFloor(t time.Time) uuid.UUID { return UUIDFloor(t) }

// UUIDFloor is the smallest UUID v7 of millisecond t: every ID made at or
// after t sorts at or above it, every one made before below it.
func UUIDFloor(t time.Time) uuid.UUID {
	var id uuid.UUID
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(max(t.UnixMilli(), 0))) // before 1970: no run is older
	copy(id[:6], ms[2:])
	return id
}

// tableSize is the SQL of the bytes of table t of schema $1: on a Citus
// coordinator a distributed table's are its shards' on the worker nodes
// (its own table there is empty), which pg_total_relation_size does not
// count.
func tableSize(citus bool) string {
	const rel = `format('%I.%I', $1::text, t)::regclass`
	if !citus {
		return `pg_total_relation_size(` + rel + `)`
	}
	return `CASE WHEN EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = ` + rel + `)
	THEN citus_total_relation_size(` + rel + `) ELSE pg_total_relation_size(` + rel + `) END`
}

// TableSizes returns the bytes (with indexes and TOAST) of the engine's
// tables, by name, summed over the routes: on a Citus coordinator, a
// distributed table's shards' on the worker nodes.
func TableSizes(ctx context.Context, db DBTX) (map[string]int64, error) {
	citus, err := onCitus(ctx, db)
	if err != nil {
		return nil, err
	}
	size := tableSize(citus)
	rows, err := db.Query(ctx, `
SELECT t, `+size+`
FROM unnest(ARRAY['workflow_runs', 'workflow_steps', 'workflow_signals', 'dead_jobs', 'schedule_fires']) AS t`, db.schema().Name())
	if err != nil {
		return nil, fmt.Errorf("reading table sizes: %w", translate(err))
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return nil, err
		}
		out[name] = n
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	routes, err := Routes(ctx, db)
	if err != nil {
		return nil, err
	}
	for k := 1; k < routes; k++ {
		r, err := db.schema().root().Route(k)
		if err != nil {
			return nil, err
		}
		rows, err := db.Query(ctx, `
SELECT t, `+size+`
FROM unnest(ARRAY['workflow_runs', 'workflow_steps', 'workflow_signals', 'dead_jobs']) AS t`, r.runs)
		if err != nil {
			return nil, fmt.Errorf("reading table sizes of route %d: %w", k, translate(err))
		}
		sizes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
			name string
			n    int64
		}, error) {
			var v struct {
				name string
				n    int64
			}
			return v, r.Scan(&v.name, &v.n)
		})
		if err != nil {
			return nil, fmt.Errorf("reading table sizes of route %d: %w", k, translate(err))
		}
		for _, v := range sizes {
			out[v.name] += v.n
		}
	}
	return out, nil
}

// prunePerRoute calls f with the arguments of prunable for each part of a
// prune: with one route, the whole of it; with routes, on each route,
// the runs whose parent (if any) is in it, then those of its children
// whose parent, in another route, is closed (up to limit of them, 0 for
// all).
func prunePerRoute(ctx context.Context, db DBTX, cutoff time.Time, limit int, f func(DBTX, pgx.StrictNamedArgs) error) error {
	args := func(route int, cross bool, ids []uuid.UUID) pgx.StrictNamedArgs {
		a := pgx.StrictNamedArgs{"floor": uuidFloor(cutoff), "cutoff": cutoff, "route": route, "cross": cross, "ids": nil}
		if ids != nil {
			a["ids"] = uuids(ids)
		}
		return a
	}
	routes, err := Routes(ctx, db)
	if err != nil {
		return err
	}
	if routes == 1 {
		return f(db, args(-1, false, nil))
	}
	for k := range routes {
		on := onRoute(db, k)
		if err := f(on, args(k, false, nil)); err != nil {
			return err
		}
		// Pages of such children, until limit of them have a closed
		// parent (0: all): children of a parent still open are passed
		// over, not counted against the limit.
		var closed []uuid.UUID
		var after *uuid.UUID
		for limit == 0 || len(closed) < limit {
			a := args(k, true, nil)
			a["limit"], a["after"] = crossPage, after
			rows, err := crossChildren.query(ctx, on, a)
			if err != nil {
				return fmt.Errorf("reading the children whose parent is in another route: %w", translate(err))
			}
			type child struct{ run, parent uuid.UUID }
			children, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (child, error) {
				var c child
				return c, r.Scan(&c.run, &c.parent)
			})
			if err != nil {
				return fmt.Errorf("reading the children whose parent is in another route: %w", translate(err))
			}
			if len(children) == 0 {
				break
			}
			parents := make([]uuid.UUID, len(children))
			for i, c := range children {
				parents[i] = c.parent
			}
			open, err := idsByRoute(parents, db, func(db DBTX, ids []uuid.UUID) ([]uuid.UUID, error) {
				rows, err := db.Query(ctx, `SELECT run_id FROM pgdurable.workflow_runs
WHERE run_id = ANY ($1) AND status IN ('pending', 'running', 'waiting', 'compensating', 'dead')`, uuids(ids))
				if err != nil {
					return nil, err
				}
				return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
			})
			if err != nil {
				return fmt.Errorf("reading the parents of children in route %d: %w", k, translate(err))
			}
			for _, c := range children {
				if !slices.Contains(open, c.parent) && (limit == 0 || len(closed) < limit) {
					closed = append(closed, c.run)
				}
			}
			last := children[len(children)-1].run
			after = &last
			if len(children) < crossPage {
				break
			}
		}
		if len(closed) > 0 {
			if err := f(on, args(k, true, closed)); err != nil {
				return err
			}
		}
	}
	return nil
}
