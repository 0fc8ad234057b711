package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/maintenance"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// DeadJob is a run parked for an operator, with what they need to decide:
// the original input, where and how it failed, and how it was resolved.
type DeadJob struct {
	ID              uuid.UUID       `json:"id"`
	RunID           uuid.UUID       `json:"run_id"`
	WorkflowName    string          `json:"workflow"`
	WorkflowID      string          `json:"workflow_id"`
	WorkflowVersion int             `json:"workflow_version"`
	Input           json.RawMessage `json:"input"` // the run's original input
	Reason          DeadReason      `json:"reason"`
	StepName        string          `json:"step,omitempty"` // the failing step, "" when not in a step
	Seq             *int            `json:"seq,omitempty"`
	Attempts        int             `json:"attempts"`   // attempts of the failing step; for crash_loop, the deliveries that died in a row
	Deliveries      int             `json:"deliveries"` // the run's deliveries when it was parked, the parking one included
	FirstFailedAt   time.Time       `json:"first_failed_at"`
	LastFailedAt    time.Time       `json:"last_failed_at"`
	ErrorClass      ErrorClass      `json:"error_class"`
	ErrorMessage    string          `json:"error_message"`
	Stack           string          `json:"stack,omitempty"`
	// ForwardError, for compensation_failed, is the failure that started
	// the compensation (ErrorMessage is the undo's).
	ForwardError *ErrorInfo `json:"forward_error,omitempty"`
	// ChildRunID and ChildDeadJobID, for child_dead, are the child run the
	// workflow waits for and the child's dead job: replaying either dead
	// job replays both.
	ChildRunID     *uuid.UUID `json:"child_run_id,omitempty"`
	ChildDeadJobID *uuid.UUID `json:"child_dead_job_id,omitempty"`
	// ParentRunID and ParentDeadJobID, set by GetDeadJob on an open dead
	// job of a child run, are the parent parked waiting for it (reason
	// child_dead) and the parent's dead job: replaying this dead job
	// replays that one too.
	ParentRunID     *uuid.UUID `json:"parent_run_id,omitempty"`
	ParentDeadJobID *uuid.UUID `json:"parent_dead_job_id,omitempty"`
	ParkedAt        time.Time  `json:"parked_at"`
	ResolvedAt      *time.Time `json:"resolved_at,omitempty"`
	Resolution      string     `json:"resolution,omitempty"` // "", "replayed" or "discarded"
	ResolvedBy      string     `json:"resolved_by,omitempty"`
	Note            string     `json:"note,omitempty"`
}

