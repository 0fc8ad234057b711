package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Process is one started engine process's row in engine_processes.
type Process struct {
	ID         uuid.UUID
	Hostname   string
	PID        int
	Queue      string
	Workflows  []ProcessWorkflow
	Queues     []ProcessQueue
	StartedAt  time.Time
	LastSeenAt time.Time
}

// ProcessWorkflow is a workflow a process registers.
type ProcessWorkflow struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	// AutoUpgrade: the process moves the runs of older versions up to
	// this one (set on its latest version only).
	AutoUpgrade bool `json:"auto_upgrade,omitempty"`
}

// ProcessQueue is a flow-controlled queue a process serves, with how many
// workers.
type ProcessQueue struct {
	Name    string `json:"name"`
	Workers int    `json:"workers"`
}

const upsertProcess = `
INSERT INTO pgdurable.engine_processes (process_id, hostname, pid, queue, workflows, queues)
VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb)
ON CONFLICT (process_id) DO UPDATE SET workflows = excluded.workflows, queues = excluded.queues, last_seen_at = now()`

// SeeProcess records p (its ID, host, pid, queue, workflows) as seen now,
// and deletes the rows of processes not seen for longer than forget.
func SeeProcess(ctx context.Context, db DBTX, p Process, forget time.Duration) error {
	wfs, err := json.Marshal(p.Workflows)
	if err != nil {
		return err
	}
	queues := []byte("[]")
	if len(p.Queues) > 0 {
		if queues, err = json.Marshal(p.Queues); err != nil {
			return err
		}
	}
	if _, err := db.Exec(ctx, upsertProcess, p.ID, p.Hostname, p.PID, p.Queue, string(wfs), string(queues)); err != nil {
		return fmt.Errorf("recording engine process: %w", translate(err))
	}
	if _, err := db.Exec(ctx, `DELETE FROM pgdurable.engine_processes WHERE last_seen_at < now() - $1::bigint * interval '1 millisecond'`, ms(forget)); err != nil {
		return fmt.Errorf("forgetting engine processes: %w", translate(err))
	}
	return nil
}

// ForgetProcess deletes a stopping process's row.
func ForgetProcess(ctx context.Context, db DBTX, id uuid.UUID) error {
	_, err := db.Exec(ctx, `DELETE FROM pgdurable.engine_processes WHERE process_id = $1`, id)
	return translate(err)
}

// LiveProcesses returns the processes seen within within, oldest first.
func LiveProcesses(ctx context.Context, db DBTX, within time.Duration) ([]Process, error) {
	rows, err := db.Query(ctx, `
SELECT process_id, hostname, pid, queue, workflows, queues, started_at, last_seen_at FROM pgdurable.engine_processes
WHERE last_seen_at >= now() - $1::bigint * interval '1 millisecond' ORDER BY started_at, process_id`, ms(within))
	if err != nil {
		return nil, fmt.Errorf("reading engine processes: %w", translate(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Process, error) {
		var p Process
		var wfs, queues []byte
		if err := r.Scan(&p.ID, &p.Hostname, &p.PID, &p.Queue, &wfs, &queues, &p.StartedAt, &p.LastSeenAt); err != nil {
			return p, err
		}
		if err := json.Unmarshal(queues, &p.Queues); err != nil {
			return p, err
		}
		return p, json.Unmarshal(wfs, &p.Workflows)
	})
	if err != nil {
		return nil, fmt.Errorf("reading engine processes: %w", translate(err))
	}
	return out, nil
}
