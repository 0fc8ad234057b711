package engine_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleEngine_SaveSchedule creates a schedule at start-up (an update
// when it exists, keeping its next fire time) and triggers one run now,
// outside its cron. Every fire of the cron starts exactly one run, with
// the workflow ID schedule:<name>:<fire time>, across any number of
// engine processes.
func ExampleEngine_SaveSchedule() {
	report := engine.Define("example-report", func(ctx *engine.Context, kind string) (string, error) {
		return kind + " report sent", nil
	}, nil)

	e, _, done := exampleEngine(nil, report)
	if e == nil {
		fmt.Println("nightly-report: 30 2 * * * in America/New_York, fires at 02:30\ntriggered: schedule:nightly-report:trigger:...\ndaily report sent")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	s, err := e.SaveSchedule(ctx, engine.ScheduleSpec{
		Name:     "nightly-report",
		Cron:     "30 2 * * *",
		TimeZone: "America/New_York",
		Workflow: "example-report",
		Input:    json.RawMessage(`"daily"`),
	})
	if err != nil {
		panic(err)
	}
	defer e.DeleteSchedule(ctx, s.Name) //nolint:errcheck
	ny, err := time.LoadLocation(s.TimeZone)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s: %s in %s, fires at %s\n", s.Name, s.Cron, s.TimeZone, s.NextFireAt.In(ny).Format("15:04"))

	res, err := e.TriggerSchedule(ctx, "nightly-report")
	if err != nil {
		panic(err)
	}
	prefix, _, _ := strings.Cut(res.WorkflowID, ":trigger:")
	fmt.Println("triggered:", prefix+":trigger:...")
	out, err := report.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Println(out)
	// Output:
	// nightly-report: 30 2 * * * in America/New_York, fires at 02:30
	// triggered: schedule:nightly-report:trigger:...
	// daily report sent
}
