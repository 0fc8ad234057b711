package activities_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// envChildAPI passes the fake API's URL to worker processes.
const envChildAPI = "PGDURABLE_ACTIVITIES_CHILD_API"

func TestMain(m *testing.M) {
	crashtest.RunWorkerIfChild(func(*pgxpool.Pool) []engine.Registration {
		return []engine.Registration{chargeWorkflow(os.Getenv(envChildAPI))}
	})
	goleak.VerifyTestMain(m)
}

// fakeAPI is a payment API with Stripe's idempotency rule: the first
// response for a key is stored and replayed for every later request with
// that key. script, when set, answers requests by their arrival order.
type fakeAPI struct {
	mu       sync.Mutex
	requests []apiRequest
	charges  map[string]string // key -> charge ID: the effect, applied once per key
	script   []func(w http.ResponseWriter, r *http.Request) bool
	// processed is signalled after a charge is applied and before the
	// response is written, when hangAfterCharge is set.
	hangAfterCharge bool
	processed       chan struct{}
}

type apiRequest struct {
	Key   string
	At    time.Time
	Nonce string
}

func newFakeAPI(t *testing.T) (*fakeAPI, *httptest.Server) {
	api := &fakeAPI{charges: map[string]string{}, processed: make(chan struct{}, 1)}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return api, srv
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Amount int    `json:"amount"`
		Nonce  string `json:"nonce"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	key := r.Header.Get(activities.IdempotencyKeyHeader)
	f.mu.Lock()
	n := len(f.requests)
	f.requests = append(f.requests, apiRequest{Key: key, At: time.Now(), Nonce: body.Nonce})
	var step func(http.ResponseWriter, *http.Request) bool
	if n < len(f.script) {
		step = f.script[n]
	}
	f.mu.Unlock()
	if step != nil && step(w, r) {
		return
	}
	f.mu.Lock()
	id, seen := f.charges[key]
	if !seen {
		id = fmt.Sprintf("ch_%d", len(f.charges)+1)
		f.charges[key] = id
	}
	hang := f.hangAfterCharge && !seen
	f.mu.Unlock()
	if hang {
		f.processed <- struct{}{}
		select { // the worker is killed before it reads the response
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "amount": body.Amount, "replayed": seen})
}

func (f *fakeAPI) snapshot() (reqs []apiRequest, keys map[string]int, charges int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys = map[string]int{}
	for _, r := range f.requests {
		keys[r.Key]++
	}
	return append([]apiRequest(nil), f.requests...), keys, len(f.charges)
}

func status(code int, header ...string) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"error": {"message": "scripted %d"}}`, code)
		return true
	}
}

func hang(d time.Duration) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		select {
		case <-r.Context().Done():
		case <-time.After(d):
		}
		return true
	}
}

type chargeReq struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}

type chargeResp struct {
	ID       string `json:"id"`
	Replayed bool   `json:"replayed"`
}

// chargeActivity posts a charge to the API at base. Its body carries a
// nonce that differs on every attempt: the key must not.
func chargeActivity(base string, opts func(*activities.Activity[chargeReq, chargeResp])) *activities.Activity[chargeReq, chargeResp] {
	client := activities.NewHTTPClient(0)
	a := &activities.Activity[chargeReq, chargeResp]{
		Name: "charge",
		Fn: func(ctx context.Context, call activities.Call, req chargeReq) (chargeResp, error) {
			body := fmt.Sprintf(`{"amount": %d, "nonce": %q}`, req.Amount, time.Now().Format(time.RFC3339Nano))
			httpReq, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/charges", stringsReader(body))
			if err != nil {
				return chargeResp{}, engine.Permanent(err)
			}
			resp, err := client.Do(httpReq)
			if err := activities.Classify(resp, err); err != nil {
				return chargeResp{}, err
			}
			defer resp.Body.Close()
			var out chargeResp
			return out, json.NewDecoder(resp.Body).Decode(&out)
		},
		RetryPolicy:         &engine.RetryPolicy{InitialInterval: 50 * time.Millisecond, MaximumAttempts: 5},
		StartToCloseTimeout: 5 * time.Second,
	}
	if opts != nil {
		opts(a)
	}
	return a
}

func chargeWorkflow(base string, opts ...func(*activities.Activity[chargeReq, chargeResp])) *engine.Workflow[chargeReq, chargeResp] {
	var o func(*activities.Activity[chargeReq, chargeResp])
	if len(opts) > 0 {
		o = opts[0]
	}
	charge := chargeActivity(base, o)
	return engine.Define("checkout", func(ctx *engine.Context, in chargeReq) (chargeResp, error) {
		return activities.Execute(ctx, charge, in)
	}, nil)
}

func newEngine(t *testing.T, db *enginetest.DB, cfg *engine.Config, start bool, wfs ...engine.Registration) *engine.Engine {
	t.Helper()
	return enginetest.NewEngine(t, db, cfg, start, wfs...)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func runOf(t *testing.T, e *engine.Engine, id uuid.UUID) *engine.Run {
	t.Helper()
	run, err := e.GetRun(context.Background(), id)
	require.NoError(t, err)
	return run
}
