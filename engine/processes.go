package engine

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// A started engine records its process (what it registers, where) in
// engine_processes every processBeat; a process not seen for processLive
// is not listed, and one not seen for processForget is deleted.
const (
	processBeat   = 10 * time.Second
	processLive   = 3 * processBeat
	processForget = time.Hour
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
	procs, err := store.LiveProcesses(ctx, e.pool, processLive)
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

// seeProcess records this started process as seen now. A failure is
// logged: the listing is for people, and the engine works without it.
func (e *Engine) seeProcess(ctx context.Context) {
	host, _ := os.Hostname()
	p := store.Process{ID: e.processID, Hostname: host, PID: os.Getpid(), Queue: e.cfg.Queue}
	e.mu.Lock()
	for _, w := range e.workflows {
		p.Workflows = append(p.Workflows, store.ProcessWorkflow{Name: w.name, Version: w.version})
	}
	e.mu.Unlock()
	slices.SortFunc(p.Workflows, func(a, b store.ProcessWorkflow) int { return cmp.Compare(a.Name, b.Name) })
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if err := store.SeeProcess(ctx, e.pool, p, processForget); err != nil {
		e.log.Warn("recording this engine process failed", "error", err)
	}
}

// forgetProcess deletes this stopping process's record.
func (e *Engine) forgetProcess() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := store.ForgetProcess(ctx, e.pool, e.processID); err != nil {
		e.log.Warn("deleting this engine process's record failed", "error", err)
	}
}
