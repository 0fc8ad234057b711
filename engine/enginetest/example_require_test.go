package enginetest_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// ExampleRequireResult is the body of a test of a two-step workflow: in a
// test it reads
//
//	db := enginetest.NewDB(t)
//	e := enginetest.NewEngine(t, db, nil, true, greet)
//
// and passes t where this example passes tb.
func ExampleRequireResult() {
	ctx := context.Background()
	if os.Getenv(enginetest.EnvURL) == "" {
		fmt.Println("hello ada") // TEST_DATABASE_URL unset: nothing to run against
		return
	}
	db, drop, err := enginetest.Open(ctx)
	if err != nil {
		panic(err)
	}
	defer drop() //nolint:errcheck
	tb := &exampleTB{}
	greet := engine.Define("example-greet", func(ctx *engine.Context, name string) (string, error) {
		if _, err := engine.Step(ctx, "validate", func(context.Context) (bool, error) { return name != "", nil }, nil); err != nil {
			return "", err
		}
		return engine.Step(ctx, "format", func(context.Context) (string, error) { return "hello " + name, nil }, nil)
	}, nil)
	e := enginetest.NewEngine(tb, db, nil, true, greet)
	defer tb.cleanup()

	res, err := greet.Start(ctx, e, "ada", nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(enginetest.RequireResult(ctx, tb, e, greet, res.RunID, 0))
	enginetest.RequireSteps(ctx, tb, e, res.RunID, []string{"validate", "format"})
	enginetest.RequireStepRecorded(ctx, tb, e, res.RunID, "format", &enginetest.RequireStepOpts{Status: engine.StepCompleted, Attempts: 1})
	// Output: hello ada
}

// exampleTB stands in for the *testing.T an example does not have: it
// panics where a test would fail, and runs cleanups when told.
type exampleTB struct {
	testing.TB // never called: every method used below is its own
	cleanups   []func()
}

func (*exampleTB) Helper()                           {}
func (*exampleTB) Logf(format string, args ...any)   { fmt.Printf(format+"\n", args...) }
func (*exampleTB) Log(args ...any)                   { fmt.Println(args...) }
func (*exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (*exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (*exampleTB) FailNow()                          { panic("test failed") }
func (tb *exampleTB) Cleanup(f func())               { tb.cleanups = append(tb.cleanups, f) }

func (tb *exampleTB) cleanup() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}
