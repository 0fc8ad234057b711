// Package webui serves the engine's web UI: an operator's desk for runs
// (filters, paging, a step waterfall), dead jobs (replay and discard, one
// or many), schedules (pause, resume, trigger), the workflows live
// processes register, and an overview of the queue. It is plain HTML
// rendered on the server from templates and a stylesheet embedded in the
// binary; a few lines of JavaScript refresh the live counts and are not
// needed for anything else. Every action is an HTML form.
//
// Mount the handler at /ui/ (httpapi.Options.UI does). Protection follows
// the HTTP API's:
//   - With Options.Token set, a page needs the token: as "Authorization:
//     Bearer <token>", or as the session cookie that /ui/login sets after
//     the token is typed in (HttpOnly, SameSite=Strict). The cookie holds
//     a random session secret, nothing derived from the token; the
//     database keeps the secret's SHA-256 with an HMAC of the token keyed
//     by the secret, so a session ends when its 12 hours are up, when it
//     signs out, when anyone signs out everywhere (the UI's button,
//     POST /v1/ui-sessions/revoke, engine ui-sessions revoke: see
//     RevokeSessions), and as soon as the service runs with another token.
//   - Wrong tokens at /ui/login are counted per client address: over 20 a
//     minute they are answered 429 and no longer logged. A correct token
//     is always accepted.
//   - Every POST needs this service's origin (the Origin header, or
//     Sec-Fetch-Site same-origin) and the form's CSRF token: a page on
//     another site cannot act through a signed-in browser.
//   - Responses forbid framing and inline scripts (Content-Security-Policy).
//   - /ui/static/ serves the stylesheet and the script to anyone, and no
//     listing of its folder.
//
// The Host check against DNS rebinding is httpapi's, around this handler.
package webui

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

//go:embed assets
var assets embed.FS

// Options configures the UI.
type Options struct {
	// Token, when set, is the API's bearer token: the UI asks for it at
	// /ui/login, and Pool must be set to keep the sessions.
	Token string
	// Pool holds the signed-in sessions (table ui_sessions), so that every
	// engine process sharing the database with the same Token accepts
	// them and sign-out ends them everywhere. Required with Token; without
	// one, only a POST to /ui/logout-everywhere uses it (when set).
	Pool *pgxpool.Pool
	// Logger logs failures the UI shows as "internal error", and failed
	// sign-ins. Default slog.Default().
	Logger *slog.Logger
	// APIError maps an engine error onto an HTTP status and a code, as
	// the API answers it (httpapi.ErrorCode). Default: 500 for all.
	APIError func(error) (status int, code string)
}

// Prefix is the path the UI is served under.
const Prefix = "/ui/"

// SessionTTL is how long a sign-in lasts, on the server as in the browser.
const SessionTTL = 12 * time.Hour

// New returns the UI's handler over e; it serves paths under Prefix. It
// panics when Options.Token is set without Options.Pool (a programming
// error: sessions would have nowhere to live).
func New(e *engine.Engine, opts *Options) http.Handler {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.APIError == nil {
		o.APIError = func(error) (int, string) { return http.StatusInternalServerError, "internal" }
	}
	if o.Token != "" && o.Pool == nil {
		panic("webui: Options.Token needs Options.Pool for the sessions")
	}
	u := &ui{e: e, opts: o, pages: parsePages(), csrfKey: make([]byte, 32), limit: newSignInLimit(time.Now)}
	// Without a token there are no sessions: forms carry a token of this
	// process (a page on another site cannot read it).
	_, _ = rand.Read(u.csrfKey)
	static, _ := fs.Sub(assets, "assets/static")
	mux := http.NewServeMux()
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", u.staticFiles(static)))
	mux.HandleFunc("GET /ui/login", u.loginPage)
	mux.HandleFunc("POST /ui/login", u.login)
	pages := http.NewServeMux()
	pages.HandleFunc("POST /ui/logout", u.logout)
	pages.HandleFunc("POST /ui/logout-everywhere", u.logoutEverywhere)
	pages.HandleFunc("GET /ui/{$}", u.overview)
	pages.HandleFunc("GET /ui/runs", u.runs)
	pages.HandleFunc("POST /ui/runs/cancel-matching", u.cancelMatching)
	pages.HandleFunc("GET /ui/runs/{id}", u.run)
	pages.HandleFunc("POST /ui/runs/{id}/{action}", u.runAction)
	pages.HandleFunc("GET /ui/dead-jobs", u.deadJobs)
	pages.HandleFunc("POST /ui/dead-jobs/bulk", u.deadJobsBulk)
	pages.HandleFunc("GET /ui/dead-jobs/{id}", u.deadJob)
	pages.HandleFunc("POST /ui/dead-jobs/{id}/{action}", u.deadJobAction)
	pages.HandleFunc("GET /ui/schedules", u.schedules)
	pages.HandleFunc("GET /ui/schedules/{name}", u.schedule)
	pages.HandleFunc("POST /ui/schedules/{name}/{action}", u.scheduleAction)
	pages.HandleFunc("GET /ui/workflows", u.workflows)
	pages.HandleFunc("GET /ui/queues", u.queues)
	pages.HandleFunc("POST /ui/queues/{name}/{action}", u.queueAction)
	pages.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		u.fail(w, r, http.StatusNotFound, "There is no page "+r.URL.Path+".")
	})
	mux.Handle("/ui/", u.guard(pages))
	return headers(u.sameOrigin(mux))
}

