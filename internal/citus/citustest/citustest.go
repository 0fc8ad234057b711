// Package citustest starts a local Citus cluster for a test.
package citustest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/pgdurable/pgdurable/internal/citus"
)

// Start starts a coordinator and 2 worker nodes for t, stopped when t
// ends. Without Citus installed the test is skipped, except where
// PGDURABLE_REQUIRE_CITUS=1 (CI, which builds Citus first): there it
// fails.
func Start(t testing.TB) *citus.Cluster {
	t.Helper()
	if !citus.Installed() {
		if os.Getenv("PGDURABLE_REQUIRE_CITUS") == "1" {
			t.Fatal(citus.ErrNotInstalled)
		}
		t.Skip(citus.ErrNotInstalled)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := citus.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}
