package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
)

// MaxBulk bounds the runs or dead jobs one bulk action acts on; a filter
// that matches more is acted on in part (BulkResult.More) and may be run
// again.
const MaxBulk = 10_000

// BulkResult is what a bulk action did, or, dry, would do.
type BulkResult struct {
	// Matched counts what the filter matched (at most MaxBulk), Done what
	// the action applied to, Skipped what had changed meanwhile (a run that
	// finished, a dead job resolved another way): not errors.
	Matched int `json:"matched"`
	Done    int `json:"done"`
	Skipped int `json:"skipped"`
	// More: the filter matched more than MaxBulk; run the action again.
	More   bool `json:"more"`
	DryRun bool `json:"dry_run"`
}

// CancelRunsParams is one CancelRuns call: the runs to cancel, and
// whether only to count them.
type CancelRunsParams struct {
	// Filter selects the runs (see CancelRuns for what it must set).
	Filter ListRunsParams
	// DryRun counts what would be cancelled and cancels nothing.
	DryRun bool
}

// CancelRuns cancels every run p.Filter matches that is still active
// (pending, running, waiting; see Cancel), at most MaxBulk of them, one
// Cancel each; with p.DryRun it only counts them. Filter.Status, when set,
// must be pending, running, waiting or StatusOpenRuns (all three;
// ErrInvalidArgument otherwise, for
// compensating too: such a run is ending already, and Cancel changes
// nothing for it); Filter.Limit and Filter.Cursor are ignored. It must filter: by
// Workflow, WorkflowIDPrefix, Tags, CreatedAfter or CreatedBefore
// (ErrInvalidArgument otherwise: an empty filter would cancel every run;
// CreatedBefore now names them all on purpose). Runs that finished
// meanwhile, and runs whose cancellation was requested before (by another
// bulk cancel running at once, say), are skipped: Done counts the runs
// this call cancelled. Runs move between statuses while they are listed
// (a retrying step's run waits out its backoff, then runs again), so it
// lists them again after acting, and acts on the ones it had not seen, up
// to maxBulkRounds times. Errors: ErrInvalidArgument (a bad filter), or the
// first failure (the result counts what was done before it).
func (e *Engine) CancelRuns(ctx context.Context, params CancelRunsParams) (BulkResult, error) {
	p, dryRun := params.Filter, params.DryRun
	if p.Status == StatusOpenRuns {
		p.Status = "" // every status a cancel acts on
	}
	statuses := []RunStatus{StatusPending, StatusRunning, StatusWaiting}
	if p.Status != "" && !slices.Contains(statuses, p.Status) {
		why := ""
		if p.Status == StatusCompensating {
			why = " (a compensating run is undoing its steps already: cancelling it changes nothing)"
		}
		return BulkResult{}, fmt.Errorf("%w: a bulk cancel takes a status of pending, running or waiting, not %q%s", ErrInvalidArgument, p.Status, why)
	}
	if p.Workflow == "" && p.WorkflowIDPrefix == "" && p.CreatedAfter.IsZero() && p.CreatedBefore.IsZero() && len(p.Tags) == 0 {
		return BulkResult{}, fmt.Errorf("%w: a bulk cancel needs a filter: a workflow, a workflow ID prefix, tags or a creation time "+
			"(CreatedBefore: now names every run there is)", ErrInvalidArgument)
	}
	if p.Status != "" {
		statuses = []RunStatus{p.Status}
	}
	act := func(id uuid.UUID) error {
		switch requested, err := e.cancel(ctx, nil, id); {
		case err != nil:
			return err
		case !requested:
			return errCancelledBefore // by a concurrent bulk cancel, say: not this call's
		}
		e.noteCancelled([]uuid.UUID{id})
		return nil
	}
	// A status is listed after another, so a run that moved from one not
	// listed yet to one listed already (a retrying step's run goes from
	// waiting to running and back) is in neither list: each round lists
	// them again and acts on the runs it had not seen, until one finds
	// none (an attack pass's bulk cancel of 40 retrying runs found 35).
	res := BulkResult{DryRun: dryRun}
	seen := map[uuid.UUID]bool{}
	for range maxBulkRounds {
		var ids []uuid.UUID
		more := false
		for _, s := range statuses {
			q := p
			q.Status, q.Limit = s, 1000
			m, err := collectPages(&ids, func(cursor string) ([]uuid.UUID, string, error) {
				q.Cursor = cursor
				runs, next, err := e.ListRuns(ctx, q)
				page := make([]uuid.UUID, len(runs))
				for i, r := range runs {
					page[i] = r.RunID
				}
				return page, next, err
			})
			if err != nil {
				return res, err
			}
			if e.afterBulkList != nil {
				e.afterBulkList(s)
			}
			if more = m; more {
				break
			}
		}
		// A run listed under two statuses, or in an earlier round,
		// counts once.
		slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
		ids = slices.DeleteFunc(slices.Compact(ids), func(id uuid.UUID) bool { return seen[id] })
		if len(ids) == 0 {
			break
		}
		for _, id := range ids {
			seen[id] = true
		}
		if room := MaxBulk - res.Matched; len(ids) > room {
			ids, more = ids[:room], true
		}
		r, err := bulk(ids, more, dryRun, nil, act, ErrRunClosed, errCancelledBefore)
		res.Matched, res.Done, res.Skipped, res.More = res.Matched+r.Matched, res.Done+r.Done, res.Skipped+r.Skipped, r.More
		if err != nil || res.More || res.Matched >= MaxBulk {
			return res, err
		}
	}
	return res, nil
}

// maxBulkRounds bounds the rounds of a bulk cancel's listing (see
// CancelRuns): a run seen moving in each of them is left to the next call.
const maxBulkRounds = 4

