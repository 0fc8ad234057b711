package engine

import (
	"context"

	"github.com/google/uuid"
	"github.com/pgdurable/pgdurable/engine/internal/groupcommit"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// newRecordWriter builds the writer every delivery of e sends its record
// writes through: the records of concurrent deliveries are committed in one
// statement and one transaction, each fenced on its own.
func newRecordWriter(e *Engine) *groupcommit.Batcher[*store.RecordWrite, groupcommit.Outcome[store.WriteResult]] {
	write := func(ctx context.Context, writes []*store.RecordWrite) ([]store.WriteResult, error) {
		return store.WriteRecords(ctx, e.db, writes)
	}
	size := func(w *store.RecordWrite) int {
		n := len(w.Output) + len(w.Error)
		for _, r := range w.Records {
			n += len(r.Output) + len(r.Error)
		}
		return n
	}
	return groupcommit.Store(write, size, true, writeTimeout)
}

// newClaimBatcher coalesces the claims of concurrent deliveries of e (the
// tickets of one River fetch start together; held runs start as workers
// free up) into one round trip.
func newClaimBatcher(e *Engine) *groupcommit.Batcher[store.Fence, groupcommit.Outcome[store.ClaimResult]] {
	return groupcommit.Store(func(ctx context.Context, fences []store.Fence) ([]store.ClaimResult, error) {
		return store.ClaimRuns(ctx, e.db, fences, e.now())
	}, nil, false, writeTimeout)
}

// claim takes the lease on runID with token, in a batch with the claims
// of other deliveries (see store.ClaimRuns).
func (e *Engine) claim(runID, token uuid.UUID) (*store.ClaimedRun, *store.ClaimMiss, error) {
	o := e.claims.Do(store.Fence{RunID: runID, Token: token, Lease: e.cfg.LeaseDuration})
	return o.Res.Run, o.Res.Miss, o.Err
}

// newBeatBatcher coalesces the heartbeats of concurrent deliveries of e:
// they beat on ticks aligned across the process (see heartbeat), so the
// deliveries whose lease is due share one statement.
func newBeatBatcher(e *Engine) *groupcommit.Batcher[store.Beat, groupcommit.Outcome[store.BeatResult]] {
	return groupcommit.Store(func(ctx context.Context, beats []store.Beat) ([]store.BeatResult, error) {
		return store.Heartbeats(ctx, e.db, beats)
	}, nil, false, writeTimeout)
}

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
