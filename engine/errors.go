package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Conditions callers test with errors.Is. ErrNotFound and ErrLeaseLost are
// the engine's internal store's own values, so a condition is one error
// wherever it is detected.
var (
	// ErrWorkflowIDConflict: a run with this workflow ID exists with a
	// different input. Same ID and same input returns the existing run
	// instead (Stripe's rule for reused idempotency keys).
	ErrWorkflowIDConflict = errors.New("pgdurable: workflow ID already used with a different input")
	// ErrLeaseLost: another delivery took over the run; this delivery stopped
	// writing and started no further step.
	ErrLeaseLost = store.ErrLeaseLost
	// ErrNotFound: no run or dead job with that ID.
	ErrNotFound = store.ErrNotFound
	// ErrUnknownWorkflow: no workflow with that name is registered.
	ErrUnknownWorkflow = errors.New("pgdurable: unknown workflow")
	// ErrInvalidInput: the input does not encode or decode as the workflow's
	// input type, or is larger than Config.MaxPayloadBytes.
	ErrInvalidInput = errors.New("pgdurable: invalid input")
	// ErrDeadJobResolved: the dead job was already resolved another way
	// (replaying a discarded job, or discarding a replayed one).
	ErrDeadJobResolved = errors.New("pgdurable: dead job already resolved")
	// ErrInvalidArgument: a listing parameter (limit, cursor, status) is
	// out of range or malformed.
	ErrInvalidArgument = errors.New("pgdurable: invalid argument")
	// ErrRunNotFinished is returned by Workflow.Result for a run that has
	// not reached a terminal status, and by ReplayDeadJob and
	// DiscardDeadJob given the ID of a run that is still pending, running,
	// waiting or compensating (it has no dead job to resolve).
	ErrRunNotFinished = errors.New("pgdurable: run not finished")
	// ErrLimitExceeded: the request would take a run over one of its
	// bounds (Config.MaxSignalsPerRun, MaxSignalBytesPerRun); the message
	// names it.
	ErrLimitExceeded = errors.New("pgdurable: limit exceeded")
	// ErrSignalKeyConflict: the signal's idempotency key (SignalOpts.Key)
	// was sent to this run before with another name or payload. The same
	// key with the same name and payload is a retry, accepted and not
	// stored again.
	ErrSignalKeyConflict = errors.New("pgdurable: signal idempotency key already used with another signal")
)

// ErrCancelled is what forward steps return once the run's cancellation is
// requested; the workflow should return it. The run then compensates and
// ends cancelled.
var ErrCancelled = errors.New("pgdurable: run cancelled")

// ErrRunClosed: the run already finished: it completed, failed, was
// compensated, cancelled or terminated, or continued as new. Cancel,
// Signal, Terminate and StartNow return it for such a run (except that
// cancelling a cancelled run, or terminating a terminated one, succeeds:
// a retried request). Cancel returns it for a dead run too; a dead run
// still accepts signals and Terminate, since an operator may replay it.
// ReplayDeadJob and DiscardDeadJob return it for the ID of a finished run
// (a dead one included) that has no open dead job.
var ErrRunClosed = errors.New("pgdurable: run already finished")

// ErrTimeout is in the error of anything that timed out: AwaitSignal whose
// timeout passed before a signal arrived, a step or activity attempt past
// its StartToCloseTimeout, an activity's past its HeartbeatTimeout (with
// context.DeadlineExceeded), a step past its ScheduleToCloseTimeout.
// Recorded, so errors.Is answers the same on replay.
var ErrTimeout = errors.New("pgdurable: timed out")

// ErrScheduleExists: CreateSchedule with a name already in use.
var ErrScheduleExists = errors.New("pgdurable: schedule already exists")

// ErrRetriesExhausted is in the chain of the *StepError a step returns
// when it ran out of retries (see StepOpts.ReturnExhausted): errors.Is
// tells an exhausted step from one that failed permanently, live and on
// replay.
var ErrRetriesExhausted = errors.New("pgdurable: retries exhausted")

// errDeliveryEnded is what Step returns once the engine has ended this
// delivery (the run waits for a retry, was parked, or lost its lease).
// Workflow code should return it; whatever it returns is ignored.
var errDeliveryEnded = errors.New("pgdurable: delivery ended; return this error from the workflow")

// ErrorClass names the kind of a failure, recorded in step and run errors,
// in dead jobs (error_class) and in metrics' labels: one of the Class
// constants, or an error's own (snake_case, such as package activities'
// "http_503"; see WithClass). An error names its own class with a method
// ErrorClass() string.
type ErrorClass string