func deadJobFromRow(d *store.DeadJobRow) *DeadJob {
	return &DeadJob{
		ID: d.ID, RunID: d.RunID, WorkflowName: d.WorkflowName, WorkflowID: d.WorkflowID,
		WorkflowVersion: d.WorkflowVersion, Input: d.Input, Reason: DeadReason(d.Reason), StepName: deref(d.StepName),
		Seq: d.Seq, Attempts: d.Attempts, FirstFailedAt: d.FirstFailedAt, LastFailedAt: d.LastFailedAt,
		ErrorClass: ErrorClass(d.ErrorClass), ErrorMessage: d.ErrorMessage, Stack: deref(d.Stack), ParkedAt: d.ParkedAt,
		ResolvedAt: d.ResolvedAt, Resolution: deref(d.Resolution), ResolvedBy: deref(d.ResolvedBy), Note: deref(d.Note),
		Deliveries: d.Deliveries, ForwardError: decodeErrorInfo(d.ForwardError),
		ChildRunID: d.ChildRunID, ChildDeadJobID: d.ChildDeadJobID,
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// ListDeadJobsParams filters ListDeadJobs. Zero fields match everything.
type ListDeadJobsParams struct {
	Workflow string
	Reason   DeadReason
	RunID    uuid.UUID // uuid.Nil: any run
	OpenOnly bool      // only jobs not yet replayed or discarded
	// ParkedBefore keeps the jobs parked before it (zero: no bound), to the
	// millisecond, through the IDs' order (UUID v7): a bulk action pins
	// it to its dry run's time, so that it acts on no job parked since.
	ParkedBefore time.Time
	Limit        int    // 1..1000, default 50
	Cursor       string // the nextCursor the previous page's ListDeadJobs returned
}

// ListDeadJobs returns dead jobs newest first, and the next page's cursor
// ("" on the last page).
func (e *Engine) ListDeadJobs(ctx context.Context, p ListDeadJobsParams) (jobs []*DeadJob, nextCursor string, err error) {
	limit, before, err := pageParams(p.Limit, p.Cursor)
	if err != nil {
		return nil, "", err
	}
	if p.Reason != "" && !p.Reason.valid() {
		return nil, "", fmt.Errorf("%w: unknown dead-job reason %q", ErrInvalidArgument, p.Reason)
	}
	if err := checkFilter("workflow", p.Workflow); err != nil {
		return nil, "", err
	}
	if !p.ParkedBefore.IsZero() {
		if floor := store.UUIDFloor(p.ParkedBefore); before == nil || bytes.Compare(floor[:], before[:]) < 0 {
			before = &floor
		}
	}
	f := store.DeadJobFilter{Workflow: p.Workflow, Reason: string(p.Reason), OpenOnly: p.OpenOnly, Before: before, Limit: limit + 1}
	if p.RunID != uuid.Nil {
		f.RunID = &p.RunID
	}
	rows, err := store.ListDeadJobs(ctx, e.db, f)
	if err != nil {
		return nil, "", fmt.Errorf("pgdurable: %w", err)
	}
	for i, r := range rows {
		if i == limit {
			nextCursor = jobs[limit-1].ID.String()
			break
		}
		jobs = append(jobs, deadJobFromRow(r))
	}
	return jobs, nextCursor, nil
}

// GetDeadJob reads one dead job; ErrNotFound when there is none. For an
// open dead job of a child run it also names the parent parked waiting
// for that child, if any (DeadJob.ParentDeadJobID).
func (e *Engine) GetDeadJob(ctx context.Context, id uuid.UUID) (*DeadJob, error) {
	d, err := store.GetDeadJob(ctx, e.db, id, false)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: dead job %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("pgdurable: reading dead job %s: %w", id, err)
	}
	j := deadJobFromRow(d)
	if d.Resolution == nil {
		up, err := store.RunParent(ctx, e.db, d.RunID)
		parent := up.Parent
		if err == nil && parent != nil {
			j.ParentDeadJobID, err = store.ParentParkedOn(ctx, e.db, *parent, d.RunID)
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("pgdurable: reading dead job %s: %w", id, err)
		}
		if j.ParentDeadJobID != nil {
			j.ParentRunID = parent
		}
	}
	return j, nil
}

// ResolveOpts records who resolved a dead job and why (both optional),
// and, for a replay, onto which workflow version.
type ResolveOpts struct {
	By   string // an operator's name or a tool's
	Note string
	// Version, for a replay, moves the dead job's run to this version of
	// its workflow before it runs again (0: it stays on its own): the
	// repair of a run parked as nondeterminism by a deploy, once a
	// version whose code replays its steps (the old code behind Patched)
	// is registered. The run replays its recorded steps through that
	// version's code. A version that no live engine process on the run's
	// queue registers is refused (ErrInvalidArgument, naming the versions
	// that are), so a mistyped one cannot strand the run; and a replay
	// again of a replayed job with another version than its run's is
	// ErrDeadJobResolved. Linked runs a replay reaches (a parent parked
	// for this child, a dead child) keep their own versions. The
	// resolution's note records the move ("replayed onto version 2 (was
	// 1)"). Negative, or set for a discard, is ErrInvalidArgument.
	Version int
}

// ReplayDeadJob re-enqueues a dead run: every recorded step stays recorded
// (their functions do not run again), and the step that failed gets a
// fresh retry budget. The dead job is closed as replayed, with by and note.
//
// Parents and children are replayed together: a run parked because a
// child it waits for is dead (reason child_dead) is replayed with the
// child's open dead job, and a child's replay replays the open child_dead
// dead job of the parent waiting for it, so the parent goes on waiting and
// takes the child's outcome. A child of policy cancel or wait whose parent
// has closed (the parent did not wait for it, or was cancelled or
// terminated) is replayed cancelled: its unfinished forward steps are
// recorded cancelled without another attempt (an activity whose outcome
// was unknown is not called again: check it by its request ID), its undos
// run, and it ends cancelled.
//
// Replay is idempotent: replaying an already replayed job changes nothing
// and enqueues nothing. Errors: ErrDeadJobResolved for a discarded job;
// for an id that is not a dead job's but a run's (without an open dead
// job), the run's status, as Cancel reports it: ErrRunClosed when it
// finished (completed, failed, compensated, cancelled, continued,
// terminated, or dead with its dead job resolved), ErrRunNotFinished when
// it is still pending, running, waiting or compensating; ErrNotFound when
// id is neither, or is the ID of a run whose open dead job has another ID
// (the error names that dead job's ID).
func (e *Engine) ReplayDeadJob(ctx context.Context, id uuid.UUID, opts *ResolveOpts) (*DeadJob, error) {
	if opts == nil {
		opts = &ResolveOpts{}
	}
	if err := checkReplayVersion(opts.Version); err != nil {
		return nil, err
	}
	return e.resolveDeadJob(ctx, id, "replayed", opts, func(ctx context.Context, tx pgx.Tx, d *store.DeadJobRow) error {
		if opts.Version != 0 {
			if err := e.checkVersionServed(ctx, tx, d.RunID, d.WorkflowName, opts.Version); err != nil {
				return err
			}
			from, err := store.MoveRunToVersion(ctx, e.on(tx), d.RunID, opts.Version)
			if err != nil {
				return fmt.Errorf("moving run %s to version %d: %w", d.RunID, opts.Version, err)
			}
			if from != opts.Version {
				e.log.Info("dead job's run moved to another workflow version for its replay", "run_id", d.RunID,
					"dead_job_id", d.ID, "workflow_version", opts.Version, "was_version", from)
			}
		}
		return e.replayLinked(ctx, tx, d, opts)
	})
}

// errDiscardVersion refuses ResolveOpts.Version on a discard.
var errDiscardVersion = fmt.Errorf("%w: a discard does not run the job again: a version is for a replay", ErrInvalidArgument)

// versionNoteRoom is what a replay onto a version adds to its note
// ("replayed onto version N (was M). "), at most.
const versionNoteRoom = 64

// checkReplayVersion checks ResolveOpts.Version for a replay.
func checkReplayVersion(v int) error {
	if v < 0 || v > math.MaxInt32 {
		return fmt.Errorf("%w: replay onto workflow version %d: a version is 1 to %d (0 keeps the run's own)", ErrInvalidArgument, v, math.MaxInt32)
	}
	return nil
}

// checkVersionServed refuses to move run runID, of workflow name, to
// version when no live engine process on its queue registers that
// version: a mistyped version would leave the run waiting for a process
// that never comes, and its dead job resolved.
func (e *Engine) checkVersionServed(ctx context.Context, tx pgx.Tx, runID uuid.UUID, name string, version int) error {
	run, err := store.RunVersionOf(ctx, e.on(tx), runID)
	if err != nil {
		return fmt.Errorf("reading run %s: %w", runID, err)
	}
	if run.Version == version {
		return nil
	}
	return e.checkServedOn(ctx, e.on(tx), run.Queue, name, version)
}

// checkServedOn is checkVersionServed's check of the live processes on
// queue: one registers version of workflow name, and none moves its runs
// above it (AutoUpgrade). ErrInvalidArgument otherwise.
func (e *Engine) checkServedOn(ctx context.Context, db store.DBTX, queue, name string, version int) error {
	live, err := liveVersionsOf(ctx, db, queue, name)
	if err != nil {
		return err
	}
	switch {
	case live.upTo > version:
		return fmt.Errorf("%w: a live engine process on queue %q moves the runs of workflow %q up to version %d (WorkflowOpts.AutoUpgrade): "+
			"a replay onto version %d would not stay there; replay onto %d", ErrInvalidArgument, queue, name, live.upTo, version, live.upTo)
	case slices.Contains(live.versions, version):
		return nil
	}
	registered := "none does"
	if len(live.versions) > 0 {
		registered = fmt.Sprintf("they register %v", live.versions)
	}
	return fmt.Errorf("%w: no live engine process on queue %q registers workflow %q version %d (%s): "+
		"start one that does, then replay onto it", ErrInvalidArgument, queue, name, version, registered)
}

// liveVersions is what the live engine processes on a queue do with the
// runs of one workflow: the versions they register (ascending), and the
// highest version any of them moves runs up to (WorkflowOpts.AutoUpgrade;
// 0 for none).
type liveVersions struct {
	versions []int
	upTo     int
}

// serves reports whether a run of version v gets a delivery from one of
// the processes: one registers v, or moves v up.
func (l liveVersions) serves(v int) bool { return slices.Contains(l.versions, v) || l.upTo > v }

// liveVersionsOf reads the process registry for what the live processes
// on queue do with workflow name's runs.
func liveVersionsOf(ctx context.Context, db store.DBTX, queue, name string) (liveVersions, error) {
	procs, err := store.LiveProcesses(ctx, db, maintenance.ProcessLive)
	if err != nil {
		return liveVersions{}, err
	}
	var l liveVersions
	for _, p := range procs {
		if p.Queue != queue {
			continue
		}
		for _, w := range p.Workflows {
			if w.Name != name {
				continue
			}
			if w.AutoUpgrade {
				l.upTo = max(l.upTo, w.Version)
			}
			if !slices.Contains(l.versions, w.Version) {
				l.versions = append(l.versions, w.Version)
			}
		}
	}
	slices.Sort(l.versions)
	return l, nil
}

// replayLinked replays the run of the dead job d (closed by the caller),
// then the open dead jobs linked to it: down the child_dead links to the
// dead child, and up to each parent parked for this run.
func (e *Engine) replayLinked(ctx context.Context, tx pgx.Tx, d *store.DeadJobRow, opts *ResolveOpts) error {
	if err := e.replayRun(ctx, tx, d.RunID); err != nil {
		return err
	}
	for down := d; down.Reason == string(ReasonChildDead) && down.ChildRunID != nil; {
		child, err := store.GetDeadJob(ctx, e.on(tx), derefID(down.ChildDeadJobID), true)
		if errors.Is(err, store.ErrNotFound) || err == nil && child.Resolution != nil {
			break // discarded (or gone): the parent takes the child's death
		}
		if err != nil {
			return err
		}
		if err := e.closeLinked(ctx, tx, child, down, opts); err != nil {
			return err
		}
		down = child
	}
	for up := d.RunID; ; {
		res, err := store.RunParent(ctx, e.on(tx), up)
		if err != nil || res.Parent == nil {
			return err
		}
		parent := res.Parent
		job, err := store.OpenChildDeadJob(ctx, e.on(tx), *parent, up)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := e.closeLinked(ctx, tx, job, d, opts); err != nil {
			return err
		}
		up = *parent
	}
}

// closeLinked closes the dead job j as replayed along with the dead job
// by (the one the operator replayed, or its neighbour), and replays its run.
func (e *Engine) closeLinked(ctx context.Context, tx pgx.Tx, j, by *store.DeadJobRow, opts *ResolveOpts) error {
	note := fmt.Sprintf("replayed with dead job %s of run %s", by.ID, by.RunID)
	if opts.Note != "" {
		note += ": " + opts.Note
	}
	if _, err := store.ResolveDeadJob(ctx, e.on(tx), store.ResolveDeadJobParams{ID: j.ID, Resolution: "replayed", By: opts.By, Note: note}); err != nil {
		return err
	}
	e.log.Info("dead job resolved", "dead_job_id", j.ID, "run_id", j.RunID, "resolution", "replayed", "with", by.ID)
	return e.replayRun(ctx, tx, j.RunID)
}

// replayRun moves the dead run runID back to pending and enqueues it,
// cancelled when it is a child of policy cancel or wait whose parent has
// closed (see ReplayDeadJob).
func (e *Engine) replayRun(ctx context.Context, tx pgx.Tx, runID uuid.UUID) error {
	up, err := store.RunParent(ctx, e.on(tx), runID)
	if err != nil {
		return fmt.Errorf("reading run %s: %w", runID, err)
	}
	parent, policy := up.Parent, up.ClosePolicy
	orphaned := false
	if parent != nil && ParentClosePolicy(policy) != ParentCloseAbandon {
		status, err := store.RunStatusOf(ctx, e.on(tx), *parent)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("reading parent run %s: %w", *parent, err)
		}
		orphaned = err != nil || RunStatus(status).closed() // a pruned parent closed long ago
	}
	if _, err := store.ReplayRun(ctx, e.on(tx), runID, orphaned, e.now()); err != nil {
		return fmt.Errorf("reopening run %s: %w", runID, err)
	}
	if orphaned {
		e.log.Info("replaying a child whose parent has closed: it is cancelled and runs its undos", "run_id", runID, "parent_run_id", *parent)
	}
	return e.queue.Enqueue(ctx, tx, runID, time.Time{})
}

