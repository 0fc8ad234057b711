package commands_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// fakeCollector receives OTLP/HTTP trace exports and keeps each span's
// name under its trace ID.
type fakeCollector struct {
	mu    sync.Mutex
	spans map[string][]string
	auth  map[string]bool // the Authorization headers of the exports
	srv   *httptest.Server
}

func newFakeCollector(t *testing.T) *fakeCollector {
	c := &fakeCollector{spans: map[string][]string{}, auth: map[string]bool{}}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.auth[r.Header.Get("Authorization")] = true
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					id := hex.EncodeToString(s.TraceId)
					c.spans[id] = append(c.spans[id], s.Name)
				}
			}
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(nil)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *fakeCollector) names(traceID string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.spans[traceID])
	slices.Sort(out)
	return out
}

// serve exports spans over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is
// set, and an API client's traceparent makes the run part of its trace.
func TestServeExportsTracesOverOTLP(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	collector := newFakeCollector(t)
	listen := freePort(t)
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.srv.URL, "OTEL_SERVICE_NAME": "shop-engine"}
	ctx, cancel := context.WithCancel(context.Background())
	errOut := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- commands.Execute(ctx, []string{"--database-url", db.URL, "serve", "--migrate", "--listen", listen, "--log-level", "warn"},
			commands.Options{Workflows: workflows(), Stdout: io.Discard, Stderr: errOut, Getenv: func(k string) string { return env[k] }})
	}()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest("POST", "http://"+listen+"/v1/workflows/double/runs", strings.NewReader(`{"id": "traced-1", "input": {"n": 21}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			break
		}
		require.True(t, time.Now().Before(deadline), "serve never listened: %s", errOut.String())
		time.Sleep(100 * time.Millisecond)
	}
	for {
		resp, err := http.Get("http://" + listen + "/v1/runs/traced-1")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), `"status":"completed"`) {
			break
		}
		require.True(t, time.Now().Before(deadline), "the run never completed: %s", body)
		time.Sleep(50 * time.Millisecond)
	}
	cancel() // serve stops and flushes its spans
	require.Equal(t, 0, <-done, errOut.String())
	require.Equal(t, []string{"pgdurable.claim", "pgdurable.run double", "pgdurable.start double", "pgdurable.step double"},
		collector.names(traceID), "the client's trace holds the run's spans")
}

// Without an endpoint nothing is exported, and a bad exporter setting is
// a usage error.
func TestServeTracingSettings(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	for _, bad := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "zipkin"},
	} {
		var errOut strings.Builder
		code := commands.Execute(context.Background(), []string{"--database-url", db.URL, "serve", "--migrate", "--listen", freePort(t)},
			commands.Options{Workflows: workflows(), Stdout: io.Discard, Stderr: &errOut, Getenv: func(k string) string { return bad[k] }})
		require.Equal(t, 2, code, "%v: %s", bad, errOut.String())
	}
}

// An OTLP endpoint that does not parse is refused before the exporter
// reads it, with its password redacted: the exporter logged it whole
// (found by an attack pass). One with user:password works: the
// credentials go to the collector as basic authentication, and no log
// line shows the password. The exporter reads the process's environment
// itself, so this test sets it (and does not run in parallel).
func TestServeKeepsTheOTLPEndpointPasswordOutOfItsOutput(t *testing.T) {
	db := enginetest.NewDB(t)
	var otelLog syncBuffer // what OpenTelemetry logs, unless serve routes it to its own log
	otel.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(&otelLog, nil)))
	const password = "s3cret-pass"
	for _, bad := range []struct{ name, value, shown string }{
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-user:" + password + "@collector:notaport", `"http://otel-user:xxxxx@collector:notaport"`},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-user:" + password + "@coll ector:4318", `"http://otel-user:xxxxx@coll ector:4318"`},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-user:s3cret%zzpass@collector:4318", `"http://otel-user:xxxxx@collector:4318"`},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "otel-user:" + password + "@collector:4318", `"otel-user:xxxxx@collector:4318"`},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://otel-user:s3cret/pass@collector:4318", `"http://otel-user:xxxxx@collector:4318"`},
	} {
		t.Run(bad.value, func(t *testing.T) {
			t.Setenv(bad.name, bad.value)
			if bad.name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
				t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:1/v1/traces") // a good one does not hide the bad one
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var errOut syncBuffer
			code := commands.Execute(ctx, []string{"--database-url", db.URL, "serve", "--migrate", "--listen", freePort(t)},
				commands.Options{Workflows: workflows(), Stdout: io.Discard, Stderr: &errOut, Getenv: os.Getenv})
			require.Equal(t, 2, code, errOut.String())
			require.Contains(t, errOut.String(), bad.name+" "+bad.shown+" is not an OTLP/HTTP endpoint")
			for _, secret := range []string{password, "s3cret", "pass@"} {
				require.NotContains(t, errOut.String()+otelLog.String(), secret)
			}
		})
	}

	collector := newFakeCollector(t)
	host := strings.TrimPrefix(collector.srv.URL, "http://")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-user:"+password+"@"+host)
	listen := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	errOut := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- commands.Execute(ctx, []string{"--database-url", db.URL, "serve", "--migrate", "--listen", listen},
			commands.Options{Workflows: workflows(), Stdout: io.Discard, Stderr: errOut, Getenv: os.Getenv})
	}()
	const traceID = "5bf92f3577b34da6a3ce929d0e0e4737"
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest("POST", "http://"+listen+"/v1/workflows/double/runs", strings.NewReader(`{"id": "traced-auth", "input": {"n": 1}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			break
		}
		require.True(t, time.Now().Before(deadline), "serve never listened: %s", errOut.String())
		time.Sleep(100 * time.Millisecond)
	}
	for {
		resp, err := http.Get("http://" + listen + "/v1/runs/traced-auth")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), `"status":"completed"`) {
			break
		}
		require.True(t, time.Now().Before(deadline), "the run never completed: %s", body)
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	require.Equal(t, 0, <-done, errOut.String())
	require.NotEmpty(t, collector.names(traceID), "the spans were exported")
	collector.mu.Lock()
	auth := collector.auth
	collector.mu.Unlock()
	require.Equal(t, map[string]bool{"Basic " + base64.StdEncoding.EncodeToString([]byte("otel-user:"+password)): true}, auth)
	require.Contains(t, errOut.String(), `"endpoint":"http://`+host+`/v1/traces"`, "the log names the endpoint, without its user")
	require.NotContains(t, errOut.String()+otelLog.String(), password)
}
