package migrations_test

import (
	"fmt"
	"testing"

	"github.com/pgdurable/pgdurable/storage/migrations"
)

// Every key added is held, across an encoding; about 1% of the others are.
func TestFilterHoldsEveryKeyAddedAndFewOthers(t *testing.T) {
	const n = 20_000
	f, err := migrations.NewPins(n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		f.Add(migrations.WorkflowKey("order", fmt.Sprint("order-", i)))
	}
	g, err := migrations.ParsePins(f.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if !g.Has(migrations.WorkflowKey("order", fmt.Sprint("order-", i))) {
			t.Fatalf("key %d added and not held", i)
		}
	}
	var held int
	for i := range n {
		if g.Has(migrations.WorkflowKey("order", fmt.Sprint("other-", i))) {
			held++
		}
	}
	if rate := float64(held) / n; rate > 0.02 {
		t.Fatalf("%.2f%% of keys not added are held, want about 1%%", 100*rate)
	}
	// The kinds of key do not collide with each other.
	if g.Has(migrations.DedupKey("order", "order-1")) || g.Has(migrations.DebounceKey("order", "order-1")) {
		t.Fatal("a deduplication or debounce key held for a workflow ID's")
	}
}

// No filter (a schema given its routes before it held runs) holds nothing;
// an encoding of another format is refused.
func TestNoFilterAndForeignEncodings(t *testing.T) {
	f, err := migrations.ParsePins(nil)
	if err != nil || f != nil || f.Has(migrations.WorkflowKey("a", "b")) {
		t.Fatalf("migrations.ParsePins(nil) = %v, %v", f, err)
	}
	for _, b := range [][]byte{{2, 7, 0, 0, 0, 0, 0, 0, 0, 0}, {1, 7, 0}, {1, 6, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if _, err := migrations.ParsePins(b); err == nil {
			t.Fatalf("Parse(%v) accepted", b)
		}
	}
	if _, err := migrations.NewPins(migrations.MaxPinnedKeys + 1); err == nil {
		t.Fatal("New above MaxPinnedKeys accepted")
	}
}
