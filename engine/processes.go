package engine

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/maintenance"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// WorkflowInfo is a workflow that live engine processes register, as
// ListWorkflows reports it.
type WorkflowInfo struct {
	Name      string        `json:"name"`
	Versions  []int         `json:"versions"` // the versions the processes register, ascending
	Processes []ProcessInfo `json:"processes"`
}

// ProcessInfo is an engine process that registers a workflow.
type ProcessInfo struct {
	ID         uuid.UUID `json:"id"`
	Hostname   string    `json:"hostname"`
	PID        int       `json:"pid"`
	Queue      string    `json:"queue"`
	Version    int       `json:"version"` // of the workflow, as this process registers it
	StartedAt  time.Time `json:"started_at"`
	LastSeenAt time.Time `json:"last_seen_at"`
}

// ListWorkflows returns the workflows that live engine processes register
// (started engines seen in the last 30 s, on any queue), by name, with the
// versions and the processes (host, pid, queue) that register each: what
// can run where. A process records itself when its engine starts and
// every 10 s after, and deletes its record when it stops; a killed one
// drops out of the list 30 s after it was last seen.
func (e *Engine) ListWorkflows(ctx context.Context) ([]WorkflowInfo, error) {
	procs, err := store.LiveProcesses(ctx, e.pool, maintenance.ProcessLive)
	if err != nil {
		return nil, fmt.Errorf("pgdurable: %w", err)
	}
	byName := map[string]*WorkflowInfo{}
	for _, p := range procs {
		for _, w := range p.Workflows {
			info := byName[w.Name]
			if info == nil {
				info = &WorkflowInfo{Name: w.Name}
				byName[w.Name] = info
			}
			if !slices.Contains(info.Versions, w.Version) {
				info.Versions = append(info.Versions, w.Version)
			}
			info.Processes = append(info.Processes, ProcessInfo{ID: p.ID, Hostname: p.Hostname, PID: p.PID, Queue: p.Queue,
				Version: w.Version, StartedAt: p.StartedAt, LastSeenAt: p.LastSeenAt})
		}
	}
	out := make([]WorkflowInfo, 0, len(byName))
	for _, info := range byName {
		slices.Sort(info.Versions)
		out = append(out, *info)
	}
	slices.SortFunc(out, func(a, b WorkflowInfo) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}
