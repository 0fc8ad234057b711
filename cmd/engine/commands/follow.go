package commands

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
)

// followPoll is how often a followed run is read while it changes; each
// read that finds nothing new doubles the wait, up to followPollMax.
const (
	followPoll    = 200 * time.Millisecond
	followPollMax = 2 * time.Second
)

// followOutage is how long a follow over --address keeps asking a server
// that does not answer before it gives up.
const followOutage = time.Minute

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// untilAnswered calls fn until it gets an answer from the engine: over
// --address, while the server has not answered (it is not up yet, or
// restarting) and retry says the call may be sent again, fn is retried
// every second for followOutage, as follow does once the server has
// answered. It says so on stderr, once, and again when the server
// answers. On the database fn is called once.
func (g *global) untilAnswered(ctx context.Context, retry func(*unreachableError) bool, fn func() error) error {
	var lost time.Time
	for {
		err := fn()
		var down *unreachableError
		switch {
		case !errors.As(err, &down) || !retry(down):
			if err == nil && !lost.IsZero() {
				fmt.Fprintln(g.opts.Stderr, "the engine answers")
			}
			return err
		case lost.IsZero():
			lost = time.Now()
			fmt.Fprintf(g.opts.Stderr, "no answer from the engine at %s (%s); retrying for %s\n", down.base, serverText(down.err.Error(), maxServerMessage), followOutage)
		case time.Since(lost) >= followOutage:
			return err
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return fmt.Errorf("stopped waiting for the engine at %s: %w", down.base, err)
		}
	}
}

// anyUnreachable retries every call the server did not answer: for reads.
func anyUnreachable(*unreachableError) bool { return true }

// notSent says whether a call the server did not answer never reached it
// (the connection was refused, or could not be made): such a call may be
// sent again even if it is not idempotent.
func notSent(down *unreachableError) bool {
	var op *net.OpError
	return errors.As(down.err, &op) && op.Op == "dial"
}

// stillPending is how long a followed run may stay pending, never picked
// up, before the follower says why that may be.
const stillPending = 5 * time.Second

// runOutcomeError ends a command that followed a run to an end other
// than completed: exit status 1, with the run's status and error.
type runOutcomeError struct{ run *engine.Run }

func (e *runOutcomeError) Error() string {
	msg := "no error recorded"
	if e.run.Error != nil {
		msg = cell(e.run.Error.Class) + ": " + oneLine(e.run.Error.Message, 2000)
	}
	return fmt.Sprintf("run %s ended %s: %s", e.run.RunID, cell(e.run.Status), msg)
}

