package httpapi

import "github.com/pgdurable/pgdurable/engine"

// Routes returns the patterns the handler New(e, opts) registers.
func Routes(e *engine.Engine, opts *Options) []string {
	_, patterns := newHandler(e, opts)
	return patterns
}

// OpenAPIDocument is the embedded document GET /v1/openapi.json serves.
func OpenAPIDocument() []byte { return openAPI }
