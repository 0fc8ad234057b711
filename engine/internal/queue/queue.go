// Package queue is the engine's only River code. A River job here is a
// delivery ticket for one run: it carries the run ID and nothing else, and
// any number of tickets for one run are safe because the run's lease, not
// the ticket, decides who executes it.
package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

// Kind is the River job kind of a run delivery. Every engine process
// registers it (River's rescuer discards kinds its leader does not know).
const Kind = "pgdurable.run"

// Args are a delivery ticket's arguments.
type Args struct {
	RunID uuid.UUID `json:"run_id"`
}

// Kind implements river.JobArgs.
func (Args) Kind() string { return Kind }

// Handler runs one delivery of a run. A nil result completes the ticket;
// Snooze defers it.
type Handler func(ctx context.Context, runID uuid.UUID) error

// Snooze asks River to deliver the same ticket again after d without using
// one of its attempts.
func Snooze(d time.Duration) error { return river.JobSnooze(d) }

// Config holds River's knobs as the engine sets them.
type Config struct {
	Schema            string // where River's tables are
	Queue             string
	MaxWorkers        int
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration
	Logger            *slog.Logger
}

// Queue wraps one River client.
type Queue struct {
	client *river.Client[pgx.Tx]
	queue  string
}

type worker struct {
	river.WorkerDefaults[Args]
	handle Handler
}

// Work hands the ticket to the engine with a context that River's job
// timeout does not cancel (a delivery may run a long step; its run's lease,
// not River, bounds it) but that a StopAndCancel still does.
func (w *worker) Work(ctx context.Context, job *river.Job[Args]) error {
	dctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel(context.Cause(ctx))
		}
	})
	defer stop()
	return w.handle(context.WithValue(dctx, metadataKey{}, job.Metadata), job.Args.RunID)
}

type metadataKey struct{}

// Snoozes is how many times the ticket of the delivery ctx belongs to was
// snoozed before (River counts them in the job's metadata).
func Snoozes(ctx context.Context) int {
	b, _ := ctx.Value(metadataKey{}).([]byte)
	var m struct {
		Snoozes int `json:"snoozes"`
	}
	_ = json.Unmarshal(b, &m)
	return m.Snoozes
}

// ticketRescueAfter is River's job timeout and rescue horizon. Our sweeper
// recovers runs whose delivery died after claiming the lease; River's
// rescuer (a 30 s tick on the leader) covers the narrow window between
// River's fetch and the claim. Rescuing a ticket whose delivery is alive is
// harmless: the retried ticket finds the live lease and completes.
const ticketRescueAfter = time.Minute

// ticketMaxAttempts is high because a ticket only fails when the database
// does; River must not discard it while the run still needs a delivery.
const ticketMaxAttempts = 1000

// ticketRetry schedules a failed ticket's next try: 1 s doubling to at most
// 30 s, with ±20% jitter. A ticket fails only when the database did
// (a claim or write that failed, possibly in a crash that lost the claim),
// so it must come back soon: River's default of attempt⁴ seconds would wait
// 10 minutes after the fifth failure.
type ticketRetry struct{}

func (ticketRetry) NextRetry(job *rivertype.JobRow) time.Time {
	d := 30 * time.Second
	if n := len(job.Errors); n < 6 {
		d = time.Second << max(n-1, 0)
	}
	return time.Now().Add(time.Duration(float64(d) * (0.8 + 0.4*rand.Float64())))
}

// New builds a River client over pool that delivers tickets to handle.
func New(pool *pgxpool.Pool, cfg Config, handle Handler) (*Queue, error) {
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &worker{handle: handle}); err != nil {
		return nil, fmt.Errorf("registering river worker: %w", err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues: map[string]river.QueueConfig{
			cfg.Queue: {MaxWorkers: cfg.MaxWorkers},
		},
		Workers:              workers,
		FetchCooldown:        cfg.FetchCooldown,
		FetchPollInterval:    cfg.FetchPollInterval,
		JobTimeout:           ticketRescueAfter,
		RescueStuckJobsAfter: ticketRescueAfter,
		MaxAttempts:          ticketMaxAttempts,
		RetryPolicy:          ticketRetry{},
		Logger:               cfg.Logger,
		Schema:               cfg.Schema,
	})
	if err != nil {
		return nil, fmt.Errorf("creating river client: %w", err)
	}
	return &Queue{client: client, queue: cfg.Queue}, nil
}

