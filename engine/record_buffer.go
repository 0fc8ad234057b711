package engine

import "github.com/pgdurable/pgdurable/engine/internal/store"

// recordBuffer holds records of finished steps that are not yet written.
// Writing a plain step's record lazily lets it share the next write (the
// next step's announcement, the run's completion, a hand-back), which
// saves a commit per step; nothing runs between a step and its record
// except deterministic workflow code, so nothing is lost that a replay
// would not redo.
type recordBuffer struct {
	// pending is the record of the latest step, written with the
	// delivery's next write.
	pending *store.StepRecord
	// stopped is the record of a step the run's cancellation stopped,
	// written with the compensation's first write.
	stopped *store.StepRecord
}

// take empties the buffer of its pending record and returns it (nil when
// there is none): the caller writes it.
func (b *recordBuffer) take() *store.StepRecord {
	rec := b.pending
	b.pending = nil
	return rec
}

// takeWith is take with rec (when not nil) after the pending record, in
// the order they are to be written.
func (b *recordBuffer) takeWith(rec *store.StepRecord) []*store.StepRecord {
	var recs []*store.StepRecord
	if p := b.take(); p != nil {
		recs = append(recs, p)
	}
	if rec != nil {
		recs = append(recs, rec)
	}
	return recs
}

// takeAll empties the buffer: the pending record, then the stopped one.
func (b *recordBuffer) takeAll() []*store.StepRecord {
	recs := b.takeWith(b.stopped)
	b.stopped = nil
	return recs
}
