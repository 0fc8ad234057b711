package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/httpapi"
)

// openAPIDoc is the embedded document, parsed once, with a validator of
// its schemas (JSON Schema 2020-12, OpenAPI 3.1's dialect).
type openAPIDoc struct {
	raw      map[string]any
	compiler *jsonschema.Compiler
	mux      *http.ServeMux // the document's paths, to find a request's operation
	mu       sync.Mutex     // guards schemas (the compiler is not safe for concurrent use)
	schemas  map[string]*jsonschema.Schema
}

const openAPIURL = "file:///openapi.json"

var (
	loadOpenAPIOnce sync.Once
	openAPIShared   *openAPIDoc
	openAPIErr      error
)

// loadOpenAPI parses the document that GET /v1/openapi.json serves.
func loadOpenAPI(t *testing.T) *openAPIDoc {
	t.Helper()
	loadOpenAPIOnce.Do(func() {
		var raw map[string]any
		if openAPIErr = json.Unmarshal(httpapi.OpenAPIDocument(), &raw); openAPIErr != nil {
			return
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(httpapi.OpenAPIDocument()))
		if err != nil {
			openAPIErr = err
			return
		}
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		c.AssertFormat()
		if openAPIErr = c.AddResource(openAPIURL, doc); openAPIErr != nil {
			return
		}
		d := &openAPIDoc{raw: raw, compiler: c, mux: http.NewServeMux(), schemas: map[string]*jsonschema.Schema{}}
		for path, item := range raw["paths"].(map[string]any) {
			for method := range item.(map[string]any) {
				pattern := strings.ToUpper(method) + " " + path
				if path == "/" {
					pattern += "{$}"
				}
				d.mux.Handle(pattern, http.NotFoundHandler())
			}
		}
		openAPIShared = d
	})
	require.NoError(t, openAPIErr)
	return openAPIShared
}

