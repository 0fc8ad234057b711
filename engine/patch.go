package engine

import (
	"fmt"

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
// A run that reaches this point for the first time records a marker, a
// step of kind "patch" named changeID, at this position, and takes the new
// code: true. A run replaying its records finds either that marker (true
// again) or a record the code before the change wrote here: the run
// passed this point before the deploy, and replays the old code (false),
// and nothing is recorded. A run that has not come this far yet takes the
// new code when it does.
//
// The marker costs no round trip of its own: it is written with the
// delivery's next write (before any wait, so a crash never leaves a later
// record without it). Markers show in a run's steps (CLI, HTTP API, web
// UI) like any step. changeID names one change: 1 to 200 bytes of UTF-8,
// no control or invisible characters, no white space at either end (a
// step name's rules). An invalid one panics, on every delivery alike: the
// run is parked as a panic naming the rule, never given two answers.
// Called again with the same ID (in a loop), each call is a point of its
// own and records its own marker.
//
// Once no run that took the old code remains, delete the old code and
// replace Patched with DeprecatePatch, which lets the runs that recorded
// the marker replay it; once none of those remains either, delete the
// DeprecatePatch call. A run whose records hold a marker the code no
// longer calls for is parked as nondeterminism, as for any step removed.
//
// After the run's cancellation, Patched returns true and records nothing,
// as the steps after it do not start. It must be called from the
// workflow's own goroutine, not inside a step.
func Patched(ctx *Context, changeID string) bool {
	mustChangeID("Patched", changeID)
	d := ctx.d
	rec := d.pos.at(d.pos.next)
	if d.cancelRequested.Load() && (rec == nil || rec.Kind == string(KindCompensation)) {
		return true // as a step not started: no position taken (see runStep)
	}
	if d.pos.replaying() && !isMarker(rec, changeID) {
		// A record of the code before the change (or a hole a parallel
		// step of that code left: a marker is never left behind one).
		return false
	}
	seq, err := d.enterStep("patch", changeID)
	if err != nil {
		// The delivery ended (the ID is valid): nothing more is recorded
		// in it, and the workflow learns that from its next step.
		return true
	}
	defer d.inStep.Store(false)
	if rec != nil {
		d.e.obs.StepReplayed(StepReplayedEvent{Workflow: d.wf.name, Kind: KindPatch})
		return true
	}
	// The buffer holds one record: the previous step's goes first.
	if !d.flush() {
		return true
	}
	now := d.e.now()
	// Not Fresh: written before any wait (flushStarted), so a parallel
	// step's record can never land at a later position without it.
	d.buf.pending = &store.StepRecord{Seq: seq, Name: changeID, Kind: string(KindPatch), Status: store.StepCompleted,
		Attempts: 1, StartedAt: now, CompletedAt: &now, Output: patchedOutput}
	d.e.obs.StepAttempt(StepAttemptEvent{Workflow: d.wf.name, Step: changeID, Kind: KindPatch, Attempt: 1, Outcome: "completed"})
	return true
}

// DeprecatePatch marks the change changeID as done: its old code is gone,
// and the code that Patched(ctx, changeID) guarded runs unconditionally.
// A run that recorded the change's marker replays it here; any other run
// records nothing. Delete the call once no run with the marker remains
// (see Patched). An invalid changeID panics, as in Patched.
func DeprecatePatch(ctx *Context, changeID string) {
	mustChangeID("DeprecatePatch", changeID)
	d := ctx.d
	if !d.pos.replaying() || !isMarker(d.pos.at(d.pos.next), changeID) {
		return
	}
	if _, err := d.enterStep("patch", changeID); err != nil {
		return
	}
	d.inStep.Store(false)
	d.e.obs.StepReplayed(StepReplayedEvent{Workflow: d.wf.name, Kind: KindPatch})
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
