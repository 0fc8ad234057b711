package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// HistoryFormat is the version of History's JSON that this package writes
// and reads.
const HistoryFormat = 1

// History is a run as it was recorded: what Replay checks a workflow's
// current code against. `engine runs export` writes it as JSON (a file per
// run to keep next to the workflow's tests); NewHistory makes one from a
// Run read with GetRun.
type History struct {
	// Format is HistoryFormat.
	Format          int             `json:"format"`
	RunID           uuid.UUID       `json:"run_id"`
	Workflow        string          `json:"workflow"`
	WorkflowVersion int             `json:"workflow_version"`
	WorkflowID      string          `json:"workflow_id"`
	Status          RunStatus       `json:"status"`
	Input           json.RawMessage `json:"input"`
	Output          json.RawMessage `json:"output,omitempty"`
	Error           *ErrorInfo      `json:"error,omitempty"`
	// CancelRequested: the run's cancellation was requested, which
	// changes what its code does (its forward steps stop).
	CancelRequested bool `json:"cancel_requested,omitempty"`
	// Steps are the recorded steps in position order (seq), their outputs
	// and errors included: a replay returns them instead of running the
	// steps.
	Steps []StepInfo `json:"steps"`
}

// NewHistory is run's history, from a Run that GetRun read with its
// payloads (GetRunWith's NoPayloads unset). ErrInvalidArgument when it
// lacks them.
func NewHistory(run *Run) (*History, error) {
	if run.Input == nil {
		return nil, fmt.Errorf("%w: run %s was read without its input: read it with GetRun", ErrInvalidArgument, run.RunID)
	}
	steps := run.Steps
	if steps == nil {
		steps = []StepInfo{}
	}
	return &History{Format: HistoryFormat, RunID: run.RunID, Workflow: run.WorkflowName, WorkflowVersion: run.WorkflowVersion,
		WorkflowID: run.WorkflowID, Status: run.Status, Input: run.Input, Output: run.Output, Error: run.Error,
		CancelRequested: run.CancelRequestedAt != nil, Steps: steps}, nil
}

// ReplayError is how a workflow's code departs from a recorded history
// (Replay): the first position where it does, what the history holds
// there and what the code did.
type ReplayError struct {
	// Seq is the step position the code departs at; -1 when the run's end
	// differs (its status or output) after every step replayed.
	Seq int
	// Recorded is what the history holds at Seq ("signal \"approve\"", or
	// "nothing: the run ended completed"); Called what the code did there.
	Recorded, Called string
	// Message says it in a sentence.
	Message string
}

func (e *ReplayError) Error() string { return "replay: " + e.Message }

// errReplayStopped ends a replay's delivery where the code would run a
// step's function (see replayProbe).
var errReplayStopped = errors.New("pgdurable: replay stops before running a step")

// replayProbe is what an engine made by Replay reports: the first step
// whose function its code would have run.
type replayProbe struct {
	reached chan replayStop
}

type replayStop struct {
	seq  int
	name string
	kind StepKind
}

// stop reports that the delivery reached a step it would run (once).
func (p *replayProbe) stop(seq int, name string, kind StepKind) {
	select {
	case p.reached <- replayStop{seq, name, kind}:
	default:
	}
}

// replayWait bounds how long Replay waits for the code to reach an end.
const replayWait = 30 * time.Second