// Enqueue inserts a ticket for runID in tx, due at at (zero: now).
func (q *Queue) Enqueue(ctx context.Context, tx pgx.Tx, runID uuid.UUID, at time.Time) error {
	_, err := q.client.InsertTx(ctx, tx, Args{RunID: runID}, q.opts(at))
	if err != nil {
		return fmt.Errorf("enqueueing delivery of run %s: %w", runID, err)
	}
	return nil
}

// EnqueueMany inserts one ticket per run ID in tx, due now.
func (q *Queue) EnqueueMany(ctx context.Context, tx pgx.Tx, runIDs []uuid.UUID) error {
	if len(runIDs) == 0 {
		return nil
	}
	params := make([]river.InsertManyParams, len(runIDs))
	for i, id := range runIDs {
		params[i] = river.InsertManyParams{Args: Args{RunID: id}, InsertOpts: q.opts(time.Time{})}
	}
	if _, err := q.client.InsertManyTx(ctx, tx, params); err != nil {
		return fmt.Errorf("enqueueing %d deliveries: %w", len(runIDs), err)
	}
	return nil
}

func (q *Queue) opts(at time.Time) *river.InsertOpts {
	return &river.InsertOpts{Queue: q.queue, ScheduledAt: at, MaxAttempts: ticketMaxAttempts}
}

// Start starts fetching and working tickets.
func (q *Queue) Start(ctx context.Context) error { return q.client.Start(ctx) }

// Stop stops fetching and waits for running deliveries to finish.
func (q *Queue) Stop(ctx context.Context) error { return ignoreNotStarted(q.client.Stop(ctx)) }

// StopAndCancel stops fetching and cancels running deliveries' contexts.
func (q *Queue) StopAndCancel(ctx context.Context) error {
	return ignoreNotStarted(q.client.StopAndCancel(ctx))
}

func ignoreNotStarted(err error) error {
	if err != nil && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// StaleTickets returns the run IDs of tickets River has had running for
// longer than olderThan (by their attempted_at): either a long delivery
// that is alive, or one whose process died after River's fetch. The engine
// tells them apart by the run's lease.
func (q *Queue) StaleTickets(ctx context.Context, olderThan time.Duration) ([]uuid.UUID, error) {
	horizon := time.Now().Add(-olderThan)
	var ids []uuid.UUID
	// Every page, not only the first: the tickets of deliveries that a
	// killed process ran stay running until River's rescuer comes for them
	// (ticketRescueAfter), and a first page full of them hid the orphans
	// behind it until then.
	params := river.NewJobListParams().Kinds(Kind).Queues(q.queue).States(rivertype.JobStateRunning).First(staleTicketBatch)
	for range staleTicketPages {
		res, err := q.client.JobList(ctx, params)
		if err != nil {
			return nil, fmt.Errorf("listing running deliveries: %w", err)
		}
		for _, j := range res.Jobs {
			if j.AttemptedAt == nil || j.AttemptedAt.After(horizon) {
				continue
			}
			var a Args
			if err := json.Unmarshal(j.EncodedArgs, &a); err != nil {
				continue // not ours to judge; River's rescuer handles it
			}
			ids = append(ids, a.RunID)
		}
		if len(res.Jobs) < staleTicketBatch {
			break
		}
		params = params.After(res.LastCursor)
	}
	return ids, nil
}

// staleTicketBatch and staleTicketPages bound one look for stale tickets:
// 20,000 running tickets, 1,000 a page.
const (
	staleTicketBatch = 1000
	staleTicketPages = 20
)