type ui struct {
	e       *engine.Engine
	opts    Options
	pages   map[string]*template.Template
	csrfKey []byte // this process's, for forms without a session
	limit   *signInLimit
}

func mac(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// sessionCookie names the cookie that holds a signed-in browser's session.
const sessionCookie = "pgdurable_ui"

// visitor is what guard learned about a request, for the handlers and
// the templates.
type visitor struct {
	csrf     string // the token this visitor's forms carry
	signedIn bool   // a session (show "Sign out")
}

type visitorKey struct{}

func visitorOf(r *http.Request) visitor {
	v, _ := r.Context().Value(visitorKey{}).(visitor)
	return v
}

// headers sets what every UI response carries: no framing (clickjacking),
// no inline or foreign scripts and styles, no sniffing, no referrer beyond
// this origin.
func headers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

// staticFiles serves the files of static (the stylesheet, the script),
// under http.StripPrefix, and answers 404 for anything else: a directory
// (http.FileServerFS would list it), a missing file, a path fs.FS refuses.
func (u *ui) staticFiles(static fs.FS) http.Handler {
	files := http.FileServerFS(static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Path
		if fi, err := fs.Stat(static, name); err != nil || fi.IsDir() {
			u.fail(w, r, http.StatusNotFound, "There is no such file.")
			return
		}
		w.Header().Set("Cache-Control", "max-age=300")
		files.ServeHTTP(w, r)
	})
}

// guard lets a request through to the pages:
//   - with a token, when it carries the cookie of a live session opened
//     with this token, or the bearer token; a page request without either
//     is sent to the sign-in page, an action refused;
//   - a POST only with its form's CSRF token: the session's (an HMAC of
//     its random secret, so only its holder knows it), or this process's
//     without a token. A POST with the bearer token needs none: a page on
//     another site cannot send that header.
func (u *ui) guard(next http.Handler) http.Handler {
	bearer := []byte("Bearer " + u.opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := visitor{csrf: hex.EncodeToString(mac(u.csrfKey, "csrf"))}
		byBearer := false
		if u.opts.Token != "" {
			secret, ok, err := u.session(r)
			switch {
			case err != nil:
				u.engineError(w, r, err)
				return
			case ok:
				v.csrf, v.signedIn = hex.EncodeToString(mac(secret, "csrf")), true
			case subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), bearer) == 1:
				byBearer = true
			case r.Method == http.MethodGet || r.Method == http.MethodHead:
				http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			default:
				u.fail(w, r, http.StatusUnauthorized, "Your session has ended: sign in again, then repeat the action.")
				return
			}
		}
		r = r.WithContext(context.WithValue(r.Context(), visitorKey{}, v))
		if r.Method == http.MethodPost && !byBearer && subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(v.csrf)) != 1 {
			u.fail(w, r, http.StatusForbidden, "The form's security token is missing or stale: reload the page and try again.")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// session returns the secret of the request's session cookie when it
// names a live session opened with this service's token.
func (u *ui) session(r *http.Request) (secret []byte, ok bool, err error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, false, nil
	}
	secret, err = hex.DecodeString(c.Value)
	if err != nil || len(secret) != 32 {
		return nil, false, nil
	}
	hash := sha256.Sum256(secret)
	sess, err := store.UISessionTokenDigest(r.Context(), u.sessions(), hash[:])
	digest, ok := sess.TokenDigest, sess.Live
	if err != nil {
		return nil, false, fmt.Errorf("pgdurable: reading the UI session: %w", err)
	}
	if !ok || !hmac.Equal(digest, tokenDigest(secret, u.opts.Token)) {
		return nil, false, nil
	}
	return secret, true, nil
}

