package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sync"
)

// Errors are recorded as values, so workflow code sees the same error on
// every delivery. A step's error is encoded when it is recorded: each
// error of its chain (errors.Unwrap, and Unwrap() []error for errors.Join)
// becomes a node with its Go type name, message, code, JSON details and the
// names of the registered sentinels it is. What the step returns, live and
// on replay alike, is decoded from that record:
//
//   - a node whose type was registered with RegisterError decodes to an
//     *ApplicationError holding a value of that type, so errors.As into the
//     user's type works;
//   - a node that was a registered sentinel (RegisterSentinel, and the
//     built-in context.Canceled, context.DeadlineExceeded, io.EOF,
//     io.ErrUnexpectedEOF, ErrTimeout, ErrRetriesExhausted, ErrCancelled,
//     ErrEndsTransaction)
//     answers errors.Is for it;
//   - any other node decodes to an *ApplicationError with the original's
//     type name, message and code: errors.As into the original type is
//     false live and on replay alike, so a workflow never takes one branch
//     on the first delivery and another on the next.

// maxErrorDepth bounds the recorded chain; deeper causes are dropped.
const maxErrorDepth = 16

// maxErrorMessage bounds the recorded message of an error, maxCauseMessage
// that of each cause (whose text the wrapping messages usually repeat), and
// maxErrorDetails each node's details; longer ones are cut (messages) or
// dropped (details). A recorded error stays under about 300 KiB.
const (
	maxErrorMessage = 8 << 10
	maxCauseMessage = 2 << 10
	maxErrorDetails = 16 << 10
)

// ApplicationError is what a recorded error decodes to: workflow code gets
// it (inside a *StepError) for a failed step, and callers of Workflow.Wait
// inside a *RunError. Its fields are what was recorded of the original.
// NewApplicationError builds one directly, for errors that carry a code and
// details without a Go type of their own (Temporal's ApplicationError).
//
// errors.Is and errors.As see through it: it is every registered sentinel
// the original was, As finds a registered type's decoded value, and Unwrap
// returns the recorded causes.
type ApplicationError struct {
	// Type is the original's Go type as fmt's %T prints it
	// ("*payment.DeclineError", "*net.OpError"); "" for NewApplicationError.
	Type string
	// Code is the original's ErrorCode(), when it has that method.
	Code string
	// Message is the original's Error().
	Message string
	// Details is the original's JSON when its type was registered (or the
	// details given to NewApplicationError), else nil. Compare it by value:
	// key order and spacing may differ between deliveries.
	Details json.RawMessage

	registered string // the registry name value was decoded under
	value      error  // the decoded value of a registered type
	sentinels  []error
	causes     []error
}

// NewApplicationError returns an error with a code (a stable string to
// branch on, e.g. "card_declined"), a message, details (any JSON-encodable
// value; nil for none) and an optional cause. It survives replay without
// registration: errors.As(err, &appErr) and appErr.Code work the same on
// every delivery. Details that do not encode are dropped.
func NewApplicationError(code, message string, details any, cause error) *ApplicationError {
	e := &ApplicationError{Code: code, Message: message}
	if details != nil {
		if b, err := json.Marshal(details); err == nil {
			e.Details = b
		}
	}
	if cause != nil {
		e.causes = []error{cause}
	}
	return e
}

// Error returns the recorded message.
func (e *ApplicationError) Error() string { return e.Message }

// Unwrap returns the recorded causes, in order.
func (e *ApplicationError) Unwrap() []error { return e.causes }

// Is reports whether the original was target, a registered sentinel.
func (e *ApplicationError) Is(target error) bool {
	for _, s := range e.sentinels {
		if s == target {
			return true
		}
	}
	return false
}

// As finds the decoded value of a registered type.
func (e *ApplicationError) As(target any) bool {
	return e.value != nil && errors.As(e.value, target)
}

// Value returns the decoded value of a registered type, or nil.
func (e *ApplicationError) Value() error { return e.value }

// registry holds the error types and sentinels that survive replay.
var registry = struct {
	sync.RWMutex
	byName     map[string]*errorEntry
	byType     map[reflect.Type]*errorEntry
	sentinels  []*errorEntry
	builtinSet bool
}{byName: map[string]*errorEntry{}, byType: map[reflect.Type]*errorEntry{}}

type errorEntry struct {
	name     string
	typ      reflect.Type // for a type
	sentinel error        // for a sentinel
	decode   func(details []byte) (error, error)
}

// RegisterError makes errors of type T (usually a pointer to a struct)
// survive replay under name, a stable string stored in records
// ("payment.DeclineError"): the error's JSON (json.Marshal of the value, so
// exported fields or a MarshalJSON) is recorded, and decoding it gives
// errors.As(err, &target) the same answer on every delivery. Register
// before any engine runs a workflow that records the type, in every process
// (package-level var initialization is a good place); registering the same
// type under the same name again is a no-op.
//
// Errors: name is empty, longer than 200 bytes or not valid UTF-8; T is an
// interface type; name is taken by another type or sentinel; T is
// registered under another name.
func RegisterError[T error](name string) error {
	t := reflect.TypeFor[T]()
	if t.Kind() == reflect.Interface {
		return fmt.Errorf("pgdurable: RegisterError needs a concrete error type, not the interface %s", t)
	}
	return register(&errorEntry{name: name, typ: t, decode: func(b []byte) (error, error) {
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, err
		}
		return v, nil
	}})
}