// Replay runs w's current code against the recorded history h and reports
// the first place where they part, as a *ReplayError, or nil when the code
// replays every recorded step and ends as the run did (or, for a run that
// had not ended, goes on from where it was). No step's function runs: a
// recorded step returns its recorded outcome, and the replay stops where
// the code would run a step's function.
//
// It works on pool's database, which must be migrated (storage/migrations)
// and be a scratch database of its own: Replay inserts the run there,
// under a new run ID, and starts an engine on it for the replay; its
// caller drops the database (enginetest.Replay does all this). It
// departs when: a step at a position is not the recorded one (kind, name;
// the run is parked as nondeterminism); the code returns before calling
// every recorded step; it calls a step past the end of a run that ended;
// or it ends otherwise than the run did (status, output). Errors other
// than a *ReplayError: w not a workflow (a *Workflow), h not of w, of
// another format, or of a cancelled run (not replayed yet), as
// ErrInvalidArgument, and database errors.
func Replay(ctx context.Context, pool *pgxpool.Pool, w Registration, h *History) error {
	wf, ok := w.(interface{ registration() registered })
	if !ok {
		return fmt.Errorf("%w: Replay replays a workflow (a *Workflow), not a %T", ErrInvalidArgument, w)
	}
	reg := wf.registration()
	switch {
	case h.Format != HistoryFormat:
		return fmt.Errorf("%w: history format %d, this engine reads %d", ErrInvalidArgument, h.Format, HistoryFormat)
	case h.Workflow != reg.name:
		return fmt.Errorf("%w: the history is of workflow %q, not %q", ErrInvalidArgument, h.Workflow, reg.name)
	case h.CancelRequested:
		return fmt.Errorf("%w: the history is of a run whose cancellation was requested; Replay does not replay those yet", ErrInvalidArgument)
	}
	if err := h.check(); err != nil {
		return err
	}
	used, err := store.HoldsRuns(ctx, store.Default.On(pool))
	if err != nil {
		return fmt.Errorf("replay: reading the scratch database: %w", err)
	}
	if used {
		return fmt.Errorf("%w: the database holds runs: Replay works on a scratch database of its own (enginetest.NewDB), never on one in use", ErrInvalidArgument)
	}
	recs := make([]*store.StepRecord, len(h.Steps))
	for i, s := range h.Steps {
		errJSON, err := encodeHistoryError(s.Error)
		if err != nil {
			return err
		}
		recs[i] = &store.StepRecord{Seq: s.Seq, Name: s.Name, Kind: string(s.Kind), Status: string(s.Status), Attempts: s.Attempts,
			RequestID: s.RequestID, Output: s.Output, Error: errJSON, NextAttemptAt: s.NextAttemptAt, StartedAt: s.StartedAt,
			CompletedAt: s.CompletedAt, Compensation: s.Compensation, CompensationOf: s.CompensationOf, InputHash: s.InputHash,
			Patches: joinPatches(s.Patches)}
	}
	e, err := New(pool, &Config{Logger: slog.New(slog.DiscardHandler), Queue: "pgdurable_replay"})
	if err != nil {
		return err
	}
	probe := &replayProbe{reached: make(chan replayStop, 1)}
	e.replay = probe
	if err := e.Register(w); err != nil {
		return err
	}
	// Inserted delayed, so no delivery claims it before its steps are in.
	res, err := e.StartJSON(ctx, h.Workflow, h.Input, &StartOpts{WorkflowID: "replay-" + uuid.NewString(), Delay: 24 * time.Hour})
	if err != nil {
		return fmt.Errorf("replay: starting the run: %w", err)
	}
	if err := store.InsertSteps(ctx, e.db, res.RunID, recs); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if err := e.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = e.Stop(sctx)
	}()
	if err := e.StartNow(ctx, res.RunID); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return e.replayOutcome(ctx, probe, res.RunID, h)
}

// check refuses a history that is not one NewHistory could have written:
// it would replay as something other than the run (a file cut short, or
// edited by hand).
func (h *History) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: history of run %s: %s", ErrInvalidArgument, h.RunID, fmt.Sprintf(format, args...))
	}
	if h.Steps == nil {
		return bad(`it has no "steps" (an exported history lists them, [] for none): a file cut short?`)
	}
	if !h.Status.valid() {
		return bad("unknown run status %q", h.Status)
	}
	if len(h.Input) == 0 {
		return bad("it has no input")
	}
	prev := -1
	for i, s := range h.Steps {
		switch {
		case s.Seq <= prev:
			return bad("step %d (%q) is at position %d, not after position %d: positions must increase", i, s.Name, s.Seq, prev)
		case s.Seq >= len(h.Steps)+maxHistoryHoles:
			return bad("step %d (%q) is at position %d, far past the %d steps listed", i, s.Name, s.Seq, len(h.Steps))
		case !validStepKind(s.Kind):
			return bad("step %d (%q) has unknown kind %q", i, s.Name, s.Kind)
		case !validStepStatus(s.Status):
			return bad("step %d (%q) has unknown status %q", i, s.Name, s.Status)
		}
		if err := checkName("step name", s.Name, 200); err != nil {
			return bad("step %d: %v", i, err)
		}
		for _, id := range s.Patches {
			if err := checkName("change ID", id, 200); err != nil {
				return bad("step %d: %v", i, err)
			}
		}
		prev = s.Seq
	}
	return nil
}

// maxHistoryHoles bounds how far a history's positions may run past its
// step count: a hole is a parallel step that had not ended, and a run
// holds at most so many of those at once.
const maxHistoryHoles = 1000

func validStepKind(k StepKind) bool {
	switch k {
	case KindStep, KindTx, KindActivity, KindSleep, KindSignal, KindChild, KindSelect, KindCompensation, KindPatch:
		return true
	}
	return false
}

