package httpapi

import (
	"fmt"
	"net/http"
	"time"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// UISessionsRevoked is the answer of POST /v1/ui-sessions/revoke: how many
// live web UI sessions it ended.
type UISessionsRevoked struct {
	Revoked int64 `json:"revoked"`
}

// revokeUISessions signs every browser out of the web UI (sign out
// everywhere), on every engine process of the database: after a token
// leaked, a laptop was lost, or someone left. It takes no body.
func (a *api) revokeUISessions(w http.ResponseWriter, r *http.Request) {
	if a.opts.Pool == nil {
		writeError(w, http.StatusNotImplemented, "not_implemented",
			"this service has no database pool (httpapi.Options.Pool), where the web UI's sessions are kept")
		return
	}
	schema, err := store.NewSchema(a.e.Schema())
	if err != nil {
		a.engineError(w, r, err)
		return
	}
	n, err := store.DeleteAllUISessions(r.Context(), schema.On(a.opts.Pool), time.Now())
	if err != nil {
		a.engineError(w, r, fmt.Errorf("pgdurable: ending the UI sessions: %w", err))
		return
	}
	a.opts.Logger.Info("web ui: signed out everywhere", "sessions", n, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, UISessionsRevoked{Revoked: n})
}
