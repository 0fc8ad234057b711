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
//     the token is typed in (HttpOnly, SameSite=Strict, holding an HMAC of
//     the token, not the token).
//   - Every POST needs this service's origin (the Origin header, or
//     Sec-Fetch-Site same-origin) and the form's CSRF token: a page on
//     another site cannot act through a signed-in browser.
//   - Responses forbid framing and inline scripts (Content-Security-Policy).
//
// The Host check against DNS rebinding is httpapi's, around this handler.
package webui

import (
	"bytes"
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
	"strings"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

//go:embed assets
var assets embed.FS

// Options configures the UI.
type Options struct {
	// Token, when set, is the API's bearer token: the UI asks for it at
	// /ui/login.
	Token string
	// Logger logs failures the UI shows as "internal error". Default
	// slog.Default().
	Logger *slog.Logger
	// APIError maps an engine error onto an HTTP status and a code, as
	// the API answers it (httpapi.ErrorCode). Default: 500 for all.
	APIError func(error) (status int, code string)
}

// Prefix is the path the UI is served under.
const Prefix = "/ui/"

// New returns the UI's handler over e; it serves paths under Prefix.
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
	u := &ui{e: e, opts: o, pages: parsePages()}
	if o.Token != "" {
		// Every process that shares the token accepts the others' cookies
		// and forms (several serve processes behind one load balancer).
		u.sessionKey = mac([]byte(o.Token), "pgdurable ui session")
		u.csrfKey = mac([]byte(o.Token), "pgdurable ui csrf")
	} else {
		u.csrfKey = make([]byte, 32)
		_, _ = rand.Read(u.csrfKey)
	}
	static, _ := fs.Sub(assets, "assets/static")
	mux := http.NewServeMux()
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", cacheStatic(http.FileServerFS(static))))
	mux.HandleFunc("GET /ui/login", u.loginPage)
	mux.HandleFunc("POST /ui/login", u.login)
	mux.HandleFunc("POST /ui/logout", u.logout)
	pages := http.NewServeMux()
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
	pages.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		u.fail(w, r, http.StatusNotFound, "There is no page "+r.URL.Path+".")
	})
	mux.Handle("/ui/", u.signedIn(pages))
	return headers(u.sameOrigin(mux))
}

type ui struct {
	e          *engine.Engine
	opts       Options
	pages      map[string]*template.Template
	sessionKey []byte // nil: no token, no sign-in
	csrfKey    []byte
}

func mac(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// sessionCookie names the cookie that holds a signed-in browser's session.
const sessionCookie = "pgdurable_ui"

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

func cacheStatic(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=300")
		next.ServeHTTP(w, r)
	})
}

// signedIn lets a request through when no token is set, or when it
// carries the token or a session cookie; a page request without either is
// sent to the sign-in page, an action refused.
func (u *ui) signedIn(next http.Handler) http.Handler {
	if u.sessionKey == nil {
		return next
	}
	want := hex.EncodeToString(u.sessionKey)
	bearer := []byte("Bearer " + u.opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, err := r.Cookie(sessionCookie); err == nil && subtle.ConstantTimeCompare([]byte(c.Value), []byte(want)) == 1 {
			next.ServeHTTP(w, r)
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), bearer) == 1 {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			u.fail(w, r, http.StatusUnauthorized, "Your session has ended: sign in again, then repeat the action.")
			return
		}
		http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
	})
}

// sameOrigin refuses a POST that a page on another site could have sent:
// one whose Origin is another site's (or, without Origin, whose
// Sec-Fetch-Site says cross-site), and one without this UI's CSRF token.
func (u *ui) sameOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		if origin := r.Header.Get("Origin"); origin != "" {
			o, err := url.Parse(origin)
			if err != nil || o.Host == "" || !strings.EqualFold(o.Host, r.Host) {
				u.fail(w, r, http.StatusForbidden, "This form was sent from another site ("+origin+"); it was refused.")
				return
			}
		} else if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
			u.fail(w, r, http.StatusForbidden, "This form was sent from another site; it was refused.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if err := r.ParseForm(); err != nil {
			u.fail(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(u.csrf())) != 1 {
			u.fail(w, r, http.StatusForbidden, "The form's security token is missing or stale: reload the page and try again.")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// maxForm bounds a form's body: the largest is a signal's payload.
const maxForm = 1<<20 + 16<<10

func (u *ui) csrf() string { return hex.EncodeToString(mac(u.csrfKey, "csrf")) }

func (u *ui) loginPage(w http.ResponseWriter, r *http.Request) {
	if u.sessionKey == nil {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	u.render(w, r, http.StatusOK, "login", &page{Title: "Sign in", Data: map[string]string{"Next": safeNext(r.URL.Query().Get("next"))}})
}

func (u *ui) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostForm.Get("next"))
	if u.sessionKey == nil {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("token")), []byte(u.opts.Token)) != 1 {
		u.render(w, r, http.StatusUnauthorized, "login", &page{Title: "Sign in", Error: "That is not this service's API token.",
			Data: map[string]string{"Next": next}})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: hex.EncodeToString(u.sessionKey), Path: Prefix,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int((12 * time.Hour).Seconds())})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (u *ui) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix, HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// safeNext is where to go after signing in: a path of this UI, never
// another site ("//evil" or "/\evil" would be one).
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.ContainsAny(next, "\\\x00\r\n") || strings.HasPrefix(next, "//") {
		return Prefix
	}
	return next
}

// page is what every template gets.
type page struct {
	Title  string
	Nav    string // the section the page belongs to
	CSRF   string
	Token  bool // a token protects the UI (show "sign out")
	Notice string
	Error  string
	Data   any
}

func (u *ui) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	p.CSRF, p.Token = u.csrf(), u.sessionKey != nil
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
	"cancelled":  "Cancellation requested: the run's compensations run and it ends cancelled.",
	"terminated": "Run terminated.",
	"started":    "The delayed run was started now.",
	"signalled":  "Signal sent.",
	"replayed":   "Dead job replayed: the run is pending again.",
	"discarded":  "Dead job discarded.",
	"paused":     "Schedule paused.",
	"resumed":    "Schedule resumed.",
	"triggered":  "Schedule triggered: its run is below.",
}

// errBadForm is a form field the UI cannot use.
var errBadForm = errors.New("bad form")

func badForm(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadForm, fmt.Sprintf(format, args...))
}
