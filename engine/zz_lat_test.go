package engine_test

import (
	"context"
	"testing"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

func BenchmarkStartLatency(b *testing.B) {
	wf := engine.Define("lat", func(ctx *engine.Context, n int) (int, error) { return n, nil }, nil)
	db := enginetest.NewDB(b)
	e := enginetest.NewEngine(b, db, nil, false, wf)
	ctx := context.Background()
	for b.Loop() {
		if _, err := wf.Start(ctx, e, 1, nil); err != nil {
			b.Fatal(err)
		}
	}
}
