package enginetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
)

// DefaultRequireTimeout is how long RequireRunStatus, RequireRunCompleted
// and RequireResult wait when their timeout is 0 or less: long enough for
// a run that a loaded CI machine delivers late, short enough that a stuck
// run fails the test well before go test's own 10-minute timeout.
const DefaultRequireTimeout = 30 * time.Second

// requirePoll is how often the waiting helpers read the run: a fraction of
// a step's round trips, so a test waits at most that long past the run's
// change, and a light read (no steps' payloads or signals) each time.
const requirePoll = 20 * time.Millisecond

// testingT is the part of testing.TB the Require helpers use. The exported
// helpers take a testing.TB and hand it to their unexported twins, which
// take this, so that the package's own tests can check a failure with a
// fake (testing.TB cannot be implemented outside package testing). As in
// rivertest, a failure is logged and then FailNow is called; a fake's
// FailNow returns, so every twin returns right after failing.
type testingT interface {
	FailNow()
	Helper()
	Logf(format string, args ...any)
}

// RequireRunStatus waits until run runID is in status, reading it every
// 20 ms for up to timeout (0 or less: DefaultRequireTimeout), and returns
// it as engine.Engine.GetRun reads it, steps included. It fails the test
// (tb.FailNow) when the run does not exist, when ctx ends, when timeout
// passes, or at once when the run reaches another terminal status
// (engine.RunStatus.Terminal: only an operator's replay moves a run out of
// one, and nothing replays while the test waits here). The failure message
// names the status found and lists the run's error, its steps and, for a
// dead run, its open dead jobs.
//
//	run := enginetest.RequireRunStatus(ctx, t, e, res.RunID, engine.StatusWaiting, 5*time.Second)
func RequireRunStatus(ctx context.Context, tb testing.TB, e *engine.Engine, runID uuid.UUID, status engine.RunStatus, timeout time.Duration) *engine.Run {
	tb.Helper()
	return requireRunStatus(ctx, tb, e, runID, status, timeout)
}

// RequireRunCompleted is RequireRunStatus with engine.StatusCompleted:
// it returns the completed run, whose Output holds the workflow's result
// as JSON (RequireResult decodes it). A run that fails, is parked dead or
// ends otherwise fails the test at once with its error and steps; one that
// continued as new ends continued, and Run.ContinuedRunID is the run to
// wait for.
//
//	run := enginetest.RequireRunCompleted(ctx, t, e, res.RunID, 0)
func RequireRunCompleted(ctx context.Context, tb testing.TB, e *engine.Engine, runID uuid.UUID, timeout time.Duration) *engine.Run {
	tb.Helper()
	return requireRunStatus(ctx, tb, e, runID, engine.StatusCompleted, timeout)
}

// RequireResult waits as RequireRunCompleted does and returns the run's
// result decoded by wf (engine.Workflow.Result), typed as the workflow's
// Out. It fails the test as RequireRunCompleted does, and when the run is
// not a run of wf or its output does not decode into Out.
//
//	receipt := enginetest.RequireResult(ctx, t, e, checkout, res.RunID, 0)
func RequireResult[In, Out any](ctx context.Context, tb testing.TB, e *engine.Engine, wf *engine.Workflow[In, Out], runID uuid.UUID, timeout time.Duration) Out {
	tb.Helper()
	return requireResult(ctx, tb, e, wf, runID, timeout)
}

func requireResult[In, Out any](ctx context.Context, t testingT, e *engine.Engine, wf *engine.Workflow[In, Out], runID uuid.UUID, timeout time.Duration) Out {
	t.Helper()
	var zero Out
	run := requireRunStatus(ctx, t, e, runID, engine.StatusCompleted, timeout)
	if run == nil {
		return zero
	}
	if run.WorkflowName != wf.Name() {
		failuref(t, "run %s is a run of workflow %q, not %q", runID, run.WorkflowName, wf.Name())
		return zero
	}
	out, err := wf.Result(ctx, e, runID)
	if err != nil {
		failuref(t, "reading the result of run %s: %v", runID, err)
		return zero
	}
	return out
}