func derefID(id *uuid.UUID) uuid.UUID {
	if id == nil {
		return uuid.Nil
	}
	return *id
}

// DiscardDeadJob closes a dead job without running it again; the run stays
// dead. Idempotent like ReplayDeadJob; ErrDeadJobResolved for a replayed
// job; the errors of ReplayDeadJob for an id that is a run's.
func (e *Engine) DiscardDeadJob(ctx context.Context, id uuid.UUID, opts *ResolveOpts) (*DeadJob, error) {
	if opts != nil && opts.Version != 0 {
		return nil, errDiscardVersion
	}
	return e.resolveDeadJob(ctx, id, "discarded", opts, func(ctx context.Context, tx pgx.Tx, d *store.DeadJobRow) error {
		return store.MarkRunDiscarded(ctx, e.on(tx), d.RunID)
	})
}

func (e *Engine) resolveDeadJob(ctx context.Context, id uuid.UUID, resolution string, opts *ResolveOpts,
	apply func(context.Context, pgx.Tx, *store.DeadJobRow) error) (*DeadJob, error) {
	if opts == nil {
		opts = &ResolveOpts{}
	}
	if err := checkText("by", opts.By, 0, 200); err != nil {
		return nil, err
	}
	maxNote := 4000
	if opts.Version != 0 {
		maxNote -= versionNoteRoom // the note records the move too
	}
	if err := checkFreeText("note", opts.Note, maxNote); err != nil {
		return nil, err
	}
	verb := map[string]string{"replayed": "replay", "discarded": "discard"}[resolution]
	var out *store.DeadJobRow
	err := e.inTx(ctx, nil, func(tx pgx.Tx) error {
		// A replay may reach the dead jobs of a run's parents and children,
		// and a discard races it: each takes its family's root run row
		// first, so two of them on one family (from either end) wait for
		// each other instead of locking dead jobs and runs in opposite
		// orders.
		if err := e.lockFamily(ctx, tx, id); err != nil {
			return err
		}
		d, err := store.GetDeadJob(ctx, e.on(tx), id, true) // locks the row: concurrent resolves serialise
		if errors.Is(err, store.ErrNotFound) {
			return notADeadJob(ctx, e.on(tx), id, verb)
		}
		if err != nil {
			return err
		}
		if d.Resolution != nil {
			out = d
			if *d.Resolution != resolution {
				return fmt.Errorf("%w: dead job %s was %s", ErrDeadJobResolved, id, *d.Resolution)
			}
			if opts.Version != 0 {
				// A replay again is a no-op, unless it asks for another
				// version than the run has: say so rather than ignore it.
				now, err := store.RunVersionOf(ctx, e.on(tx), d.RunID)
				if err == nil && now.Version != opts.Version {
					return fmt.Errorf("%w: dead job %s was replayed already, and its run is on version %d: a replay does not move it again",
						ErrDeadJobResolved, id, now.Version)
				}
			}
			return nil
		}
		note := opts.Note
		if opts.Version != 0 && d.WorkflowVersion != opts.Version {
			note = strings.TrimSpace(fmt.Sprintf("replayed onto version %d (was %d). %s", opts.Version, d.WorkflowVersion, note))
		}
		if _, err := store.ResolveDeadJob(ctx, e.on(tx), store.ResolveDeadJobParams{ID: id, Resolution: resolution, By: opts.By, Note: note}); err != nil {
			return err
		}
		if err := apply(ctx, tx, d); err != nil {
			return err
		}
		out, err = store.GetDeadJob(ctx, e.on(tx), id, false)
		return err
	})
	switch {
	case errors.As(err, new(*runNotJobError)):
		return nil, err
	case errors.Is(err, store.ErrNotFound):
		return nil, fmt.Errorf("%w: dead job %s", ErrNotFound, id)
	case errors.Is(err, ErrDeadJobResolved):
		return deadJobFromRow(out), err
	case errors.Is(err, ErrRunClosed), errors.Is(err, ErrRunNotFinished):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("pgdurable: %s dead job %s: %w", map[string]string{"replayed": "replaying", "discarded": "discarding"}[resolution], id, err)
	}
	e.log.Info("dead job resolved", "dead_job_id", id, "run_id", out.RunID, "resolution", resolution, "resolved_by", opts.By)
	return deadJobFromRow(out), nil
}

