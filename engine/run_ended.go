package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// remoteEnds hears the ends of watched runs that other processes commit:
// while some Wait of this process waits for a run that does not end here,
// a connection of its own (not the pool's) listens on
// store.RunEndedChannel, and each notification wakes the Waits of that run
// as a local end does (notifyEnded). The listener runs only while someone
// waits: the last Wait to finish stops it.
type remoteEnds struct {
	mu      sync.Mutex
	waiters int
	// listening is the running listener's state: ready is closed once its
	// LISTEN is in effect (err says if it failed), done when it exits.
	listening *listener
}

type listener struct {
	cancel context.CancelFunc
	ready  chan struct{}
	done   chan struct{}
	err    error // set before ready is closed
}

// remoteBackstop is how often a Wait that will be notified of the run's
// end still reads it, whatever its poll, in case a notification is lost.
const remoteBackstop = time.Second

// watchRemote arranges for e to hear of runID's end when another process
// commits it: it joins (or starts) the listener, waits for its LISTEN, then
// marks the run watched. It returns the run's status as of the mark (a run
// that ended before it sends nothing, and its status says so) and a func
// to call once done waiting. On an error the caller polls instead.
func (e *Engine) watchRemote(ctx context.Context, runID uuid.UUID) (RunStatus, func(), error) {
	l := e.joinListener()
	unwatch := func() { e.leaveListener() }
	select {
	case <-l.ready:
	case <-ctx.Done():
		unwatch()
		return "", nil, ctx.Err()
	}
	if l.err != nil {
		unwatch()
		return "", nil, l.err
	}
	status, err := store.WatchRun(ctx, e.db, runID)
	if err != nil {
		unwatch()
		if errors.Is(err, store.ErrNotFound) {
			return "", nil, ErrNotFound
		}
		return "", nil, err
	}
	return RunStatus(status), unwatch, nil
}

// joinListener counts a waiter and returns the listener, starting one if
// none runs (or the last one failed).
func (e *Engine) joinListener() *listener {
	r := &e.remote
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waiters++
	if l := r.listening; l != nil {
		select {
		case <-l.done:
			// It failed or lost its connection: start another.
		default:
			return l
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{cancel: cancel, ready: make(chan struct{}), done: make(chan struct{})}
	r.listening = l
	go e.listen(ctx, l)
	return l
}

// leaveListener uncounts a waiter and stops the listener after the last.
func (e *Engine) leaveListener() {
	r := &e.remote
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiters--; r.waiters == 0 && r.listening != nil {
		r.listening.cancel()
		r.listening = nil
	}
}

// listen holds the listening connection until ctx is done or the
// connection fails. A failure wakes every Wait of this process, which
// reads its run and, if it is still running, watches again.
func (e *Engine) listen(ctx context.Context, l *listener) {
	defer close(l.done)
	ready := func(err error) {
		l.err = err
		close(l.ready)
	}
	conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		ready(err)
		return
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+store.RunEndedChannel); err != nil {
		ready(err)
		return
	}
	ready(nil)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() == nil {
				e.log.Warn("listening for run ends failed; waits listen again", "error", err)
				// Retired first, so the Waits it wakes start another
				// listener instead of joining this one.
				e.retireListener(l)
				e.wakeAllWaits()
			}
			return
		}
		if id, err := uuid.Parse(n.Payload); err == nil {
			e.notifyEnded(id)
		}
	}
}

// retireListener stops l from being joined: the next Wait to join starts
// another.
func (e *Engine) retireListener(l *listener) {
	r := &e.remote
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.listening == l {
		r.listening = nil
	}
}

// wakeAllWaits wakes every Wait of this process, to read its run again.
func (e *Engine) wakeAllWaits() {
	e.endsMu.Lock()
	ends := e.ends
	e.ends = nil
	e.endsMu.Unlock()
	for _, list := range ends {
		for _, ch := range list {
			close(ch)
		}
	}
}