func requireRunStatus(ctx context.Context, t testingT, e *engine.Engine, runID uuid.UUID, status engine.RunStatus, timeout time.Duration) *engine.Run {
	t.Helper()
	if timeout <= 0 {
		timeout = DefaultRequireTimeout
	}
	deadline := time.Now().Add(timeout)
	light := &engine.GetRunOpts{NoSignals: true, NoPayloads: true}
	var last *engine.Run
	for {
		run, err := e.GetRunWith(ctx, runID, light)
		if errors.Is(err, engine.ErrNotFound) {
			failuref(t, "no run %s", runID)
			return nil
		}
		if err != nil && last != nil && ctx.Err() != nil {
			// The context ended during a read rather than between two:
			// say what the run was, as between reads.
			failuref(t, "%s", describeRun(context.WithoutCancel(ctx), e, runID,
				fmt.Sprintf("is %s, want %s, when the context ended: %v", last.Status, status, ctx.Err())))
			return nil
		}
		if err != nil {
			failuref(t, "reading run %s: %v", runID, err)
			return nil
		}
		last = run
		switch {
		case run.Status == status:
			if run, err = e.GetRun(ctx, runID); err != nil {
				failuref(t, "reading run %s: %v", runID, err)
				return nil
			}
			return run
		case run.Status.Terminal():
			failuref(t, "%s", describeRun(ctx, e, runID, fmt.Sprintf("ended %s, want %s", run.Status, status)))
			return nil
		case !time.Now().Before(deadline):
			failuref(t, "%s", describeRun(ctx, e, runID, fmt.Sprintf("is %s after %s, want %s", run.Status, timeout, status)))
			return nil
		}
		select {
		case <-ctx.Done():
			failuref(t, "%s", describeRun(context.WithoutCancel(ctx), e, runID,
				fmt.Sprintf("is %s, want %s, when the context ended: %v", run.Status, status, ctx.Err())))
			return nil
		case <-time.After(requirePoll):
		}
	}
}

// RequireStepOpts narrows the step RequireStepRecorded looks for; each
// zero field matches anything, and the fields set must all match.
type RequireStepOpts struct {
	// Kind is the call that recorded the step (engine.KindStep,
	// engine.KindActivity, engine.KindTx, ...).
	Kind engine.StepKind
	// Status is the step's status (engine.StepCompleted, ...).
	Status engine.StepStatus
	// Attempts is the number of attempts the step took, the one that
	// ended it included.
	Attempts int
}

// RequireStepRecorded reads run runID once, as it is now, and returns its
// one step named name, failing the test (tb.FailNow) when the run has no
// step of that name, has several (a step called in a loop: use
// RequireSteps), or has one that does not match opts (nil: any). The
// failure message lists every step the run recorded. Wait for the run
// first (RequireRunStatus) when its steps are still being recorded.
//
//	step := enginetest.RequireStepRecorded(ctx, t, e, runID, "charge",
//		&enginetest.RequireStepOpts{Status: engine.StepCompleted, Attempts: 2})
func RequireStepRecorded(ctx context.Context, tb testing.TB, e *engine.Engine, runID uuid.UUID, name string, opts *RequireStepOpts) *engine.StepInfo {
	tb.Helper()
	return requireStepRecorded(ctx, tb, e, runID, name, opts)
}