// errCancelledBefore skips, in a bulk cancel, a run whose cancellation was
// requested before.
var errCancelledBefore = errors.New("cancellation requested before")

// ResolveDeadJobsParams is one ReplayDeadJobs or DiscardDeadJobs call:
// the dead jobs to act on, and whether only to count them.
type ResolveDeadJobsParams struct {
	// Filter selects the dead jobs (see ReplayDeadJobs for what it must
	// set).
	Filter ListDeadJobsParams
	// DryRun counts what would be acted on and changes nothing.
	DryRun bool
}

// ReplayDeadJobs replays every open dead job p.Filter matches (see
// ReplayDeadJob), at most MaxBulk; DiscardDeadJobs discards them. With
// p.DryRun they only count them. Filter.OpenOnly is implied; Filter.Limit
// and Filter.Cursor are ignored. The filter must set Workflow, Reason,
// RunID or ParkedBefore (ErrInvalidArgument otherwise: an empty filter
// would act on every open dead job), and opts is checked before anything
// is matched. Jobs resolved meanwhile are skipped.
func (e *Engine) ReplayDeadJobs(ctx context.Context, p ResolveDeadJobsParams, opts *ResolveOpts) (BulkResult, error) {
	if opts != nil && opts.Version != 0 {
		if err := checkReplayVersion(opts.Version); err != nil {
			return BulkResult{}, err
		}
		if p.Filter.Workflow == "" {
			return BulkResult{}, fmt.Errorf("%w: a bulk replay onto workflow version %d needs a workflow filter: versions are per workflow", ErrInvalidArgument, opts.Version)
		}
		// As each replay will check it, against this engine's queue, so a
		// dry run refuses what the real one would.
		if err := e.checkServedOn(ctx, e.db, e.cfg.Queue, p.Filter.Workflow, opts.Version); err != nil {
			return BulkResult{}, err
		}
	}
	return e.resolveDeadJobs(ctx, p.Filter, opts, p.DryRun, func(id uuid.UUID) error { _, err := e.ReplayDeadJob(ctx, id, opts); return err })
}

// DiscardDeadJobs is ReplayDeadJobs that discards.
func (e *Engine) DiscardDeadJobs(ctx context.Context, p ResolveDeadJobsParams, opts *ResolveOpts) (BulkResult, error) {
	if opts != nil && opts.Version != 0 {
		return BulkResult{}, errDiscardVersion
	}
	return e.resolveDeadJobs(ctx, p.Filter, opts, p.DryRun, func(id uuid.UUID) error { _, err := e.DiscardDeadJob(ctx, id, opts); return err })
}

func (e *Engine) resolveDeadJobs(ctx context.Context, p ListDeadJobsParams, opts *ResolveOpts, dryRun bool, act func(uuid.UUID) error) (BulkResult, error) {
	if p.Workflow == "" && p.Reason == "" && p.RunID == uuid.Nil && p.ParkedBefore.IsZero() {
		return BulkResult{}, fmt.Errorf("%w: a bulk replay or discard needs a filter: a workflow, a reason, a run or a parking time "+
			"(ParkedBefore: now names every open dead job on purpose)", ErrInvalidArgument)
	}
	if opts != nil {
		// Checked before anything is matched, so a dry run refuses what
		// the real one would.
		if err := checkFreeText("by", opts.By, 200); err != nil {
			return BulkResult{}, err
		}
		maxNote := 4000
		if opts.Version != 0 {
			maxNote -= versionNoteRoom
		}
		if err := checkFreeText("note", opts.Note, maxNote); err != nil {
			return BulkResult{}, err
		}
	}
	p.OpenOnly, p.Limit = true, 1000
	var ids []uuid.UUID
	more, err := collectPages(&ids, func(cursor string) ([]uuid.UUID, string, error) {
		p.Cursor = cursor
		jobs, next, err := e.ListDeadJobs(ctx, p)
		page := make([]uuid.UUID, len(jobs))
		for i, j := range jobs {
			page[i] = j.ID
		}
		return page, next, err
	})
	return bulk(ids, more, dryRun, err, act, ErrDeadJobResolved)
}

// collectPages appends the IDs of page after page (from cursor "") to
// ids until the last page or until ids holds more than MaxBulk, and says
// whether it stopped for MaxBulk.
func collectPages(ids *[]uuid.UUID, page func(cursor string) ([]uuid.UUID, string, error)) (more bool, err error) {
	cursor := ""
	for {
		got, next, err := page(cursor)
		if err != nil {
			return false, err
		}
		*ids = append(*ids, got...)
		if len(*ids) > MaxBulk {
			return true, nil
		}
		if next == "" {
			return false, nil
		}
		cursor = next
	}
}

// bulk applies act to at most MaxBulk of ids (none when dry, or after a
// collection error err), counting an error that is skipped (the thing
// changed meanwhile: it, or ErrNotFound) apart from a failure, which ends
// it.
func bulk(ids []uuid.UUID, more, dryRun bool, err error, act func(uuid.UUID) error, skipped ...error) (BulkResult, error) {
	res := BulkResult{DryRun: dryRun}
	if err != nil {
		return res, err
	}
	if len(ids) > MaxBulk {
		ids, more = ids[:MaxBulk], true
	}
	res.Matched, res.More = len(ids), more
	if dryRun {
		return res, nil
	}
	for _, id := range ids {
		switch err := act(id); {
		case slices.ContainsFunc(skipped, func(s error) bool { return errors.Is(err, s) }) || errors.Is(err, ErrNotFound):
			res.Skipped++
		case err != nil:
			return res, err
		default:
			res.Done++
		}
	}
	return res, nil
}
