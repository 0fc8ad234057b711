package activities_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/engine"
)

type classed interface{ ErrorClass() string }

func classOf(err error) string {
	var c classed
	if errors.As(err, &c) {
		return c.ErrorClass()
	}
	return ""
}

func response(code int, header ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	return &http.Response{StatusCode: code, Status: fmt.Sprintf("%d %s", code, http.StatusText(code)),
		Header: h, Body: io.NopCloser(strings.NewReader(`{"error":"x"}`))}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	timeoutErr := &net.OpError{Op: "read", Err: &timeoutError{}}
	for _, tc := range []struct {
		name      string
		resp      *http.Response
		err       error
		ok        bool
		permanent bool
		class     string
		after     time.Duration
	}{
		{name: "200", resp: response(200), ok: true},
		{name: "302", resp: response(302), ok: true},
		{name: "400", resp: response(400), permanent: true, class: "http_400"},
		{name: "401", resp: response(401), permanent: true, class: "http_401"},
		{name: "402 decline", resp: response(402), permanent: true, class: "http_402"},
		{name: "404", resp: response(404), permanent: true, class: "http_404"},
		{name: "408", resp: response(408), class: "http_408"},
		{name: "409 in flight", resp: response(409), class: "http_409"},
		{name: "429", resp: response(429, "Retry-After", "2"), class: "http_429", after: 2 * time.Second},
		{name: "500", resp: response(500), class: "http_500"},
		{name: "503 retry-after date", resp: response(503, "Retry-After", time.Now().Add(90*time.Second).UTC().Format(http.TimeFormat)), class: "http_503", after: 88 * time.Second},
		{name: "503 bad retry-after", resp: response(503, "Retry-After", "soon"), class: "http_503"},
		{name: "timeout", err: timeoutErr, class: "timeout"},
		{name: "deadline", err: context.DeadlineExceeded, class: "timeout"},
		{name: "reset", err: &net.OpError{Op: "read", Err: syscall.ECONNRESET}, class: "connection_reset"},
		{name: "eof", err: io.ErrUnexpectedEOF, class: "connection_reset"},
		{name: "refused", err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, class: "connection_refused"},
		{name: "other", err: errors.New("tls: bad certificate"), class: "network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := activities.Classify(tc.resp, tc.err)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Equal(t, tc.permanent, engine.IsPermanent(err))
			require.Equal(t, tc.class, classOf(err))
			var he *activities.HTTPError
			if errors.As(err, &he) {
				require.GreaterOrEqual(t, he.RetryAfter, tc.after)
				require.LessOrEqual(t, he.RetryAfter, tc.after+3*time.Second)
				require.Contains(t, err.Error(), `{"error":"x"}`, "the body's start is in the error")
			}
		})
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func TestTransportSetsIdempotencyKeyOnlyInsideActivities(t *testing.T) {
	t.Parallel()
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Idempotency-Key"))
	}))
	defer srv.Close()
	client := activities.NewHTTPClient(time.Second)
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()

	req, err = http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "caller-chose")
	resp, err = client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, []string{"", "caller-chose"}, got, "outside an activity the transport changes nothing")
}
