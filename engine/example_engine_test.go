package engine_test

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// The runnable examples share one throwaway database: creating and
// dropping one costs PostgreSQL about a second each, longer than an
// example's runs. Each example opens its own pool and engine on it, uses
// workflow names of its own, and leaves no run open; TestMain drops the
// database at the end.
var exampleDB struct {
	once sync.Once
	url  string
	drop func() error
}

// dropExampleDatabase drops the examples' database, if one was made.
func dropExampleDatabase() {
	if exampleDB.drop != nil {
		_ = exampleDB.drop()
	}
}

// exampleEngine starts an engine with wfs registered (engine.New(pool,
// cfg) in a real program) and returns it, its pool, and a function that
// stops the engine and closes the pool. It returns a nil engine when
// TEST_DATABASE_URL is unset: the example then prints its expected
// output, as Example does.
func exampleEngine(cfg *engine.Config, wfs ...engine.Registration) (*engine.Engine, *pgxpool.Pool, func()) {
	ctx := context.Background()
	pool := exampleSharedPool(ctx)
	if pool == nil {
		return nil, nil, nil
	}
	c := engine.Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler) // the examples print what they show
	}
	e, err := engine.New(pool, &c)
	if err != nil {
		panic(err)
	}
	if err := e.Register(wfs...); err != nil {
		panic(err)
	}
	if err := e.Start(ctx); err != nil {
		panic(err)
	}
	return e, pool, func() {
		stop, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = e.Stop(stop)
		pool.Close()
	}
}

// exampleSharedPool opens a pool on the examples' database, creating the
// database on first use; nil when TEST_DATABASE_URL is unset.
func exampleSharedPool(ctx context.Context) *pgxpool.Pool {
	exampleDB.once.Do(func() {
		if os.Getenv(enginetest.EnvURL) == "" {
			if os.Getenv("CI") == "true" {
				panic(enginetest.EnvURL + " is not set; CI must provide a PostgreSQL server")
			}
			return
		}
		db, drop, err := enginetest.Open(ctx)
		if err != nil {
			panic(err)
		}
		db.Pool.Close() // each example opens its own
		exampleDB.url, exampleDB.drop = db.URL, drop
	})
	if exampleDB.url == "" {
		return nil
	}
	cfg, err := pgxpool.ParseConfig(exampleDB.url)
	if err != nil {
		panic(err)
	}
	cfg.MaxConns = 10 // a worker's record writes and River's listener need a few
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	return pool
}

// fastRetries retries at once: the examples show what happens, not the
// backoff.
var fastRetries = &engine.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 3}

// exampleCtx bounds an example: a run that never ends fails it instead of
// hanging the test binary.
func exampleCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}
