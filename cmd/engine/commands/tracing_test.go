package commands_test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	srv   *httptest.Server
}

func newFakeCollector(t *testing.T) *fakeCollector {
	c := &fakeCollector{spans: map[string][]string{}}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
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
