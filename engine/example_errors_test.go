package engine_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// DeclineError is an error the example's workflow branches on. Its
// exported fields travel as JSON in the step's record.
type DeclineError struct {
	Code string `json:"code"`
}

func (e *DeclineError) Error() string { return "card declined: " + e.Code }

// ExampleRegisterError registers an error type under a stable name, so
// that a step's error decodes to the same type live and on every replay:
// the workflow's errors.As takes the same branch each time, and so does
// the caller's on the run's error.
func ExampleRegisterError() {
	if err := engine.RegisterError[*DeclineError]("example.DeclineError"); err != nil {
		panic(err) // the name is taken: a programming error
	}
	pay := engine.Define("example-decline", func(ctx *engine.Context, card string) (string, error) {
		_, err := engine.Step(ctx, "charge", func(context.Context) (string, error) {
			return "", engine.Permanent(&DeclineError{Code: "insufficient_funds"})
		}, nil)
		var decl *DeclineError
		if errors.As(err, &decl) && decl.Code == "insufficient_funds" {
			return "", engine.NewApplicationError("ask_for_another_card", "declined: "+decl.Code, nil, err)
		}
		return "paid", err
	}, nil)

	e, _, done := exampleEngine(nil, pay)
	if e == nil {
		fmt.Println("failed: ask_for_another_card; the decline inside: insufficient_funds")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := pay.Start(ctx, e, "pm_card_visa", nil)
	if err != nil {
		panic(err)
	}
	_, err = pay.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	var appErr *engine.ApplicationError
	var decl *DeclineError
	if errors.As(err, &runErr) && errors.As(err, &appErr) && errors.As(err, &decl) {
		fmt.Printf("%s: %s; the decline inside: %s\n", runErr.Status, appErr.Code, decl.Code)
	}
	// Output: failed: ask_for_another_card; the decline inside: insufficient_funds
}
