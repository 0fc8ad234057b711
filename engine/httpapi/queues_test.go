package httpapi_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestQueueRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "GET", "/v1/queues", "")
	require.Equal(t, 200, r.status, r.raw)
	require.Empty(t, r.body["queues"])

	// A start names a queue no process serves: it waits there, and says so.
	start := `{"input": {"order_id": "o", "amount": 1}, "queue": "payments", "queue_key": "cus_1", "priority": 5, "deduplication_id": "o-1"}`
	r = b.do(t, "POST", "/v1/workflows/payment/runs", start)
	require.Equal(t, 201, r.status, r.raw)
	runID := r.body["run_id"].(string)
	r = b.do(t, "POST", "/v1/workflows/payment/runs", start)
	require.Equal(t, 409, r.status, r.raw)
	require.Equal(t, "duplicate", errCode(r))
	r = b.do(t, "POST", "/v1/workflows/payment/runs", `{"input": {"order_id": "o", "amount": 1}, "queue": "payments", "deduplication_id": "o-1", "return_duplicate": true}`)
	require.Equal(t, 200, r.status, r.raw)
	require.Equal(t, runID, r.body["run_id"])
	require.Equal(t, true, r.body["deduplicated"])
	r = b.do(t, "GET", "/v1/runs/"+runID, "")
	require.Equal(t, 200, r.status, r.raw)
	require.Equal(t, "payments", r.body["queue"])
	require.Equal(t, "cus_1", r.body["queue_key"])
	require.Equal(t, float64(5), r.body["priority"])
	require.Equal(t, "a process that serves queue payments", r.body["waiting_for"])

	r = b.do(t, "GET", "/v1/queues", "")
	require.Equal(t, 200, r.status, r.raw)
	queues := r.body["queues"].([]any)
	require.Len(t, queues, 1)
	q := queues[0].(map[string]any)
	require.Equal(t, false, q["defined"])
	require.Equal(t, float64(1), q["ready"])

	require.Equal(t, 404, b.do(t, "POST", "/v1/queues/payments/pause", `{}`).status, "no process defined it")
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO pgdurable.queues (name, concurrency) VALUES ('payments', 5)`)
	require.NoError(t, err)
	r = b.do(t, "POST", "/v1/queues/payments/pause", `{"reason": "card processor down", "by": "alice"}`)
	require.Equal(t, 200, r.status, r.raw)
	require.Equal(t, true, r.body["paused"])
	require.Equal(t, "alice", r.body["paused_by"])
	require.Equal(t, float64(5), r.body["concurrency"])
	r = b.do(t, "GET", "/v1/runs/"+runID, "")
	require.Equal(t, "queue payments is paused (card processor down, by alice)", r.body["waiting_for"])
	require.Equal(t, 400, b.do(t, "POST", "/v1/queues/payments/pause", `{"colour": "red"}`).status)
	r = b.do(t, "POST", "/v1/queues/payments/resume", `{"by": "alice"}`)
	require.Equal(t, 200, r.status, r.raw)
	require.Equal(t, false, r.body["paused"])
	require.Equal(t, 400, b.do(t, "POST", "/v1/workflows/payment/runs", `{"input": {}, "priority": 3}`).status, "a priority needs a queue")
}

func TestDebouncedStartsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	body := `{"input": {"order_id": "o", "amount": 1}, "debounce": {"key": "cus_1", "window": "1h"}}`
	r := b.do(t, "POST", "/v1/workflows/payment/runs", body)
	require.Equal(t, 201, r.status, r.raw)
	runID := r.body["run_id"].(string)
	r = b.do(t, "POST", "/v1/workflows/payment/runs", `{"input": {"order_id": "o", "amount": 2}, "debounce": {"key": "cus_1", "window": "1h"}}`)
	require.Equal(t, 200, r.status, r.raw)
	require.Equal(t, runID, r.body["run_id"])
	require.Equal(t, true, r.body["debounced"])
	r = b.do(t, "GET", "/v1/runs/"+runID, "")
	require.Equal(t, float64(2), r.body["input"].(map[string]any)["amount"], "the latest input")
	require.Equal(t, 400, b.do(t, "POST", "/v1/workflows/payment/runs", `{"input": {}, "debounce": {"key": "k", "window": "soon"}}`).status)
	require.Equal(t, 400, b.do(t, "POST", "/v1/workflows/payment/runs", `{"input": {}, "id": "order-9", "debounce": {"key": "k", "window": "1s"}}`).status)
}