func requireStepRecorded(ctx context.Context, t testingT, e *engine.Engine, runID uuid.UUID, name string, opts *RequireStepOpts) *engine.StepInfo {
	t.Helper()
	run := getRun(ctx, t, e, runID)
	if run == nil {
		return nil
	}
	var found []engine.StepInfo
	for _, s := range run.Steps {
		if s.Name == name {
			found = append(found, s)
		}
	}
	switch len(found) {
	case 0:
		failuref(t, "run %s recorded no step %q; its steps:\n%s", runID, name, describeSteps(run.Steps))
		return nil
	case 1:
	default:
		failuref(t, "run %s recorded %d steps named %q (RequireSteps checks them all); its steps:\n%s", runID, len(found), name, describeSteps(run.Steps))
		return nil
	}
	s := found[0]
	if opts != nil {
		var wrong []string
		if opts.Kind != "" && s.Kind != opts.Kind {
			wrong = append(wrong, fmt.Sprintf("kind %s, want %s", s.Kind, opts.Kind))
		}
		if opts.Status != "" && s.Status != opts.Status {
			wrong = append(wrong, fmt.Sprintf("status %s, want %s", s.Status, opts.Status))
		}
		if opts.Attempts != 0 && s.Attempts != opts.Attempts {
			wrong = append(wrong, fmt.Sprintf("%d attempts, want %d", s.Attempts, opts.Attempts))
		}
		if len(wrong) > 0 {
			failuref(t, "step %q (seq %d) of run %s has %s; its steps:\n%s", name, s.Seq, runID, strings.Join(wrong, ", "), describeSteps(run.Steps))
			return nil
		}
	}
	return &s
}

// RequireSteps reads run runID once, as it is now, and requires that the
// names of its recorded steps, in order of position (seq), be names:
// every step, compensations and waits (sleeps, signals, children)
// included. It returns the steps, and fails the test (tb.FailNow) with the
// steps found, one per line (seq, name, kind, status, attempts, error),
// when they differ. Wait for the run first (RequireRunStatus) when its
// steps are still being recorded.
//
//	enginetest.RequireSteps(ctx, t, e, runID, []string{"reserve", "charge", "undo_reserve"})
func RequireSteps(ctx context.Context, tb testing.TB, e *engine.Engine, runID uuid.UUID, names []string) []engine.StepInfo {
	tb.Helper()
	return requireSteps(ctx, tb, e, runID, names)
}

func requireSteps(ctx context.Context, t testingT, e *engine.Engine, runID uuid.UUID, names []string) []engine.StepInfo {
	t.Helper()
	run := getRun(ctx, t, e, runID)
	if run == nil {
		return nil
	}
	got := make([]string, len(run.Steps))
	for i, s := range run.Steps {
		got[i] = s.Name
	}
	if !slices.Equal(got, names) {
		failuref(t, "run %s recorded steps %q, want %q:\n%s", runID, got, names, describeSteps(run.Steps))
		return nil
	}
	return run.Steps
}

// RequireDeadJobOpts narrows the dead job RequireDeadJob looks for; each
// zero field matches anything, and the fields set must all match.
type RequireDeadJobOpts struct {
	// Reason is why the run was parked (engine.ReasonRetriesExhausted,
	// engine.ReasonPanic, ...).
	Reason engine.DeadReason
	// StepName is the step that failed ("" in the job when the run failed
	// outside a step).
	StepName string
}

// RequireDeadJob reads the open (not yet replayed or discarded) dead jobs
// of run runID once, as they are now, and returns the one there is,
// failing the test (tb.FailNow) when there is none, when there are several
// (a child's and its parent's are each their own run's), or when it does
// not match opts (nil: any). The failure message gives the run's status
// and error, its steps and the dead jobs found. A run is parked
// asynchronously: wait for it first with RequireRunStatus and
// engine.StatusDead.
//
//	enginetest.RequireRunStatus(ctx, t, e, runID, engine.StatusDead, 0)
//	job := enginetest.RequireDeadJob(ctx, t, e, runID,
//		&enginetest.RequireDeadJobOpts{Reason: engine.ReasonRetriesExhausted, StepName: "charge"})
func RequireDeadJob(ctx context.Context, tb testing.TB, e *engine.Engine, runID uuid.UUID, opts *RequireDeadJobOpts) *engine.DeadJob {
	tb.Helper()
	return requireDeadJob(ctx, tb, e, runID, opts)
}

