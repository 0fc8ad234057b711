package activities_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// ExampleExecute charges a card through an HTTP API that fails once with a
// 503. The retry carries the same Idempotency-Key, so the API charges once.
func ExampleExecute() {
	if os.Getenv(enginetest.EnvURL) == "" {
		fmt.Println("charged ch_1 with 2 requests and 1 key") // no database to run against
		return
	}
	ctx := context.Background()
	db, drop, err := enginetest.Open(ctx) // a throwaway migrated database
	if err != nil {
		panic(err)
	}
	defer drop() //nolint:errcheck

	// A stand-in payment API: the first request fails, every request's key is kept.
	var mu sync.Mutex
	var keys []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if len(keys) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"id": "ch_1"}`)
	}))
	defer api.Close()

	client := activities.NewHTTPClient(10 * time.Second)
	charge := &activities.Activity[int, string]{
		Name: "charge",
		Fn: func(ctx context.Context, call activities.Call, amount int) (string, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/v1/charges",
				strings.NewReader(fmt.Sprintf("amount=%d", amount)))
			if err != nil {
				return "", engine.Permanent(err)
			}
			resp, err := client.Do(req) // sets Idempotency-Key: call.RequestID
			if err := activities.Classify(resp, err); err != nil {
				return "", err // 503: transient, retried with the same key
			}
			defer resp.Body.Close()
			var out struct{ ID string }
			return out.ID, json.NewDecoder(resp.Body).Decode(&out)
		},
		RetryPolicy: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond},
	}
	checkout := engine.Define("example-checkout", func(ctx *engine.Context, amount int) (string, error) {
		return activities.Execute(ctx, charge, amount)
	}, nil)

	e, err := engine.New(db.Pool, nil)
	if err != nil {
		panic(err)
	}
	if err := e.Register(checkout); err != nil {
		panic(err)
	}
	if err := e.Start(ctx); err != nil {
		panic(err)
	}
	defer e.Stop(ctx) //nolint:errcheck
	res, err := checkout.Start(ctx, e, 4999, nil)
	if err != nil {
		panic(err)
	}
	id, err := checkout.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("charged %s with %d requests and %d key\n", id, len(keys), len(map[string]bool{keys[0]: true, keys[1]: true}))
	// Output: charged ch_1 with 2 requests and 1 key
}
