package engine

import (
	"fmt"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// positions hands out a run's step positions in call order and holds the
// records earlier deliveries wrote, by position: a step whose position
// has a record replays it instead of running. Positions follow calls, not
// completions, so a replay lines up with the run that recorded it.
type positions struct {
	recorded []store.StepRecord // by seq; a hole (a position with no record) has an empty Name
	next     int                // the next step's position
}

// newPositions places steps (in seq order, as a claim loads them) at their
// positions. Parallel steps (Go) may leave holes: a later position
// recorded while an earlier one still ran when the delivery ended.
func newPositions(steps []store.StepRecord) positions {
	if n := len(steps); n == 0 || steps[n-1].Seq == n-1 {
		return positions{recorded: steps} // dense: the common case, no copy
	}
	recorded := make([]store.StepRecord, steps[len(steps)-1].Seq+1)
	for _, s := range steps {
		recorded[s.Seq] = s
	}
	return positions{recorded: recorded}
}

// take is the next step's position.
func (p *positions) take() int {
	seq := p.next
	p.next++
	return seq
}

// giveBack returns the position take just handed out, for a step that
// never started and left nothing recorded (a run's cancellation stopped
// it first): the undos take its place. Not when a later position is
// recorded (a parallel step left this one a hole): the position stays
// taken, so the steps after it replay at their own.
func (p *positions) giveBack() {
	if !p.replaying() {
		p.next--
	}
}

// skipForward moves past every recorded position that is not an undo's,
// before the undos run: a cancelled or failed replay may stop (at a hole
// a parallel step left) before steps that an earlier delivery recorded
// after it, and the undos' positions follow the last forward record, as
// they did in the delivery that recorded them.
func (p *positions) skipForward() {
	for i := len(p.recorded) - 1; i >= p.next; i-- {
		if r := p.at(i); r != nil && r.Kind != string(KindCompensation) {
			p.next = i + 1
			return
		}
	}
}

// at is position seq's record from an earlier delivery, nil for a
// position no delivery recorded.
func (p *positions) at(seq int) *store.StepRecord {
	if seq < 0 || seq >= len(p.recorded) || p.recorded[seq].Name == "" {
		return nil
	}
	return &p.recorded[seq]
}

// replaying reports whether the next position is recorded.
func (p *positions) replaying() bool { return p.next < len(p.recorded) }

// last is the newest record of an earlier delivery, nil for none.
func (p *positions) last() *store.StepRecord { return p.at(len(p.recorded) - 1) }

// replay looks position seq up for a step of kind named name: the record
// an earlier delivery wrote there, or nil for a new step. Every kind of
// step goes through it (step, tx step, activity, sleep, signal, undo).
// A record of another name or kind means the workflow's code changed under
// the run: the run is parked as nondeterminism and ok is false.
func (d *delivery) replay(seq int, name string, kind StepKind) (rec *store.StepRecord, ok bool) {
	rec = d.pos.at(seq)
	if rec != nil && (rec.Name != name || rec.Kind != string(kind)) {
		d.park(nil, parkNonDeterminism(seq, name, kind, rec))
		return nil, false
	}
	return rec, true
}

// parkUnreplayed parks a run whose workflow function (or compensation)
// returned (what) before calling every recorded step: the code changed
// under the run.
func (d *delivery) parkUnreplayed(what string) {
	d.park(nil, &parkReason{reason: ReasonNonDeterminism, info: &ErrorInfo{Class: ClassNonDeterminism,
		Message: fmt.Sprintf("%s after %d steps but %d are recorded", what, d.pos.next, len(d.pos.recorded))}})
}