// follow prints a run's steps as they are recorded and its status as it
// changes, until it ends (following a continue-as-new chain to its last
// run), and returns it as it ended. With JSON output it prints nothing
// until then. ctx ends the follow, not the run.
//
// Each read asks only for what may have changed: the steps from the first
// one that has not ended (or the first position not recorded yet), with
// no signals and no payloads (a run may hold megabytes of them); the
// whole run is read once, at its end.
func (g *global) follow(ctx context.Context, e backend, runID uuid.UUID) (*engine.Run, error) {
	w := g.opts.Stdout
	seen := map[int]engine.StepStatus{}
	var status engine.RunStatus
	began := time.Now()
	hinted := false
	var lost time.Time // when the server stopped answering, over --address
	from, poll := 0, followPoll
	for {
		run, err := e.GetRunWith(ctx, runID, &engine.GetRunOpts{StepsFrom: from, NoSignals: true, NoPayloads: true})
		var down *unreachableError
		switch {
		case errors.As(err, &down) && (lost.IsZero() || time.Since(lost) < followOutage):
			// A server restarting (a deploy) is not the run's end: keep
			// asking for a while.
			if lost.IsZero() {
				lost = time.Now()
				fmt.Fprintf(g.opts.Stderr, "lost the engine (%s); retrying for %s\n", serverText(down.err.Error(), maxServerMessage), followOutage)
			}
			if err := sleepCtx(ctx, time.Second); err != nil {
				return nil, fmt.Errorf("stopped following run %s (it goes on): %w", runID, err)
			}
			continue
		case err != nil:
			return nil, err
		}
		if !lost.IsZero() {
			lost = time.Time{}
			fmt.Fprintln(g.opts.Stderr, "the engine answers again")
		}
		changed := run.Status != status
		for _, s := range run.Steps {
			if seen[s.Seq] == s.Status {
				continue
			}
			seen[s.Seq], changed = s.Status, true
			if !g.jsonOut {
				fmt.Fprintf(w, "  step %-3d %-24s %-12s %-10s%s\n", s.Seq, cell(s.Name), cell(s.Kind), cell(s.Status), stepNote(s))
			}
		}
		from = followFrom(from, run.Steps)
		if !g.jsonOut {
			if run.Status != status {
				fmt.Fprintf(w, "run %s %s\n", run.RunID, statusNote(run))
			}
			if !hinted && run.Status == engine.StatusPending && run.Deliveries == 0 && time.Since(began) > stillPending {
				hinted = true
				fmt.Fprintf(w, "  (still pending after %s: no worker has picked it up; is an engine that registers workflow %q serving this database?)\n",
					stillPending, cell(run.WorkflowName))
			}
		}
		status = run.Status
		if run.Status == engine.StatusContinued && run.ContinuedRunID != nil {
			runID, seen, status, from, poll = *run.ContinuedRunID, map[int]engine.StepStatus{}, "", 0, followPoll
			continue
		}
		if run.Status.Terminal() {
			return e.GetRun(ctx, runID) // the whole run, once
		}
		if changed {
			poll = followPoll
		} else {
			poll = min(2*poll, followPollMax)
		}
		if err := sleepCtx(ctx, poll); err != nil {
			return nil, fmt.Errorf("stopped following run %s (it goes on): %w", runID, err)
		}
	}
}

// followFrom is the step position a follower reads from next, given the
// steps it read from from on (in order): the first one that may still
// change, a step not ended (started, retrying, parked) or a position with
// no record yet (a parallel step still running).
func followFrom(from int, steps []engine.StepInfo) int {
	for _, s := range steps {
		if s.Seq != from {
			return from // a hole: that step may be recorded yet
		}
		switch s.Status {
		case engine.StepCompleted, engine.StepFailed, engine.StepCancelled:
			from++
		default:
			return from
		}
	}
	return from
}

// stepNote is what a followed step's line adds: its attempts, duration and
// error.
func stepNote(s engine.StepInfo) string {
	var parts []string
	if s.Attempts > 1 {
		parts = append(parts, fmt.Sprintf("attempt %d", s.Attempts))
	}
	if s.CompletedAt != nil {
		parts = append(parts, s.CompletedAt.Sub(s.StartedAt).Round(time.Millisecond).String())
	}
	if s.NextAttemptAt != nil && s.Status == engine.StepRetrying {
		parts = append(parts, "next at "+cell(s.NextAttemptAt))
	}
	if s.Error != nil {
		parts = append(parts, cell(s.Error.Class)+": "+oneLine(s.Error.Message, 120))
	}
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, ", ")
}

// statusNote describes a followed run's new status.
func statusNote(run *engine.Run) string {
	switch run.Status {
	case engine.StatusCompleted:
		return "completed: output " + oneLine(string(run.Output), 200)
	case engine.StatusContinued:
		return "continued as new"
	case engine.StatusWaiting:
		if len(run.AwaitChildren) > 0 {
			return "waiting for " + awaitedChildren(run.AwaitChildren)
		}
		if run.AwaitSignal != "" {
			return "waiting for " + awaited(run)
		}
		if run.WakeAt != nil {
			return "waiting until " + cell(run.WakeAt)
		}
	}
	if run.Error != nil && run.Status.Terminal() {
		return cell(run.Status) + ": " + cell(run.Error.Class) + ": " + oneLine(run.Error.Message, 200)
	}
	return cell(run.Status)
}

// endFollow prints a followed run as it ended (its JSON with --json) and
// fails the command unless it completed.
func (g *global) endFollow(run *engine.Run) error {
	if g.jsonOut {
		if err := writeJSON(g.opts.Stdout, run); err != nil {
			return err
		}
	}
	if run.Status != engine.StatusCompleted {
		return &runOutcomeError{run: run}
	}
	return nil
}
