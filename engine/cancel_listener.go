package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// listenCancels hears of cancellations as they commit (Cancel notifies
// store.CancelChannel) and flags this process's delivery of the run at
// once: its running forward step's context is cancelled and a retry wait
// cut short, instead of at the next heartbeat (HeartbeatInterval). A
// notification lost while the listener reconnects costs only that delay:
// every heartbeat and record write reads the request too. It holds one
// connection of its own, outside the pool.
func (e *Engine) listenCancels(ctx context.Context) {
	defer e.active.Done()
	for ctx.Err() == nil {
		err := e.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if e.warnOnce("cancellation listener", time.Minute) {
			e.log.Warn("cancellation listener lost its connection; reconnecting (cancellations reach running steps at their next heartbeat meanwhile)", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (e *Engine) listenOnce(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+store.CancelChannel); err != nil {
		return err
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		id, err := uuid.Parse(n.Payload)
		if err != nil {
			continue
		}
		if c, ok := e.live.Load(id); ok {
			c.(*Context).noteCancel(true)
		}
	}
}