// RegisterSentinel makes errors.Is(err, sentinel) survive replay: a
// recorded error that was sentinel (==, or by its Is method) decodes to one
// that is. name is stored in records ("payment.ErrOutOfStock"). The same
// rules as RegisterError apply; sentinel must be non-nil and comparable.
func RegisterSentinel(name string, sentinel error) error {
	if sentinel == nil {
		return fmt.Errorf("pgdurable: sentinel %q is nil", name)
	}
	if !reflect.TypeOf(sentinel).Comparable() {
		return fmt.Errorf("pgdurable: sentinel %q has the incomparable type %T", name, sentinel)
	}
	return register(&errorEntry{name: name, sentinel: sentinel})
}

func register(e *errorEntry) error {
	if err := checkName("error name", e.name, 200); err != nil {
		return fmt.Errorf("pgdurable: %w", err)
	}
	registry.Lock()
	defer registry.Unlock()
	if old, ok := registry.byName[e.name]; ok {
		if (e.typ != nil && old.typ == e.typ) || (e.sentinel != nil && old.sentinel == e.sentinel) {
			return nil
		}
		return fmt.Errorf("pgdurable: error name %q is already registered for another error", e.name)
	}
	if e.typ != nil {
		if old, ok := registry.byType[e.typ]; ok {
			return fmt.Errorf("pgdurable: error type %s is already registered as %q", e.typ, old.name)
		}
		registry.byType[e.typ] = e
	} else {
		for _, old := range registry.sentinels {
			if old.sentinel == e.sentinel {
				return fmt.Errorf("pgdurable: sentinel %q is already registered as %q", e.name, old.name)
			}
		}
		registry.sentinels = append(registry.sentinels, e)
	}
	registry.byName[e.name] = e
	return nil
}

// The engine's own sentinels and types, registered with the package.
var _ = func() error {
	for name, s := range map[string]error{
		"context.Canceled":                context.Canceled,
		"context.DeadlineExceeded":        context.DeadlineExceeded,
		"io.EOF":                          io.EOF,
		"io.ErrUnexpectedEOF":             io.ErrUnexpectedEOF,
		"pgdurable.ErrTimeout":            ErrTimeout,
		"pgdurable.ErrRetriesExhausted":   ErrRetriesExhausted,
		"pgdurable.ErrCancelled":          ErrCancelled,
		"pgdurable.ErrWorkerLost":         ErrWorkerLost,
		"pgdurable.ErrOutputTooLarge":     ErrOutputTooLarge,
		"pgdurable.ErrInvalidInput":       ErrInvalidInput,
		"pgdurable.ErrWorkflowIDConflict": ErrWorkflowIDConflict,
		"pgdurable.ErrEndsTransaction":    ErrEndsTransaction,
	} {
		if err := RegisterSentinel(name, s); err != nil {
			panic(err) // the engine's own names: a programming error
		}
	}
	if err := RegisterError[*PanicError]("pgdurable.PanicError"); err != nil {
		panic(err)
	}
	return nil
}()

// stepErrorType is StepError's registry name; it is encoded by hand (its
// Err is the cause chain).
const stepErrorType = "pgdurable.StepError"

// stepErrorDetails is what a *StepError node records besides its cause.
type stepErrorDetails struct {
	Step    string     `json:"step"`
	Seq     int        `json:"seq"`
	Attempt int        `json:"attempt"`
	Class   ErrorClass `json:"class"`
	Message string     `json:"message"`
}

// encodeError records err's chain into info (Type, Code, Details, Is,
// Cause/Causes; Message is set by the caller). The engine's own control
// wrappers (Permanent, RetryAfter, WithClass) are transparent: they add no
// node.
func encodeError(info *ErrorInfo, err error) {
	encodeNode(info, err, 0)
	bound(info)
}

