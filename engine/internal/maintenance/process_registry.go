package maintenance

import (
	"cmp"
	"context"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// A started engine records its process (what it registers, where) in
// engine_processes every ProcessBeat; a process not seen for ProcessLive
// is not listed, and one not seen for processForget is deleted.
const (
	ProcessBeat   = 10 * time.Second
	ProcessLive   = 3 * ProcessBeat
	processForget = time.Hour
)

// ProcessRegistry keeps this started process's row in engine_processes:
// its host, pid, queue and the workflows it registers, which
// Engine.ListWorkflows reads. The engine records the process when it
// starts (RunOnce), the Maintainer every ProcessBeat after, and the
// engine deletes the row when it stops (Forget). A failure is logged: the
// listing is for people, and the engine works without it.
type ProcessRegistry struct {
	// DB is the engine's pool, Log its Config.Logger.
	DB  store.DBTX
	Log *slog.Logger
	// ID names this process's row.
	ID uuid.UUID
	// QueueName is the engine's queue (Config.Queue).
	QueueName string
	// Workflows returns the workflows this process registers now, in any
	// order.
	Workflows func() []store.ProcessWorkflow
	// Queues returns the flow-controlled queues this process serves.
	Queues func() []store.ProcessQueue
	// WriteTimeout bounds each write, which runs even once the pass's
	// context is cancelled: a stopping engine still records itself until
	// Forget.
	WriteTimeout time.Duration
}

// Next: ProcessBeat after the Maintainer started (the engine recorded
// the process just before), then ProcessBeat after the last pass began.
func (r *ProcessRegistry) Next(began, ended time.Time) time.Time {
	if began.IsZero() {
		return ended.Add(ProcessBeat)
	}
	return began.Add(ProcessBeat)
}

// RunOnce records this process as seen now, and deletes the rows of
// processes not seen for an hour.
func (r *ProcessRegistry) RunOnce(ctx context.Context) {
	host, _ := os.Hostname()
	p := store.Process{ID: r.ID, Hostname: host, PID: os.Getpid(), Queue: r.QueueName, Workflows: r.Workflows()}
	if r.Queues != nil {
		p.Queues = r.Queues()
		slices.SortFunc(p.Queues, func(a, b store.ProcessQueue) int { return cmp.Compare(a.Name, b.Name) })
	}
	slices.SortFunc(p.Workflows, func(a, b store.ProcessWorkflow) int { return cmp.Compare(a.Name, b.Name) })
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.WriteTimeout)
	defer cancel()
	if err := store.SeeProcess(ctx, r.DB, p, processForget); err != nil {
		r.Log.Warn("recording this engine process failed", "error", err)
	}
}

// Forget deletes this stopping process's row, within 5 s.
func (r *ProcessRegistry) Forget() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := store.ForgetProcess(ctx, r.DB, r.ID); err != nil {
		r.Log.Warn("deleting this engine process's record failed", "error", err)
	}
}