// tokenDigest ties a session to the API token it is opened with: an HMAC
// of the token keyed by the session's secret, kept with the session. A
// process with another token computes another digest and refuses the
// session; and as the secret lives only in the browser's cookie, the
// stored digest gives a reader of the database nothing to test guesses of
// the token against.
func tokenDigest(secret []byte, token string) []byte {
	return mac(secret, "api-token\x00"+token)
}

// sameOrigin refuses a POST that a page on another site could have sent:
// one whose Origin is another site's (or, without Origin, whose
// Sec-Fetch-Site says cross-site), and parses the form of the rest.
func (u *ui) sameOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		if origin := r.Header.Get("Origin"); origin != "" {
			o, err := url.Parse(origin)
			if err != nil || (o.Scheme != "http" && o.Scheme != "https") || o.Host == "" || !strings.EqualFold(o.Host, r.Host) {
				u.fail(w, r, http.StatusForbidden, "This form was sent from another site ("+origin+"); it was refused.")
				return
			}
		} else if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
			u.fail(w, r, http.StatusForbidden, "This form was sent from another site; it was refused.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if err := r.ParseForm(); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				u.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("The form is over %d bytes (URL-encoded); send a large signal payload through the API instead.", maxForm))
				return
			}
			u.fail(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
			return
		}
		next.ServeHTTP(w, r)
	})
}

// maxForm bounds a form's body: the largest is a signal's payload, whose
// JSON URL encoding can triple.
const maxForm = 4 << 20

func (u *ui) loginPage(w http.ResponseWriter, r *http.Request) {
	if u.opts.Token == "" {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	u.render(w, r, http.StatusOK, "login", &page{Title: "Sign in", Data: map[string]string{"Next": safeNext(r.URL.Query().Get("next"))}})
}

// login checks the typed token and starts a session. Its form carries no
// CSRF token (there is no session yet); the origin check stands, and a
// forged sign-in would need the token anyway. A correct token always signs
// in; wrong ones are counted per client address (signInLimit), answered
// 401 and logged up to maxFailedSignIns a minute, then 429 and unlogged.
func (u *ui) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostForm.Get("next"))
	if u.opts.Token == "" {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("token")), []byte(u.opts.Token)) != 1 {
		n := u.limit.fail(clientKey(r.RemoteAddr))
		switch {
		case n <= maxFailedSignIns:
			u.opts.Logger.Warn("web ui: sign-in with a wrong token", "remote", r.RemoteAddr)
		case n == maxFailedSignIns+1:
			u.opts.Logger.Warn("web ui: too many wrong tokens from one address: the rest of this minute's are answered 429 and not logged",
				"remote", r.RemoteAddr, "limit_per_minute", maxFailedSignIns)
		}
		if n > maxFailedSignIns {
			u.render(w, r, http.StatusTooManyRequests, "login", &page{Title: "Sign in",
				Error: "Too many wrong tokens came from your address in the last minute, and this is not this service's API token either: wait a minute before you try again.",
				Data:  map[string]string{"Next": next}})
			return
		}
		u.render(w, r, http.StatusUnauthorized, "login", &page{Title: "Sign in", Error: "That is not this service's API token.",
			Data: map[string]string{"Next": next}})
		return
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	hash := sha256.Sum256(secret)
	if err := store.CreateUISession(r.Context(), u.sessions(), hash[:], tokenDigest(secret, u.opts.Token), SessionTTL); err != nil {
		u.engineError(w, r, fmt.Errorf("pgdurable: recording the UI session: %w", err))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: hex.EncodeToString(secret), Path: Prefix,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https",
		MaxAge: int(SessionTTL.Seconds())})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the session on the server (every process) and in the
// browser.
func (u *ui) logout(w http.ResponseWriter, r *http.Request) {
	if secret, ok, _ := u.session(r); ok {
		hash := sha256.Sum256(secret)
		if err := store.DeleteUISession(r.Context(), u.sessions(), hash[:]); err != nil {
			u.engineError(w, r, fmt.Errorf("pgdurable: ending the UI session: %w", err))
			return
		}
	}
	endCookie(w)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// endCookie deletes the session cookie in the browser.
func endCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix, HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
}

