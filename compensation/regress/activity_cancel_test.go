package regress_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/compensation"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// Cancel while a charge is in flight: the API has applied the charge and is
// about to answer. The attempt's ctx is cancelled, the step is dropped as
// "not done", no undo is registered for it, so the refund never runs and the
// run ends cancelled with the customer charged.
func TestCancelDuringInFlightChargeNeverRefunds(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	var charges, refunds atomic.Int32
	applied := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/charge":
			charges.Add(1)
			applied <- struct{}{}
			time.Sleep(1500 * time.Millisecond) // slow answer
			w.Write([]byte(`{"id":"ch_1"}`))
		case "/refund":
			refunds.Add(1)
			w.Write([]byte(`{"id":"re_1"}`))
		}
	}))
	t.Cleanup(srv.Close)
	charge := &activities.Activity[int, chargeResp]{Name: "charge", Fn: func(ctx context.Context, call activities.Call, _ int) (chargeResp, error) {
		return postJSON(ctx, srv.URL+"/charge", chargeReq{})
	}}
	wf := engine.Define("inflight", func(ctx *engine.Context, _ int) (string, error) {
		saga := compensation.New(ctx)
		_, err := compensation.Activity(saga, charge, 1, compensation.Undo[chargeResp]{Name: "refund", Fn: func(uctx context.Context, call activities.Call, c chargeResp) error {
			_, err := postJSON(uctx, srv.URL+"/refund", chargeReq{ChargeRef: c.ID})
			return err
		}})
		return "done", err
	}, nil)
	e := newEngine(t, db, &engine.Config{LeaseDuration: 1500 * time.Millisecond}, wf)
	res, err := wf.Start(context.Background(), e, 1, nil)
	require.NoError(t, err)
	<-applied
	require.NoError(t, e.Cancel(context.Background(), res.RunID))
	run := waitStatus(t, e, res.RunID, 15*time.Second, engine.StatusCancelled, engine.StatusCompleted)
	dumpRun(t, run)
	t.Logf("charges=%d refunds=%d", charges.Load(), refunds.Load())
	if run.Status == engine.StatusCancelled {
		require.Equal(t, charges.Load(), refunds.Load(), "a cancelled run leaves a charge it never refunds")
	}
}