// lockFamily locks, in tx, the run row of the root of dead job id's run:
// the ancestor with no parent (the run itself when it has none).
func (e *Engine) lockFamily(ctx context.Context, tx pgx.Tx, id uuid.UUID) error {
	d, err := store.GetDeadJob(ctx, e.on(tx), id, false)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil // no such dead job: the caller says what id is
	case err != nil:
		return err
	}
	return lockFamilyOf(ctx, e.on(tx), d.RunID)
}

// lockFamilyOf locks, in tx, the run row of the root of run runID's
// family: the ancestor with no parent (runID itself when it has none, or
// when runID does not exist). The operator actions that touch a run and
// its dead job (replay, discard, terminate) take it first, so two on one
// family wait for each other instead of locking its runs and dead jobs in
// opposite orders. (Cancel touches the run's row alone.)
func lockFamilyOf(ctx context.Context, tx store.DBTX, runID uuid.UUID) error {
	root := runID
	for range maxFamilyDepth {
		up, err := store.RunParent(ctx, tx, root)
		parent := up.Parent
		if errors.Is(err, store.ErrNotFound) {
			break // no such run: its action says so next
		}
		if err != nil {
			return err
		}
		if parent == nil {
			break
		}
		if _, err := store.RunStatusOf(ctx, tx, *parent); errors.Is(err, store.ErrNotFound) {
			break // a pruned ancestor: the oldest left is the root
		} else if err != nil {
			return err
		}
		root = *parent
	}
	return store.LockRun(ctx, tx, root)
}

