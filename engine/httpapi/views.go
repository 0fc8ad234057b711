package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
)

// The API's JSON shapes are the engine's types (engine.Run, engine.DeadJob,
// engine.Schedule), which other front ends (the CLI's --json) print too,
// so scripts see the same field names whichever they call. What follows
// are the envelopes of lists and of the answers that are not an entity.

// RunList is GET /v1/runs's answer: runs without their input (lists stay
// small; GET /v1/runs/{id} has it), and the next page's cursor.
type RunList struct {
	Runs       []*engine.Run `json:"runs"`
	NextCursor string        `json:"next_cursor,omitempty"`
}

// NewRunList is a page of runs as GET /v1/runs answers it.
func NewRunList(runs []*engine.Run, next string) RunList {
	out := RunList{Runs: make([]*engine.Run, 0, len(runs)), NextCursor: next}
	for _, run := range runs {
		c := *run
		c.Input = nil
		out.Runs = append(out.Runs, &c)
	}
	return out
}

// NewCancelResponse is POST /v1/runs/{id}/cancel's answer: the run, without
// its steps.
func NewCancelResponse(r *engine.Run) *engine.Run {
	c := *r
	c.Steps = nil
	return &c
}

// StartResponse answers a start: the run it created or found.
type StartResponse struct {
	RunID      uuid.UUID        `json:"run_id"`
	Workflow   string           `json:"workflow"`
	WorkflowID string           `json:"workflow_id"`
	Status     engine.RunStatus `json:"status"`
	Existing   bool             `json:"existing"`
	// Deduplicated: the run holds the start's deduplication ID
	// (return_duplicate).
	Deduplicated bool `json:"deduplicated,omitempty"`
	// Debounced: the start joined a run waiting out its debounce window.
	Debounced bool `json:"debounced,omitempty"`
}

// NewStartResponse is the answer to a start of workflow.
func NewStartResponse(workflow string, res *engine.StartResult) StartResponse {
	return StartResponse{RunID: res.RunID, Workflow: workflow, WorkflowID: res.WorkflowID, Status: res.Status, Existing: res.Existing,
		Deduplicated: res.Deduplicated, Debounced: res.Debounced}
}

// SignalResponse answers a signal: Status is "accepted" (buffered).
type SignalResponse struct {
	Run    string `json:"run"`
	Signal string `json:"signal"`
	Status string `json:"status"`
}

// DeadJobList is GET /v1/dead-jobs's answer: dead jobs without their
// stacks, and the next page's cursor.
type DeadJobList struct {
	DeadJobs   []*engine.DeadJob `json:"dead_jobs"`
	NextCursor string            `json:"next_cursor,omitempty"`
}

// NewDeadJobList is a page of dead jobs as GET /v1/dead-jobs answers it.
func NewDeadJobList(jobs []*engine.DeadJob, next string) DeadJobList {
	out := DeadJobList{DeadJobs: make([]*engine.DeadJob, 0, len(jobs)), NextCursor: next}
	for _, j := range jobs {
		c := *j
		c.Stack = ""
		out.DeadJobs = append(out.DeadJobs, &c)
	}
	return out
}

// ScheduleWithFires is GET /v1/schedules/{name}'s answer: the schedule's
// fields and its latest fires under "fires". (engine.Schedule has its own
// MarshalJSON, which an embedding struct would inherit and drop Fires.)
type ScheduleWithFires struct {
	Schedule *engine.Schedule
	Fires    []engine.ScheduleFire
}

// MarshalJSON writes the schedule's object with "fires" added.
func (v ScheduleWithFires) MarshalJSON() ([]byte, error) {
	sched, err := json.Marshal(v.Schedule)
	if err != nil {
		return nil, err
	}
	fires := v.Fires
	if fires == nil {
		fires = []engine.ScheduleFire{}
	}
	f, err := json.Marshal(fires)
	if err != nil {
		return nil, err
	}
	if len(sched) < 2 || sched[len(sched)-1] != '}' {
		return nil, fmt.Errorf("schedule JSON is not an object: %s", sched)
	}
	out := append(sched[:len(sched)-1:len(sched)-1], []byte(`,"fires":`)...)
	if string(sched) == "{}" {
		out = []byte(`{"fires":`)
	}
	return append(append(out, f...), '}'), nil
}

// escapeC1 writes JSON with C1 control characters (U+0080..U+009F, the
// 8-bit terminal escapes) and DEL as \u escapes, which encoding/json
// leaves raw: an answer printed to a terminal cannot drive it. In JSON
// these characters occur only inside strings, so the escape keeps the
// value. Each Write must hold whole characters (an Encoder's do).
type escapeC1 struct{ w io.Writer }

func (e escapeC1) Write(p []byte) (int, error) {
	if _, err := e.w.Write(EscapeC1(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// EscapeC1 is escapeC1's transformation, for other JSON writers (the CLI's
// --json).
func EscapeC1(p []byte) []byte {
	need := false
	for i := 0; i < len(p); i++ {
		if p[i] == 0x7f || (p[i] == 0xc2 && i+1 < len(p) && p[i+1] >= 0x80 && p[i+1] <= 0x9f) {
			need = true
			break
		}
	}
	if !need {
		return p
	}
	var b bytes.Buffer
	for i := 0; i < len(p); i++ {
		switch {
		case p[i] == 0x7f:
			b.WriteString(`\u007f`)
		case p[i] == 0xc2 && i+1 < len(p) && p[i+1] >= 0x80 && p[i+1] <= 0x9f:
			fmt.Fprintf(&b, `\u%04x`, rune(p[i+1]))
			i++
		default:
			b.WriteByte(p[i])
		}
	}
	return b.Bytes()
}