// pointer escapes a JSON pointer's token.
func pointer(tokens ...string) string {
	var b strings.Builder
	for _, tok := range tokens {
		b.WriteString("/" + strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

// schema compiles the schema at the JSON pointer ptr of the document.
func (d *openAPIDoc) schema(ptr string) (*jsonschema.Schema, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.schemas[ptr]; ok {
		return s, nil
	}
	s, err := d.compiler.Compile(openAPIURL + "#" + ptr)
	if err != nil {
		return nil, err
	}
	d.schemas[ptr] = s
	return s, nil
}

// operation finds the document's path and method for a request ("" when
// the document has no operation for it).
func (d *openAPIDoc) operation(r *http.Request) (path, method string) {
	_, pattern := d.mux.Handler(r)
	if pattern == "" {
		return "", ""
	}
	m, p, _ := strings.Cut(pattern, " ")
	return strings.TrimSuffix(p, "{$}"), strings.ToLower(m)
}

// responseSchema is the pointer of the JSON schema of a documented
// response, following a $ref to components/responses; ok is false when
// the operation does not document the status.
func (d *openAPIDoc) responseSchema(path, method string, status int) (ptr string, ok bool) {
	op := d.raw["paths"].(map[string]any)[path].(map[string]any)[method].(map[string]any)
	resp, ok := op["responses"].(map[string]any)[strconv.Itoa(status)].(map[string]any)
	if !ok {
		return "", false
	}
	base := pointer("paths", path, method, "responses", strconv.Itoa(status))
	if ref, isRef := resp["$ref"].(string); isRef {
		base = strings.TrimPrefix(ref, "#")
		name := strings.TrimPrefix(ref, "#/components/responses/")
		resp = d.raw["components"].(map[string]any)["responses"].(map[string]any)[name].(map[string]any)
	}
	content, _ := resp["content"].(map[string]any)
	if _, isJSON := content["application/json"]; !isJSON {
		return "", true // no JSON body documented (204, 303, text)
	}
	return base + pointer("content", "application/json", "schema"), true
}

// checkRequest validates the JSON body of a request the API accepted (a
// 2xx answer) against the operation's request schema: what the API takes
// is what the document says a client may send.
func (d *openAPIDoc) checkRequest(r *http.Request, status int, body []byte) error {
	path, method := d.operation(r)
	if path == "" || status >= 300 || len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	op := d.raw["paths"].(map[string]any)[path].(map[string]any)[method].(map[string]any)
	if _, ok := op["requestBody"]; !ok {
		return nil // a body the route ignores (cancel, pause)
	}
	ptr := pointer("paths", path, method, "requestBody", "content", "application/json", "schema")
	s, err := d.schema(ptr)
	if err != nil {
		return fmt.Errorf("compiling the schema at %s: %w", ptr, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return nil // not JSON, yet accepted: a signal's empty payload
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s %s accepted (%d) a body that does not match %s: %v\nbody: %.2000s", r.Method, r.URL.Path, status, ptr, err, body)
	}
	return nil
}

// check validates one answer against the document: the request's
// operation lists the status, and a JSON body matches its schema. A
// request no operation matches (a wrong method, an unknown path) must be
// answered with the Error shape.
func (d *openAPIDoc) check(r *http.Request, status int, contentType string, body []byte) error {
	path, method := d.operation(r)
	ptr := "/components/schemas/Error"
	if path != "" {
		p, ok := d.responseSchema(path, method, status)
		if !ok {
			return fmt.Errorf("%s %s answered %d, which the document does not list for %s %s", r.Method, r.URL.Path, status, strings.ToUpper(method), path)
		}
		ptr = p
	}
	if !strings.HasPrefix(contentType, "application/json") {
		if path == "" && status != http.StatusNotFound {
			return fmt.Errorf("%s %s answered %d with %q, not the Error shape", r.Method, r.URL.Path, status, contentType)
		}
		return nil // /metrics' text, an empty 204, a redirect
	}
	if ptr == "" {
		return fmt.Errorf("%s %s answered %d with JSON, which the document does not describe", r.Method, r.URL.Path, status)
	}
	s, err := d.schema(ptr)
	if err != nil {
		return fmt.Errorf("compiling the schema at %s: %w", ptr, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s %s answered %d with a body that is not JSON: %w", r.Method, r.URL.Path, status, err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s %s answered %d with a body that does not match %s: %v\nbody: %.2000s", r.Method, r.URL.Path, status, ptr, err, body)
	}
	return nil
}

// checkedByOpenAPI wraps the API so that every answer the tests provoke
// is checked against the OpenAPI document: its status is listed for its
// operation and its JSON body matches the schema.
func checkedByOpenAPI(t *testing.T, h http.Handler) http.Handler {
	d := loadOpenAPI(t)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The API reads what the client sent, and a read's failure (a
		// malformed chunked body) too.
		reqBody, err := io.ReadAll(r.Body)
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(reqBody), failingReader{err}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if err := d.check(r, rec.Code, rec.Header().Get("Content-Type"), rec.Body.Bytes()); err != nil {
			t.Errorf("OpenAPI: %v", err)
		}
		if err := d.checkRequest(r, rec.Code, reqBody); err != nil {
			t.Errorf("OpenAPI: %v", err)
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

// failingReader returns err, or io.EOF when err is nil.
type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) {
	if f.err == nil {
		return 0, io.EOF
	}
	return 0, f.err
}

// The document lists exactly the routes the handler registers: every
// pattern New registers (with metrics and the web UI on) is a path and
// method of the document, and every path and method of the document is
// registered. Only the web UI's subtree (HTML, not API) and the JSON 404
// for unknown paths are left out.
func TestOpenAPIDocumentListsEveryRoute(t *testing.T) {
	t.Parallel()
	d := loadOpenAPI(t)
	routes := httpapi.Routes(nil, &httpapi.Options{Metrics: http.NotFoundHandler(), UI: http.NotFoundHandler()})
	require.Greater(t, len(routes), 25)
	var served []string
	for _, pattern := range routes {
		if pattern == "/ui/" || pattern == "/" {
			continue
		}
		method, path, ok := strings.Cut(pattern, " ")
		require.True(t, ok, "route %q has no method: the document cannot describe it", pattern)
		served = append(served, method+" "+strings.TrimSuffix(path, "{$}"))
	}
	var documented []string
	for path, item := range d.raw["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	sort.Strings(served)
	sort.Strings(documented)
	require.Equal(t, served, documented)
}

// The document is an OpenAPI 3.1 document by the specification's own JSON
// Schema (https://spec.openapis.org/oas/3.1/schema/2022-10-07, published
// by the OpenAPI Initiative; testdata holds a copy, as pb33f/libopenapi
// ships it), which client generators read it by.
func TestOpenAPIDocumentIsValidOpenAPI31(t *testing.T) {
	t.Parallel()
	f, err := os.Open("testdata/oas-3.1-schema-2022-10-07.json")
	require.NoError(t, err)
	defer f.Close()
	meta, err := jsonschema.UnmarshalJSON(f)
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	const metaURL = "https://spec.openapis.org/oas/3.1/schema/2022-10-07"
	require.NoError(t, c.AddResource(metaURL, meta))
	s, err := c.Compile(metaURL)
	require.NoError(t, err)
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(httpapi.OpenAPIDocument()))
	require.NoError(t, err)
	require.NoError(t, s.Validate(doc))
}

// The document is served, under the same authentication as the rest of
// /v1, and is the embedded file; its enums are the engine's exported
// lists, and every operation documents its error statuses with the Error
// shape and has an operationId, which client generators need.
func TestOpenAPIDocumentIsServedAndComplete(t *testing.T) {
	t.Parallel()
	b := setup(t, &httpapi.Options{Token: "s3cret-s3cret-s3cret"})
	r := b.do(t, "GET", "/v1/openapi.json", "")
	require.Equal(t, http.StatusUnauthorized, r.status, r.raw)
	r = b.do(t, "GET", "/v1/openapi.json", "", "Authorization", "Bearer s3cret-s3cret-s3cret")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.JSONEq(t, string(httpapi.OpenAPIDocument()), r.raw)
	require.Equal(t, "3.1.0", r.body["openapi"])

	d := loadOpenAPI(t)
	schemas := d.raw["components"].(map[string]any)["schemas"].(map[string]any)
	enum := func(name string) []string {
		var out []string
		for _, v := range schemas[name].(map[string]any)["enum"].([]any) {
			out = append(out, v.(string))
		}
		return out
	}
	var statuses, reasons []string
	for _, s := range engine.RunStatuses() {
		statuses = append(statuses, string(s))
	}
	for _, s := range engine.DeadReasons() {
		reasons = append(reasons, string(s))
	}
	require.ElementsMatch(t, statuses, enum("RunStatus"))
	require.ElementsMatch(t, reasons, enum("DeadReason"))

	ids := map[string]bool{}
	for path, item := range d.raw["paths"].(map[string]any) {
		for method, o := range item.(map[string]any) {
			op := o.(map[string]any)
			id, _ := op["operationId"].(string)
			require.NotEmpty(t, id, "%s %s", method, path)
			require.False(t, ids[id], "operationId %s is used twice", id)
			ids[id] = true
			for status := range op["responses"].(map[string]any) {
				code, err := strconv.Atoi(status)
				require.NoError(t, err, "%s %s: status %q", method, path, status)
				if code < 400 || path == "/metrics" && code == http.StatusNotFound {
					continue
				}
				ptr, ok := d.responseSchema(path, method, code)
				require.True(t, ok)
				s, err := d.schema(ptr)
				require.NoError(t, err)
				require.NoError(t, s.Validate(map[string]any{"error": map[string]any{"code": "x", "message": "y"}}),
					"%s %s answers %d with the Error shape", method, path, code)
			}
			if strings.HasPrefix(path, "/v1/") {
				for _, code := range []string{"401", "403", "500"} {
					require.Contains(t, op["responses"], code, "%s %s", method, path)
				}
			}
		}
	}
	// Every named schema compiles as JSON Schema 2020-12.
	for name := range schemas {
		_, err := d.schema(pointer("components", "schemas", name))
		require.NoError(t, err, name)
	}
}

// The start, signal and read operations a generated client relies on
// answer as documented, including the errors of each.
func TestOpenAPIStartSignalAndReadARun(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "exp-1", "input": {"order_id": "o", "amount": 1}, "tags": {"team": "a"}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	run := r.body["run_id"].(string)
	require.Equal(t, http.StatusOK, b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "exp-1", "input": {"order_id": "o", "amount": 1}}`).status)
	require.Equal(t, http.StatusConflict, b.do(t, "POST", "/v1/workflows/approval/runs", `{"id": "exp-1", "input": {"order_id": "o", "amount": 2}}`).status)
	require.Equal(t, http.StatusNotFound, b.do(t, "POST", "/v1/workflows/nope/runs", `{"input": {}}`).status)
	b.waitStatus(t, run, "waiting")
	r = b.do(t, "POST", "/v1/runs/exp-1/signals/approve", `{"by": "ann"}`, "Idempotency-Key", "k1")
	require.Equal(t, http.StatusAccepted, r.status, r.raw)
	require.Equal(t, http.StatusConflict, b.do(t, "POST", "/v1/runs/exp-1/signals/approve", `{"by": "bob"}`, "Idempotency-Key", "k1").status)
	done := b.waitStatus(t, run, "completed")
	require.Equal(t, `"ann"`, mustJSON(t, done.body["output"]))
	require.Equal(t, http.StatusConflict, b.do(t, "POST", "/v1/runs/exp-1/signals/approve", `{}`).status)
	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/runs/no-such-run", "").status)
	require.Equal(t, http.StatusMethodNotAllowed, b.do(t, "DELETE", "/v1/runs", "").status)
	r = b.do(t, "GET", "/v1/runs?workflow=approval&tag=team:a", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Len(t, r.body["runs"], 1)
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/v1/workflows", "").status)
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/healthz", "").status)
	require.True(t, slices.Contains([]int{http.StatusOK}, b.do(t, "GET", "/readyz", "").status))
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	out, err := json.Marshal(v)
	require.NoError(t, err)
	return string(out)
}