// Error classes, recorded in step and run errors and in dead_jobs.error_class.
const (
	ClassTransient      ErrorClass = "transient"        // any step error not marked otherwise: retried
	ClassPermanent      ErrorClass = "permanent"        // Permanent(err): recorded, not retried
	ClassPanic          ErrorClass = "panic"            // a recovered panic, with its stack
	ClassNonDeterminism ErrorClass = "nondeterminism"   // the code no longer replays the recorded steps
	ClassPoisonInput    ErrorClass = "poison_input"     // the stored input does not decode as the workflow's input type
	ClassCrashLoop      ErrorClass = "crash_loop"       // deliveries kept dying without recording progress
	ClassChildDead      ErrorClass = "child_dead"       // a child run the workflow waits for is parked as dead
	ClassUnserializable ErrorClass = "unserializable"   // a value json.Marshal rejects, or one holding a NUL character
	ClassWorkflow       ErrorClass = "workflow"         // the workflow function returned an error of its own
	ClassCancelled      ErrorClass = "cancelled"        // the run was cancelled (Engine.Cancel)
	ClassWorkerLost     ErrorClass = "worker_lost"      // an attempt began and never ended: its worker died or lost its lease
	ClassOutputTooLarge ErrorClass = "output_too_large" // a result whose JSON is over Config.MaxPayloadBytes
	ClassUnsettled      ErrorClass = "unsettled"        // a cancelled run could not learn an activity's outcome
	ClassTimeout        ErrorClass = "timeout"          // an attempt past its StartToCloseTimeout, a step past its ScheduleToCloseTimeout
	ClassTerminated     ErrorClass = "terminated"       // an operator ended the run at once (Engine.Terminate)
)

// ErrOutputTooLarge is in the error of a step, activity or workflow whose
// result encodes to more than Config.MaxPayloadBytes: it is refused before
// anything is stored. A step returns it (in a *StepError) on its one
// attempt, so the workflow can handle it; a workflow's own output parks the
// run as permanent_error.
var ErrOutputTooLarge = errors.New("pgdurable: output too large")

// ErrWorkerLost is in the error of an attempt that began and never ended
// because its worker died, or lost its lease, during it. Such an attempt
// counts like a failed one: it is retried after the policy's backoff, and
// counts toward MaximumAttempts.
var ErrWorkerLost = errors.New("pgdurable: worker lost during the attempt")

type noEffectError struct{ err error }

func (e *noEffectError) Error() string  { return e.err.Error() }
func (e *noEffectError) Unwrap() error  { return e.err }
func (e *noEffectError) NoEffect() bool { return true }

// NoEffect marks err as the failure of a call that certainly had no
// effect: the request never reached the service (connection refused, an
// unknown host) or the service refused it before acting (429 Too Many
// Requests). Errors may also say so themselves with a NoEffect() bool
// method (activities.HTTPError does for 4xx answers but 409). Retries are
// unchanged; what it changes is what a cancelled run does with an activity
// that does not heartbeat and has failed so far: when every failed attempt
// had no effect, no further attempt starts and the run compensates at
// once; when one may have taken effect (a timeout, a cut connection, a
// 5xx, a crash mid-call), the activity is retried with its request ID
// until its outcome is known, so that its undo runs if it took effect.
// NoEffect(nil) is nil.
func NoEffect(err error) error {
	if err == nil {
		return nil
	}
	return &noEffectError{err: err}
}

// hasNoEffect reports whether err says its call had no effect.
func hasNoEffect(err error) bool {
	var ne interface{ NoEffect() bool }
	return errors.As(err, &ne) && ne.NoEffect()
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as not worth retrying: the step fails on this attempt
// and its error is recorded and returned to the workflow. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err or anything it wraps was marked Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type retryAfterError struct {
	err   error
	delay time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter marks err as transient and asks for the next attempt no sooner
// than d from now (an HTTP Retry-After, say). The policy's backoff still
// applies when it is longer. RetryAfter(nil, d) is nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, delay: d}
}

// retriesExhaustedError wraps a step's last error once its retries ran out.
type retriesExhaustedError struct {
	attempts int
	err      error
}

func (e *retriesExhaustedError) Error() string {
	return fmt.Sprintf("retries exhausted after %d attempts: %s", e.attempts, errorText(e.err))
}
func (e *retriesExhaustedError) Unwrap() error        { return e.err }
func (e *retriesExhaustedError) Is(target error) bool { return target == ErrRetriesExhausted }