// maxFamilyDepth bounds how far lockFamily walks up a run's ancestry.
const maxFamilyDepth = 100

// notADeadJob is the error for id, which is no dead job's ID, given to
// verb (replay, discard) a dead job: when id is a run's without an open
// dead job, the run's status, as Cancel reports it (ErrRunClosed, or
// ErrRunNotFinished for a run still going); else store.ErrNotFound.
func notADeadJob(ctx context.Context, db store.DBTX, id uuid.UUID, verb string) error {
	run, err := store.GetRunDeadJob(ctx, db, id)
	switch {
	case err != nil:
		return err // ErrNotFound: no run either
	case run.OpenJob != nil:
		// A run's ID; its open dead job has its own, which the error names
		// so the caller can act on it.
		return &runNotJobError{runID: id, jobID: *run.OpenJob}
	}
	what := fmt.Sprintf("run %s is %s and has no open dead job to %s", id, run.Status, verb)
	if RunStatus(run.Status).active() {
		return fmt.Errorf("%w: %s", ErrRunNotFinished, what)
	}
	return fmt.Errorf("%w: %s", ErrRunClosed, what)
}

// runNotJobError is ErrNotFound for a run's ID given where a dead job's
// was expected, naming the run's open dead job.
type runNotJobError struct{ runID, jobID uuid.UUID }

func (e *runNotJobError) Error() string {
	return fmt.Sprintf("%v: dead job %s: that is a run's ID, and its open dead job is %s", ErrNotFound, e.runID, e.jobID)
}
func (e *runNotJobError) Unwrap() error { return ErrNotFound }

// checkFreeText validates an operator's text (a note): at most max
// bytes of UTF-8 without control characters other than newlines and tabs,
// and without bidi controls or line separators (see misleading).
func checkFreeText(what, v string, max int) error {
	switch {
	case len(v) > max:
		return fmt.Errorf("%w: %s is %d bytes, over %d", ErrInvalidArgument, what, len(v), max)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidArgument, what)
	case strings.ContainsFunc(v, func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' }):
		return fmt.Errorf("%w: %s contains a control character", ErrInvalidArgument, what)
	case strings.ContainsFunc(v, misleading):
		return fmt.Errorf("%w: %s contains a bidi control or a line separator (U+202A to U+202E, U+2066 to U+2069, U+2028, U+2029)", ErrInvalidArgument, what)
	}
	return nil
}