// logoutEverywhere ends every session, this browser's included (sign out
// everywhere): after a token leaked, or a laptop was lost.
func (u *ui) logoutEverywhere(w http.ResponseWriter, r *http.Request) {
	if u.opts.Pool != nil {
		n, err := RevokeSessions(r.Context(), u.opts.Pool, u.e.Schema())
		if err != nil {
			u.engineError(w, r, err)
			return
		}
		u.opts.Logger.Info("web ui: signed out everywhere", "sessions", n, "remote", r.RemoteAddr)
	}
	endCookie(w)
	http.Redirect(w, r, "/ui/login?done=signed-out-everywhere", http.StatusSeeOther)
}

// RevokeSessions ends every web UI session kept in pool's database, in
// the engine tables' schema ("" is engine.DefaultSchema), signing out
// everywhere: each browser signed in to any engine process on those
// tables must sign in again, with the token. It returns how many live
// sessions it ended. The UI's "Sign out everywhere" button, the API's
// POST /v1/ui-sessions/revoke and engine ui-sessions revoke do this.
func RevokeSessions(ctx context.Context, pool *pgxpool.Pool, schema string) (int64, error) {
	s, err := store.NewSchema(schema)
	if err != nil {
		return 0, fmt.Errorf("pgdurable: %w", err)
	}
	n, err := store.DeleteAllUISessions(ctx, s.On(pool), time.Now())
	if err != nil {
		return 0, fmt.Errorf("pgdurable: ending the UI sessions: %w", err)
	}
	return n, nil
}

// sessions is the sessions' pool, bound to the engine's schema (which
// engine.New validated).
func (u *ui) sessions() store.DBTX {
	s, err := store.NewSchema(u.e.Schema())
	if err != nil {
		panic(err)
	}
	return s.On(u.opts.Pool)
}

// safeNext is where to go after signing in: a page of this UI, never
// another site ("//evil", "/\evil") nor a path that leaves /ui/.
func safeNext(next string) string {
	p, _, _ := strings.Cut(next, "?")
	if !strings.HasPrefix(next, Prefix) || strings.ContainsAny(next, "\\\x00\r\n\t") || strings.HasPrefix(next, "//") ||
		!strings.HasPrefix(path.Clean(p)+"/", Prefix) || strings.Contains(p, "%") {
		return Prefix
	}
	return next
}

// page is what every template gets.
type page struct {
	Title  string
	Nav    string // the section the page belongs to
	CSRF   string
	Token  bool // signed in with a session (show "sign out")
	Locked bool // a token protects the UI and this visitor has not signed in: no menu
	Notice string
	Error  string
	Data   any
}

func (u *ui) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	v := visitorOf(r)
	p.CSRF, p.Token, p.Locked = v.csrf, v.signedIn, u.opts.Token != "" && !v.signedIn
	if p.Notice == "" {
		p.Notice = notices[r.URL.Query().Get("done")]
	}
	var buf bytes.Buffer
	if err := u.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		u.opts.Logger.Error("web ui: rendering failed", "page", name, "error", err)
		http.Error(w, "internal error; see the service's logs", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail answers a page with only the message, with status.
func (u *ui) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	u.render(w, r, status, "error", &page{Title: http.StatusText(status), Error: msg})
}

// engineError answers err as the API would: its status and message, but
// for internal errors, which are logged and not shown.
func (u *ui) engineError(w http.ResponseWriter, r *http.Request, err error) {
	status, _ := u.opts.APIError(err)
	if errors.Is(err, errBadForm) {
		status = http.StatusBadRequest
	}
	if status >= 500 {
		u.opts.Logger.Error("web ui request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		u.fail(w, r, status, "Internal error; see the service's logs.")
		return
	}
	u.fail(w, r, status, err.Error())
}

// notices are the messages a redirect after an action shows (?done=...):
// a fixed set, so a link cannot make the page say anything else.
var notices = map[string]string{
	"cancelled":  "Cancellation requested: the run stops, the undos of its completed steps run, and it ends cancelled.",
	"terminated": "Run terminated.",
	"started":    "The delayed run was started now.",
	"signalled":  "Signal sent.",
	"replayed":   "Dead job replayed: the run is pending again.",
	"discarded":  "Dead job discarded.",
	"paused":     "Schedule paused.",
	"resumed":    "Schedule resumed.",
	"triggered":  "Schedule triggered: its run is below.",

	"queue-paused":  "Queue paused: no run of it starts; running steps finish, then their runs wait in it.",
	"queue-resumed": "Queue resumed: its backlog starts at its limits.",

	"signed-out-everywhere": "Every browser is signed out of the web UI, this one included: each must sign in again with the API token.",
}

// errBadForm is a form field the UI cannot use.
var errBadForm = errors.New("bad form")

func badForm(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadForm, fmt.Sprintf(format, args...))
}