func encodeNode(info *ErrorInfo, err error, depth int) {
	err = skipControl(err)
	if err == nil {
		return
	}
	var causes []error
	switch n := err.(type) {
	case *ApplicationError:
		// Already decoded (a recorded error passed on): record it as it was.
		info.Type, info.Code, info.Details, info.Registered = n.Type, n.Code, canonical(n.Details), n.registered
		for _, s := range n.sentinels {
			if name := sentinelName(s); name != "" {
				info.Is = append(info.Is, name)
			}
		}
		causes = n.causes
	case *StepError:
		info.Type, info.Registered = "*engine.StepError", stepErrorType
		info.Details, _ = json.Marshal(stepErrorDetails{Step: n.Step, Seq: n.Seq, Attempt: n.Attempt, Class: n.Class, Message: n.Message})
		if n.Err != nil {
			causes = []error{n.Err}
		}
	default:
		info.Type = fmt.Sprintf("%T", err)
		if c, ok := err.(interface{ ErrorCode() string }); ok {
			info.Code = safeString(c.ErrorCode)
		}
		registry.RLock()
		entry := registry.byType[reflect.TypeOf(err)]
		sentinels := registry.sentinels
		registry.RUnlock()
		if entry != nil {
			if b, jerr := json.Marshal(err); jerr == nil && checkStorable(b) == nil {
				info.Registered, info.Details = entry.name, canonical(b)
			}
		}
		for _, s := range sentinels {
			if isOneLevel(err, s.sentinel) {
				info.Is = append(info.Is, s.name)
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			if c := u.Unwrap(); c != nil {
				causes = []error{c}
			}
		case interface{ Unwrap() []error }:
			causes = u.Unwrap()
		}
	}
	if depth+1 >= maxErrorDepth {
		return
	}
	for _, c := range causes {
		if c == nil {
			continue
		}
		child := &ErrorInfo{Message: errorText(c)}
		encodeNode(child, c, depth+1)
		if len(causes) == 1 {
			info.Cause = child
		} else {
			info.Causes = append(info.Causes, child)
		}
	}
}

// skipControl unwraps the engine's control wrappers, which say how to
// retry an error and are not part of what it is.
func skipControl(err error) error {
	for {
		switch e := err.(type) {
		case *permanentError:
			err = e.err
		case *retryAfterError:
			err = e.err
		case *classedError:
			err = e.err
		case *noEffectError:
			err = e.err
		default:
			return err
		}
	}
}

// isOneLevel is errors.Is without following the chain: err is target
// itself, or says so with its Is method. User code is called, so panics
// (an Is on a nil receiver) count as no.
func isOneLevel(err, target error) (is bool) {
	defer func() {
		if recover() != nil {
			is = false
		}
	}()
	if reflect.TypeOf(err).Comparable() && err == target {
		return true
	}
	if x, ok := err.(interface{ Is(error) bool }); ok {
		return x.Is(target)
	}
	return false
}

func sentinelName(s error) string {
	registry.RLock()
	defer registry.RUnlock()
	for _, e := range registry.sentinels {
		if e.sentinel == s {
			return e.name
		}
	}
	return ""
}

// errorText is err.Error(), guarded against a panicking Error method (a
// typed nil pointer) and made storable.
func errorText(err error) string { return storableText(safeString(err.Error)) }

func safeString(f func() string) (s string) {
	defer func() {
		if r := recover(); r != nil {
			s = fmt.Sprintf("(Error method panicked: %v)", r)
		}
	}()
	return f()
}

// canonical re-encodes JSON with sorted keys, so the details a workflow
// sees are the same bytes live and after PostgreSQL's jsonb reorders them.
func canonical(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return out
}

// bound keeps a recorded error small: long messages are cut, large details
// dropped (the node then decodes as an unregistered one, with its message).
func bound(info *ErrorInfo) { boundNode(info, maxErrorMessage) }

func boundNode(info *ErrorInfo, maxMessage int) {
	info.Message = truncateText(info.Message, maxMessage)
	if len(info.Details) > maxErrorDetails {
		info.Details, info.Registered = nil, ""
	}
	if info.Cause != nil {
		boundNode(info.Cause, maxCauseMessage)
	}
	for _, c := range info.Causes {
		boundNode(c, maxCauseMessage)
	}
}

// decodeError rebuilds the error info records: what workflow code and
// callers see, the same for the same record in any process that registered
// the same types. An old record without a chain decodes to its message.
func decodeError(info *ErrorInfo) error {
	if info == nil {
		return nil
	}
	var causes []error
	if info.Cause != nil {
		causes = append(causes, decodeError(info.Cause))
	}
	for _, c := range info.Causes {
		causes = append(causes, decodeError(c))
	}
	if info.Registered == stepErrorType {
		var d stepErrorDetails
		if json.Unmarshal(info.Details, &d) == nil {
			se := &StepError{Step: d.Step, Seq: d.Seq, Attempt: d.Attempt, Class: d.Class, Message: d.Message}
			if len(causes) > 0 {
				se.Err = causes[0]
			}
			return se
		}
	}
	ae := &ApplicationError{Type: info.Type, Code: info.Code, Message: info.Message, Details: canonical(info.Details), causes: causes}
	registry.RLock()
	for _, name := range info.Is {
		if e, ok := registry.byName[name]; ok && e.sentinel != nil {
			ae.sentinels = append(ae.sentinels, e.sentinel)
		}
	}
	entry := registry.byName[info.Registered]
	registry.RUnlock()
	if entry != nil && entry.decode != nil {
		if v, err := entry.decode(info.Details); err == nil && v != nil {
			ae.value, ae.registered = v, entry.name
		}
	}
	return ae
}

// PanicError is how a panic in a step or the workflow function is recorded:
// a run parked for a panic reports it (Workflow.Wait returns a *RunError
// that errors.As finds a *PanicError in). Its stack is in the dead job.
type PanicError struct {
	// Value is the panic's value as fmt's %v prints it.
	Value string `json:"value"`
}

// Error renders the panic.
func (e *PanicError) Error() string { return "panic: " + e.Value }
