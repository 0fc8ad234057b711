package regress_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/compensation"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

const envAPI = "PGDURABLE_REGRESS_API_URL"

type chaosIn struct {
	Fail bool `json:"fail"`
}

type chargeReq struct {
	Run       string `json:"run"`
	Amount    int    `json:"amount"`
	Volatile  int64  `json:"volatile"` // changes on every call
	ChargeRef string `json:"charge_ref,omitempty"`
}

type chargeResp struct {
	ID string `json:"id"`
}

func postJSON(ctx context.Context, url string, body any) (chargeResp, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(string(b)))
	if err != nil {
		return chargeResp{}, engine.Permanent(err)
	}
	resp, err := activities.NewHTTPClient(0).Do(req)
	if err := activities.Classify(resp, err); err != nil {
		return chargeResp{}, err
	}
	defer resp.Body.Close()
	var out chargeResp
	return out, json.NewDecoder(resp.Body).Decode(&out)
}

func childWorkflows(pool *pgxpool.Pool) []engine.Registration {
	api := os.Getenv(envAPI)
	charge := &activities.Activity[chargeReq, chargeResp]{
		Name: "charge",
		Fn: func(ctx context.Context, call activities.Call, req chargeReq) (chargeResp, error) {
			req.Volatile = time.Now().UnixNano()
			return postJSON(ctx, api+"/charge", req)
		},
		StartToCloseTimeout: 3 * time.Second,
	}
	chaos := engine.Define("chaos", func(ctx *engine.Context, in chaosIn) (string, error) {
		saga := compensation.New(ctx)
		run := ctx.RunID()
		if _, err := compensation.TxStep(saga, "reserve", func(sctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(sctx, `INSERT INTO biz (run_id, name) VALUES ($1, 'reserve')`, run)
			return 1, err
		}, compensation.TxUndo[int]{Name: "release", Fn: func(uctx context.Context, tx pgx.Tx, _ int) error {
			_, err := tx.Exec(uctx, `INSERT INTO biz (run_id, name) VALUES ($1, 'release')`, run)
			return err
		}}, nil); err != nil {
			return "", err
		}
		ch, err := compensation.Activity(saga, charge, chargeReq{Run: run.String(), Amount: 100}, compensation.Undo[chargeResp]{
			Name: "refund",
			Fn: func(uctx context.Context, call activities.Call, c chargeResp) error {
				_, err := postJSON(uctx, api+"/refund", chargeReq{Run: run.String(), ChargeRef: c.ID, Volatile: time.Now().UnixNano()})
				return err
			},
		})
		if err != nil {
			return "", err
		}
		if _, err := engine.Step(ctx, "think", func(context.Context) (int, error) {
			time.Sleep(time.Duration(300+rand.IntN(900)) * time.Millisecond)
			return 0, nil
		}, nil); err != nil {
			return "", err
		}
		if in.Fail {
			if _, err := engine.Step(ctx, "ship", func(context.Context) (int, error) {
				return 0, engine.Permanent(errors.New("warehouse refused"))
			}, nil); err != nil {
				return "", err
			}
		}
		if _, err := engine.TxStep(ctx, "ship_tx", func(sctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(sctx, `INSERT INTO biz (run_id, name) VALUES ($1, 'ship')`, run)
			return 1, err
		}, nil); err != nil {
			return "", err
		}
		return ch.ID, nil
	}, nil)
	return []engine.Registration{chaos}
}

// stripe is a Stripe-like API: dedups by Idempotency-Key, counts effects.
type stripe struct {
	mu      sync.Mutex
	byKey   map[string]chargeResp
	effects map[string][]string // run -> "charge:key" / "refund:key"
	missing int
}

func newStripe() *stripe {
	return &stripe{byKey: map[string]chargeResp{}, effects: map[string][]string{}}
}