// StepError is what a step that failed returns to workflow code. It is
// decoded from the step's record, live and on replay alike, so every
// delivery sees the same error: Err is the recorded cause chain, in which
// errors.As finds registered error types (RegisterError) and errors.Is
// registered sentinels (RegisterSentinel, ErrTimeout, ErrRetriesExhausted,
// context.DeadlineExceeded, ...); other errors are *ApplicationError nodes
// with the original's type name and message.
type StepError struct {
	Step    string     // the step's name
	Seq     int        // its position in the run, from 0
	Attempt int        // the attempt that failed, from 1
	Class   ErrorClass // ClassPermanent, ClassUnserializable, "http_402", ...
	Message string     // the error's text
	Err     error      // the recorded error chain
}

// Error renders the step, its position and attempt, and the message.
func (e *StepError) Error() string {
	return fmt.Sprintf("step %q (seq %d, attempt %d): %s", e.Step, e.Seq, e.Attempt, e.Message)
}

// Unwrap returns the step's error.
func (e *StepError) Unwrap() error { return e.Err }

// ErrorInfo is a recorded failure as stored in the error column of runs and
// steps and shown by the HTTP API (JSON, the fields below with snake_case
// names). Class, Step, Seq, Attempt and Stack describe the failure; Type,
// Registered, Code, Details, Is and Cause (Causes for errors.Join) describe
// the error itself and its chain, each cause an ErrorInfo of its own.
type ErrorInfo struct {
	Class   ErrorClass `json:"class,omitempty"`
	Message string     `json:"message"`
	// Type is the Go type of the error (fmt's %T).
	Type string `json:"type,omitempty"`
	// Registered is the RegisterError name the error was recorded under.
	Registered string `json:"registered,omitempty"`
	// Code is the error's ErrorCode(), if it has one.
	Code string `json:"code,omitempty"`
	// Details is the JSON of a registered error.
	Details json.RawMessage `json:"details,omitempty"`
	// Is names the registered sentinels the error is.
	Is     []string     `json:"is,omitempty"`
	Cause  *ErrorInfo   `json:"cause,omitempty"`
	Causes []*ErrorInfo `json:"causes,omitempty"`

	Step    string `json:"step,omitempty"`
	Seq     *int   `json:"seq,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	Stack   string `json:"stack,omitempty"`
	// ForwardError, on a run whose compensation failed, is the failure
	// that started the compensation.
	ForwardError *ErrorInfo `json:"forward_error,omitempty"`
	// NoEffect, on a step waiting for a retry: every attempt so far failed
	// with an error marked NoEffect, so none took effect.
	NoEffect bool `json:"no_effect,omitempty"`
	// SettleAttempts, on an activity of a cancelled run: attempts made since
	// the cancellation to learn whether it took effect.
	SettleAttempts int `json:"settle_attempts,omitempty"`
}

// newErrorInfo records err with class: its message and its chain.
func newErrorInfo(err error, class ErrorClass) *ErrorInfo {
	info := &ErrorInfo{Class: class, Message: errorText(err)}
	encodeError(info, err)
	return info
}

// Err returns the error info records, decoded as workflow code and
// Workflow.Wait see it (see StepError).
func (e *ErrorInfo) Err() error { return decodeError(e) }

func (e *ErrorInfo) json() []byte {
	b, err := json.Marshal(e.storable())
	if err != nil {
		// Details are checked JSON; should one still fail, keep the rest.
		c := e.storable()
		c.strip()
		b, _ = json.Marshal(c)
	}
	return b
}

// storable is a copy whose text PostgreSQL can store.
func (e *ErrorInfo) storable() *ErrorInfo {
	if e == nil {
		return nil
	}
	c := *e
	c.Class, c.Message, c.Step, c.Stack = ErrorClass(storableText(string(c.Class))), storableText(c.Message), storableText(c.Step), storableText(c.Stack)
	c.Type, c.Code, c.Registered = storableText(c.Type), storableText(c.Code), storableText(c.Registered)
	if c.Details != nil && checkStorable(c.Details) != nil {
		c.Details, c.Registered = nil, ""
	}
	c.Cause, c.ForwardError = c.Cause.storable(), c.ForwardError.storable()
	c.Causes = nil
	for _, x := range e.Causes {
		c.Causes = append(c.Causes, x.storable())
	}
	return &c
}

func (e *ErrorInfo) strip() {
	if e == nil {
		return
	}
	e.Details, e.Registered = nil, ""
	e.Cause.strip()
	e.ForwardError.strip()
	for _, c := range e.Causes {
		c.strip()
	}
}

// truncateText cuts s to at most n bytes on a UTF-8 boundary.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// storableText makes an error's text storable in Postgres text and jsonb:
// invalid UTF-8 and NUL characters (which Postgres rejects) become U+FFFD,
// so a strange error message can never turn a recorded failure into a
// failed write.
func storableText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

func decodeErrorInfo(b []byte) *ErrorInfo {
	if len(b) == 0 {
		return nil
	}
	var e ErrorInfo
	if err := json.Unmarshal(b, &e); err != nil {
		return &ErrorInfo{Class: "unknown", Message: string(b)}
	}
	return &e
}

// maxStackBytes bounds a recorded stack trace.
const maxStackBytes = 16 << 10

func truncateStack(s []byte) string {
	if len(s) > maxStackBytes {
		s = s[:maxStackBytes]
	}
	return string(s)
}

// checkName validates a name stored as text (a workflow or step name, a
// workflow ID, a signal name): 1 to max bytes of UTF-8 without control or
// format characters (terminal escapes, bidi overrides, zero-width
// characters), line or paragraph separators, or white space at either end,
// so a name shows an operator what it is. Names are quoted (%q) in its
// errors for the same reason.
// checkWorkflowID checks a workflow ID: a name of 1 to 400 bytes, and not
// "." or "..", which no URL path can carry as a segment (the HTTP API
// takes a workflow ID wherever it takes a run ID).
func checkWorkflowID(id string) error {
	if id == "." || id == ".." {
		return fmt.Errorf("workflow ID %q is a path segment no URL can carry (. and .. are refused)", id)
	}
	return checkName("workflow ID", id, 400)
}

// checkChosenWorkflowID is checkWorkflowID for a workflow ID a caller
// chose (StartOpts.WorkflowID, ChildOpts.WorkflowID): it must not parse as
// a UUID, in any spelling uuid.Parse reads (upper case, braces, urn:uuid:,
// no dashes). Run IDs are UUIDs and name runs wherever a workflow ID does
// (GetRun, FindRun, Cancel, Terminate, Signal, the HTTP API, the CLI), a
// run ID first: a chosen workflow ID that spelled another run's ID would
// aim an operator's cancel at that other run.
func checkChosenWorkflowID(id string) error {
	if err := checkWorkflowID(id); err != nil {
		return err
	}
	if _, err := uuid.Parse(id); err == nil {
		return fmt.Errorf("workflow ID %q parses as a UUID, and run IDs are UUIDs: a chosen workflow ID cannot be one, "+
			"since it could name another run where run IDs are taken; give it a prefix (\"order-%s\")", truncateText(id, 64), truncateText(id, 64))
	}
	if run, seq, ok := strings.Cut(id, ":"); ok && seq != "" && strings.Trim(seq, "0123456789") == "" {
		if _, err := uuid.Parse(run); err == nil {
			return fmt.Errorf("workflow ID %q has the shape of a child run's default ID (<parent run ID>:<position>), "+
				"which no other run may take: choose another", truncateText(id, 64))
		}
	}
	return nil
}

func checkName(kind, name string, max int) error {
	switch {
	case len(name) == 0 || len(name) > max:
		return fmt.Errorf("%s %q must be 1 to %d bytes", kind, truncateText(name, 64), max)
	case !utf8.ValidString(name):
		return fmt.Errorf("%s %q is not valid UTF-8", kind, name)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("%s %q contains a NUL character", kind, name)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("%s %q contains a control character", kind, name)
	case strings.ContainsFunc(name, func(r rune) bool { return unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) }):
		return fmt.Errorf("%s %q contains an invisible character (a format character or a line separator)", kind, name)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("%s %q begins or ends with white space", kind, name)
	}
	return nil
}

// classed is implemented by errors that name their own class, such as the
// HTTP errors of package activities ("http_503", "timeout"); the class is
// recorded in error_class.
type classed interface{ ErrorClass() string }

// classOf returns err's own class, or def.
func classOf(err error, def ErrorClass) ErrorClass {
	var c classed
	if errors.As(err, &c) && c.ErrorClass() != "" {
		return ErrorClass(c.ErrorClass())
	}
	return def
}

type classedError struct {
	err   error
	class ErrorClass
}

func (e *classedError) Error() string      { return e.err.Error() }
func (e *classedError) Unwrap() error      { return e.err }
func (e *classedError) ErrorClass() string { return string(e.class) }

// WithClass labels err with an error class for records, logs and metrics
// (snake_case, e.g. "http_429", "timeout"). Retry behaviour is unchanged:
// combine with Permanent or RetryAfter. WithClass(nil, c) is nil.
func WithClass(err error, class ErrorClass) error {
	if err == nil {
		return nil
	}
	return &classedError{err: err, class: class}
}
