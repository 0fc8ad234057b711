package crashtest

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// EnvWorkerTraceFile, given to StartWorker as EnvWorkerTraceFile+"=path",
// has the worker's engine trace to path: each span is appended as a JSON
// line (a SpanLine) the moment it ends, with a write that a SIGKILL right
// after cannot undo. ReadSpanFile reads them back.
const EnvWorkerTraceFile = "PGDURABLE_ENGINETEST_WORKER_TRACE_FILE"

// SpanLine is an ended span as a trace file holds it.
type SpanLine struct {
	TraceID      string            `json:"trace_id"`
	SpanID       string            `json:"span_id"`
	ParentSpanID string            `json:"parent_span_id"`
	Name         string            `json:"name"`
	Attributes   map[string]string `json:"attributes"`
	Error        string            `json:"error,omitempty"` // the status description of a failed span
	PID          int               `json:"pid"`
}

// NewSpanLine turns an ended span into a SpanLine of process pid.
func NewSpanLine(s sdktrace.ReadOnlySpan, pid int) SpanLine {
	l := SpanLine{TraceID: s.SpanContext().TraceID().String(), SpanID: s.SpanContext().SpanID().String(),
		Name: s.Name(), Attributes: map[string]string{}, PID: pid}
	if s.Parent().IsValid() {
		l.ParentSpanID = s.Parent().SpanID().String()
	}
	for _, kv := range s.Attributes() {
		l.Attributes[string(kv.Key)] = kv.Value.String()
	}
	if s.Status().Code == codes.Error {
		l.Error = s.Status().Description
	}
	return l
}

// fileExporter writes each span to its file as a JSON line.
type fileExporter struct {
	mu sync.Mutex
	f  *os.File
}

func (x *fileExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, s := range spans {
		b, err := json.Marshal(NewSpanLine(s, os.Getpid()))
		if err != nil {
			return err
		}
		if _, err := x.f.Write(append(b, '\n')); err != nil {
			return err
		}
	}
	return nil
}

func (x *fileExporter) Shutdown(context.Context) error { return x.f.Close() }

// NewFileTracerProvider returns a TracerProvider that appends each span to
// path as it ends (see EnvWorkerTraceFile).
func NewFileTracerProvider(path string) (*sdktrace.TracerProvider, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(&fileExporter{f: f})), nil
}

// ReadSpanFile reads the spans a worker wrote to path (none if it wrote
// none).
func ReadSpanFile(t testing.TB, path string) []SpanLine {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("reading spans: %v", err)
	}
	defer f.Close()
	var out []SpanLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l SpanLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("reading spans: %v", err) // a line cut by the kill would be the last: none is, the write is one syscall
		}
		out = append(out, l)
	}
	return out
}