func (s *stripe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var req chargeReq
	_ = json.NewDecoder(r.Body).Decode(&req)
	s.mu.Lock()
	if key == "" {
		s.missing++
		s.mu.Unlock()
		http.Error(w, "missing key", 400)
		return
	}
	resp, ok := s.byKey[r.URL.Path+key]
	if !ok {
		if rand.IntN(6) == 0 { // flaky API
			s.mu.Unlock()
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		resp = chargeResp{ID: "ch_" + uuid.NewString()[:8]}
		s.byKey[r.URL.Path+key] = resp
		s.effects[req.Run] = append(s.effects[req.Run], strings.TrimPrefix(r.URL.Path, "/")+":"+key)
	}
	s.mu.Unlock()
	time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // processed; the answer may be lost to a kill
	_ = json.NewEncoder(w).Encode(resp)
}

// TestChaos60RunsRandomKills SIGKILLs one of two workers every 0.2-0.7 s
// (1 s lease) while 60 sagas run. At that rate a run can lose 10 deliveries
// in a row before its first write and be parked as crash_loop (seen about
// once in three runs), so it runs only with PGDURABLE_CHAOS=1; the chaos
// suite proper (kills every 2-5 s) is its own command.
func TestChaos60RunsRandomKills(t *testing.T) {
	if os.Getenv("PGDURABLE_CHAOS") != "1" {
		t.Skip("set PGDURABLE_CHAOS=1 to run")
	}
	t.Parallel()
	db := enginetest.NewDB(t)
	createEvents(t, db.Pool)
	api := newStripe()
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	ctx := context.Background()
	client, err := engine.New(db.Pool, nil)
	require.NoError(t, err)
	require.NoError(t, client.Register(childWorkflows(db.Pool)...))

	const n = 60
	var ids []uuid.UUID
	for i := 0; i < n; i++ {
		res, err := client.StartJSON(ctx, "chaos", []byte(fmt.Sprintf(`{"fail": %v}`, i%2 == 1)), nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	env := envAPI + "=" + srv.URL
	workers := []*workerProc{startW(t, db, env), startW(t, db, env)}
	allDone := func() bool {
		var open int
		require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs WHERE status NOT IN ('completed','compensated','failed','cancelled','dead')`)).Scan(&open))
		return open == 0
	}
	kills := 0
	for deadline := time.Now().Add(25 * time.Second); time.Now().Before(deadline) && !allDone(); {
		time.Sleep(time.Duration(200+rand.IntN(500)) * time.Millisecond)
		i := rand.IntN(len(workers))
		workers[i].kill(t)
		kills++
		workers[i] = startW(t, db, env)
	}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && !allDone(); {
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("kills: %d", kills)
	problems := 0
	for i, id := range ids {
		run, err := client.GetRun(ctx, id)
		require.NoError(t, err)
		want := engine.StatusCompleted
		if i%2 == 1 {
			want = engine.StatusCompensated
		}
		rows, err := db.Pool.Query(ctx, `SELECT name FROM biz WHERE run_id = $1 ORDER BY name`, id)
		require.NoError(t, err)
		biz, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		api.mu.Lock()
		eff := append([]string(nil), api.effects[id.String()]...)
		api.mu.Unlock()
		wantBiz := "[reserve ship]"
		wantEff := 1
		if i%2 == 1 {
			wantBiz, wantEff = "[release reserve]", 2
		}
		if run.Status != want || fmt.Sprint(biz) != wantBiz || len(eff) != wantEff {
			problems++
			t.Errorf("run %d %s: status %s (want %s) err=%+v biz=%v effects=%v", i, id, run.Status, want, run.Error, biz, eff)
		}
	}
	require.Zero(t, api.missing, "requests without Idempotency-Key")
	require.Zero(t, problems)
}

type workerProc struct{ cmd *exec.Cmd }

func startW(t *testing.T, db *enginetest.DB, env string) *workerProc {
	return &workerProc{cmd: crashtest.StartWorker(t, db, time.Second, env)}
}

func (w *workerProc) kill(t *testing.T) { crashtest.Kill(t, w.cmd) }