func validStepStatus(s StepStatus) bool {
	switch s {
	case StepStarted, StepCompleted, StepFailed, StepRetrying, StepParked, StepCancelled:
		return true
	}
	return false
}

// replayOutcome waits for the replayed run to reach an end, a wait or a
// step it would run, and compares it with h.
func (e *Engine) replayOutcome(ctx context.Context, probe *replayProbe, runID uuid.UUID, h *History) error {
	ended := h.Status.Terminal() && h.Status != StatusDead
	deadline := time.NewTimer(replayWait)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case s := <-probe.reached:
			if s.seq < len(h.Steps) || !ended {
				return nil // it reached where the run was, and goes on from there
			}
			return &ReplayError{Seq: s.seq, Recorded: "nothing: the run ended " + string(h.Status), Called: fmt.Sprintf("%s %q", s.kind, s.name),
				Message: fmt.Sprintf("position %d: the code calls %s %q, past the end of the history (the run ended %s after %d steps)",
					s.seq, s.kind, s.name, h.Status, len(h.Steps))}
		case <-tick.C:
		case <-deadline.C:
			return fmt.Errorf("replay: the code neither ended nor waited within %s", replayWait)
		case <-ctx.Done():
			return ctx.Err()
		}
		run, err := e.GetRun(ctx, runID)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		switch {
		case run.Status == StatusDead:
			return e.replayDivergence(ctx, run, h)
		case run.Status == StatusWaiting && !ended:
			return nil // waiting where the run waited, or further on
		case run.Status == StatusWaiting:
			return &ReplayError{Seq: len(run.Steps) - 1, Recorded: "nothing: the run ended " + string(h.Status), Called: "a wait",
				Message: fmt.Sprintf("the code waits (%s) where the run ended %s", waitWhat(run), h.Status)}
		case run.Status.Terminal():
			return replayEnd(run, h)
		}
	}
}

// replayDivergence is the ReplayError of a replay parked as dead.
func (e *Engine) replayDivergence(ctx context.Context, run *Run, h *History) error {
	jobs, _, err := e.ListDeadJobs(ctx, ListDeadJobsParams{RunID: run.RunID})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if len(jobs) == 0 || jobs[0].Reason != ReasonNonDeterminism {
		if h.Status == StatusDead {
			return nil // parked as the run was
		}
		msg := "the replay was parked"
		if len(jobs) > 0 {
			msg += " (" + string(jobs[0].Reason) + "): " + jobs[0].ErrorMessage
		}
		return &ReplayError{Seq: -1, Recorded: "the run " + string(h.Status), Called: "parked", Message: msg}
	}
	seq := -1
	if jobs[0].Seq != nil {
		seq = *jobs[0].Seq
	}
	return &ReplayError{Seq: seq, Message: jobs[0].ErrorMessage, Recorded: recordedAt(h, seq), Called: jobs[0].StepName}
}

// replayEnd compares the end the replay came to with the run's.
func replayEnd(run *Run, h *History) error {
	switch {
	case run.Status != h.Status:
		why := ""
		if run.Error != nil {
			why = fmt.Sprintf(" (%s: %s)", run.Error.Class, run.Error.Message)
		}
		return &ReplayError{Seq: -1, Recorded: "the run ended " + string(h.Status), Called: "ended " + string(run.Status) + why,
			Message: fmt.Sprintf("the code ends %s%s where the run ended %s", run.Status, why, h.Status)}
	case run.Status == StatusCompleted && !jsonEqual(run.Output, h.Output):
		return &ReplayError{Seq: -1, Recorded: "output " + string(h.Output), Called: "output " + string(run.Output),
			Message: fmt.Sprintf("the code returns %s where the run returned %s", run.Output, h.Output)}
	}
	return nil
}

// recordedAt says what h holds at seq.
func recordedAt(h *History, seq int) string {
	for _, s := range h.Steps {
		if s.Seq == seq {
			return fmt.Sprintf("%s %q", s.Kind, s.Name)
		}
	}
	return "nothing"
}

// waitWhat says what a waiting run waits for.
func waitWhat(run *Run) string {
	if run.AwaitSignal != "" {
		return "for signal " + run.AwaitSignal
	}
	return "for a timer"
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// encodeHistoryError is a step's error as the store keeps it.
func encodeHistoryError(info *ErrorInfo) ([]byte, error) {
	if info == nil {
		return nil, nil
	}
	b, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("%w: a step's error in the history: %v", ErrInvalidArgument, err)
	}
	return b, nil
}
