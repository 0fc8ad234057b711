package webui

import (
	"net"
	"sync"
	"time"
)

// maxFailedSignIns bounds the wrong tokens one client address may send a
// minute before they are answered 429 and no longer logged: enough for a
// person who mistypes, few enough to keep a guesser out of the log. A
// correct token is never refused, whatever came before it from anywhere:
// what keeps a guesser out is the token's length (serve wants at least 16
// bytes beyond loopback), and a limit that refused correct tokens would
// let anyone lock the operators out.
const maxFailedSignIns = 20

// signInWindow is the period over which wrong tokens are counted.
const signInWindow = time.Minute

// maxSignInClients bounds the client addresses whose wrong tokens are
// counted at once (an entry is a few dozen bytes: about a megabyte in
// all). Beyond it, the wrong tokens of addresses not yet tracked are
// counted together, until a sweep frees entries older than a minute.
const maxSignInClients = 10_000

// signInLimit counts wrong tokens per client address in fixed one-minute
// windows.
type signInLimit struct {
	now func() time.Time

	mu        sync.Mutex
	clients   map[string]*failures
	overflow  failures  // the addresses that found the table full, together
	lastSweep time.Time // when expired entries were last deleted
}

// failures is a client's count of wrong tokens since its window started.
type failures struct {
	since time.Time
	n     int
}

func newSignInLimit(now func() time.Time) *signInLimit {
	return &signInLimit{now: now, clients: map[string]*failures{}}
}

// fail records a wrong token from the client at key (clientKey) and
// returns how many it has sent in its window, this one included.
func (l *signInLimit) fail(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Sub(l.lastSweep) >= signInWindow {
		l.sweep(now)
	}
	f, ok := l.clients[key]
	if !ok && len(l.clients) >= maxSignInClients && now.Sub(l.lastSweep) >= time.Second {
		l.sweep(now) // at most once a second: a sweep walks the whole table
	}
	switch {
	case ok:
	case len(l.clients) < maxSignInClients:
		f = &failures{since: now}
		l.clients[key] = f
	default:
		f = &l.overflow
	}
	if now.Sub(f.since) >= signInWindow {
		f.since, f.n = now, 0
	}
	f.n++
	return f.n
}

// sweep deletes the entries whose window has ended.
func (l *signInLimit) sweep(now time.Time) {
	for k, f := range l.clients {
		if now.Sub(f.since) >= signInWindow {
			delete(l.clients, k)
		}
	}
	l.lastSweep = now
}

// clientKey names the client that sent a request from remoteAddr (the
// connection's host:port) for counting its wrong tokens: its IPv4
// address, or the /64 network of its IPv6 address (one host commonly holds
// a whole /64). Forwarding headers are ignored: a client can write any
// X-Forwarded-For, and behind a proxy every client shares the proxy's
// address, which is harmless as a correct token is never refused.
func clientKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return host
	case ip.To4() != nil:
		return ip.To4().String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}
