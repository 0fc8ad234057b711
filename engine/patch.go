package engine

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Patched reports whether the run takes the new code of the change named
// changeID, so a deploy can change a workflow under runs that are in
// flight (Temporal's Patched). Write the change as
//
//	if engine.Patched(ctx, "fraud-check") {
//		// the new code
//	} else {
//		// the code as it was
//	}
//
// A run that reaches this point for the first time takes the new code
// (true) and records that it did on the record of its next step: the
// step's Patches (StepInfo.Patches) name the change. A run replaying its
// records finds at this position either a record that names the change
// (true again) or one that the code before the change wrote (false: the
// run passed this point before the deploy and replays the old code). A
// run that has not come this far yet takes the new code when it does; one
// whose delivery ended between Patched and its next step finds the
// position empty and takes the new code again.
//
// The change costs nothing: no row and no round trip of its own, only
// its ID on a record written anyway. Before a parallel step (Go, GoTx),
// whose record is written apart, it is recorded as a marker of its own (a
// step of kind "patch" named changeID), as every change was before
// version 28 of the schema; such markers are replayed as they were.
// Changes show in a run's steps (CLI, HTTP API, web UI) and filter runs
// (ListRunsParams.Patched, Unpatched). changeID names one change: 1 to 200
// bytes of UTF-8, no control or invisible characters, no white space at
// either end (a step name's rules). An invalid one panics, on every
// delivery alike: the run is parked as a panic naming the rule, never
// given two answers.
//
// Once no run that took the old code remains, delete the old code and
// replace Patched with DeprecatePatch (or simply delete the call: only
// runs that recorded a marker of their own need DeprecatePatch to replay
// it).
//
// After the run's cancellation, Patched returns true and records nothing,
// as the steps after it do not start. It must be called from the
// workflow's own goroutine, not inside a step.
func Patched(ctx *Context, changeID string) bool {
	mustChangeID("Patched", changeID)
	d := ctx.d
	next := d.pos.next
	rec := d.pos.at(next)
	if d.cancelRequested.Load() && (rec == nil || rec.Kind == string(KindCompensation)) {
		return true // as a step not started: nothing recorded (see runStep)
	}
	if isMarker(rec, changeID) {
		// A marker of its own: the position is the marker's.
		if _, err := d.enterStep("patch", changeID, false); err != nil {
			return true
		}
		d.inStep.Store(false)
		d.e.obs.StepReplayed(StepReplayedEvent{Workflow: d.wf.name, Kind: KindPatch})
		return true
	}
	if rec != nil {
		took := tookChange(rec, changeID)
		if took {
			d.e.obs.StepReplayed(StepReplayedEvent{Workflow: d.wf.name, Kind: KindPatch})
		}
		return took
	}
	if d.pos.replaying() {
		// A hole a parallel step of the code before the change left (a
		// parallel step after a change follows a marker of its own).
		return false
	}
	if d.ended {
		return true // nothing more is recorded; the next step learns why
	}
	d.pendPatch(next, changeID)
	d.e.obs.StepAttempt(StepAttemptEvent{Workflow: d.wf.name, Step: changeID, Kind: KindPatch, Attempt: 1, Outcome: "completed"})
	return true
}

// markPendingPatches writes the changes pending for the next position as
// markers of their own, one position each, before a parallel step takes
// the position after them: its record is written apart, and a crash could
// leave later records without it, where a replay would read the run as
// one that took the old code. False when the delivery ended.
func (d *delivery) markPendingPatches() bool {
	if len(d.patchIDs) == 0 || d.patchNext != d.pos.next {
		d.patchIDs = nil
		return true
	}
	ids := d.patchIDs
	d.patchIDs = nil
	for _, id := range ids {
		seq, err := d.enterStep("patch", id, false)
		if err != nil {
			return false
		}
		d.inStep.Store(false)
		if !d.flush() { // the buffer holds one record: the previous one goes first
			return false
		}
		now := d.e.now()
		// Not Fresh: written before the parallel step starts (flushStarted).
		d.buf.pending = &store.StepRecord{Seq: seq, Name: id, Kind: string(KindPatch), Status: store.StepCompleted,
			Attempts: 1, StartedAt: now, CompletedAt: &now, Output: patchedOutput}
	}
	return true
}

// DeprecatePatch marks the change changeID as done: its old code is gone,
// and the code that Patched(ctx, changeID) guarded runs unconditionally.
// A run that recorded a marker of its own for the change (see Patched)
// replays it here; any other run records nothing. Delete the call once no
// run with such a marker remains. An invalid changeID panics, as in
// Patched.
func DeprecatePatch(ctx *Context, changeID string) {
	mustChangeID("DeprecatePatch", changeID)
	d := ctx.d
	if !d.pos.replaying() || !isMarker(d.pos.at(d.pos.next), changeID) {
		return
	}
	if _, err := d.enterStep("patch", changeID, false); err != nil {
		return
	}
	d.inStep.Store(false)
	d.e.obs.StepReplayed(StepReplayedEvent{Workflow: d.wf.name, Kind: KindPatch})
}

// tookChange reports whether rec names changeID among its patches.
func tookChange(rec *store.StepRecord, changeID string) bool {
	return rec.Patches != nil && slices.Contains(strings.Split(*rec.Patches, "\n"), changeID)
}

// patchedOutput is a marker's recorded output.
var patchedOutput = []byte("true")

// isMarker reports whether rec is the marker of changeID.
func isMarker(rec *store.StepRecord, changeID string) bool {
	return rec != nil && rec.Kind == string(KindPatch) && rec.Name == changeID
}

// mustChangeID panics when id breaks a step name's rules: a programming
// error that must give the same outcome on every delivery (the run parked
// as a panic), which returning an answer without a record could not.
func mustChangeID(fn, id string) {
	if err := checkName("change ID", id, 200); err != nil {
		panic(fmt.Sprintf("pgdurable: %s: %v", fn, err))
	}
}