func requireDeadJob(ctx context.Context, t testingT, e *engine.Engine, runID uuid.UUID, opts *RequireDeadJobOpts) *engine.DeadJob {
	t.Helper()
	jobs, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: runID, OpenOnly: true})
	if err != nil {
		failuref(t, "listing the dead jobs of run %s: %v", runID, err)
		return nil
	}
	switch len(jobs) {
	case 0:
		failuref(t, "%s", describeRun(ctx, e, runID, "has no open dead job"))
		return nil
	case 1:
	default:
		failuref(t, "%s", describeRun(ctx, e, runID, fmt.Sprintf("has %d open dead jobs, want one", len(jobs))))
		return nil
	}
	j := jobs[0]
	if opts != nil {
		var wrong []string
		if opts.Reason != "" && j.Reason != opts.Reason {
			wrong = append(wrong, fmt.Sprintf("reason %s, want %s", j.Reason, opts.Reason))
		}
		if opts.StepName != "" && j.StepName != opts.StepName {
			wrong = append(wrong, fmt.Sprintf("step %q, want %q", j.StepName, opts.StepName))
		}
		if len(wrong) > 0 {
			failuref(t, "%s", describeRun(ctx, e, runID, "has a dead job with "+strings.Join(wrong, ", ")))
			return nil
		}
	}
	return j
}

// getRun reads run runID in full, failing t when it cannot.
func getRun(ctx context.Context, t testingT, e *engine.Engine, runID uuid.UUID) *engine.Run {
	t.Helper()
	run, err := e.GetRun(ctx, runID)
	if errors.Is(err, engine.ErrNotFound) {
		failuref(t, "no run %s", runID)
		return nil
	}
	if err != nil {
		failuref(t, "reading run %s: %v", runID, err)
		return nil
	}
	return run
}

// describeRun is a failure's account of run runID: what went wrong
// (problem), then the run's workflow, status and error, its steps and its
// open dead jobs, read afresh so the message shows the run as it is.
func describeRun(ctx context.Context, e *engine.Engine, runID uuid.UUID, problem string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s %s", runID, problem)
	run, err := e.GetRun(ctx, runID)
	if err != nil {
		fmt.Fprintf(&b, "\n(reading it again: %v)", err)
		return b.String()
	}
	fmt.Fprintf(&b, "\nworkflow %q, status %s", run.WorkflowName, run.Status)
	if run.Error != nil {
		fmt.Fprintf(&b, ", error: %s", describeError(run.Error))
	}
	fmt.Fprintf(&b, "\nsteps:\n%s", describeSteps(run.Steps))
	jobs, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: runID, OpenOnly: true})
	if err != nil {
		fmt.Fprintf(&b, "\n(listing its dead jobs: %v)", err)
	}
	for _, j := range jobs {
		fmt.Fprintf(&b, "\nopen dead job %s: reason %s", j.ID, j.Reason)
		if j.StepName != "" {
			fmt.Fprintf(&b, ", step %q", j.StepName)
		}
		fmt.Fprintf(&b, ", %d attempts: %s: %s", j.Attempts, j.ErrorClass, j.ErrorMessage)
	}
	return b.String()
}

// describeSteps lists steps one per line, indented: seq, name, kind,
// status, attempts and, for a failed attempt, its error.
func describeSteps(steps []engine.StepInfo) string {
	if len(steps) == 0 {
		return "      (none)"
	}
	var b strings.Builder
	for i, s := range steps {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "      %d %q %s %s, %d attempts", s.Seq, s.Name, s.Kind, s.Status, s.Attempts)
		if s.Error != nil {
			fmt.Fprintf(&b, ", error: %s", describeError(s.Error))
		}
	}
	return b.String()
}

// describeError is an error's class and message ("permanent: card
// declined"), or the message alone when it has no class.
func describeError(info *engine.ErrorInfo) string {
	if info.Class == "" {
		return info.Message
	}
	return string(info.Class) + ": " + info.Message
}

// failuref fails t with a message set apart from the test's own output,
// the shape of rivertest's, so that a failure says it came from here.
func failuref(t testingT, format string, args ...any) {
	t.Helper()
	t.Logf("\n    pgdurable assertion failure:\n    %s\n", strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", "\n    "))
	t.FailNow()
}
