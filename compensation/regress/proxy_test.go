package regress_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// pgProxy is a loopback TCP proxy in front of Postgres that can, once, act
// on the COMMIT of a transaction that ran a marker statement
// (SELECT 'attack_marker'): drop the commit's acknowledgement (forward the
// COMMIT, swallow the answer, cut the connection), or delay the answer.
type pgProxy struct {
	ln       net.Listener
	target   string
	mode     string // "dropack" or "delay"
	delay    time.Duration
	fired    atomic.Bool
	markSeen chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

// startProxy proxies the server db is on (the test server, wherever
// TEST_DATABASE_URL points).
func startProxy(t *testing.T, db *enginetest.DB, mode string, delay time.Duration) *pgProxy {
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	p := &pgProxy{ln: ln, target: target, mode: mode, delay: delay, markSeen: make(chan struct{}, 16)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *pgProxy) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

func (p *pgProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *pgProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		pc := &proxConn{c: c, s: s, stmts: map[string]string{}}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.clientToServer(pc) }()
		go func() { defer p.wg.Done(); p.serverToClient(pc) }()
	}
}

type proxConn struct {
	c, s       net.Conn
	blackhole  atomic.Bool
	delayUntil atomic.Int64
	marked     bool
	// The extended protocol: each prepared statement's SQL by name (""
	// the unnamed one), and a COMMIT bound since the last Sync, which
	// the proxy acts on once the Sync that ends its pipeline is sent.
	stmts       map[string]string
	commitBound bool
}

// statement is the SQL a simple query or a Bind's statement runs,
// lowercased, or "".
func (pc *proxConn) statement(typ byte, body []byte) string {
	switch typ {
	case 'Q':
		return strings.ToLower(strings.TrimSpace(string(bytes.TrimRight(body, "\x00"))))
	case 'P': // Parse: statement name, query
		parts := bytes.SplitN(body, []byte{0}, 3)
		if len(parts) == 3 {
			pc.stmts[string(parts[0])] = strings.ToLower(strings.TrimSpace(string(parts[1])))
		}
	case 'B': // Bind: portal name, statement name
		parts := bytes.SplitN(body, []byte{0}, 3)
		if len(parts) == 3 {
			return pc.stmts[string(parts[1])]
		}
	}
	return ""
}

func (p *pgProxy) serverToClient(pc *proxConn) {
	defer pc.c.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.s.Read(buf)
		if n > 0 {
			if d := time.Until(time.Unix(0, pc.delayUntil.Load())); d > 0 {
				time.Sleep(d)
			}
			if !pc.blackhole.Load() {
				if _, werr := pc.c.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *pgProxy) clientToServer(pc *proxConn) {
	defer pc.s.Close()
	// Untyped startup-phase messages until the protocol 3.0 StartupMessage.
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(pc.c, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		code := binary.BigEndian.Uint32(hdr[4:8])
		rest := make([]byte, n-8)
		if _, err := io.ReadFull(pc.c, rest); err != nil {
			return
		}
		if _, err := pc.s.Write(append(hdr[:], rest...)); err != nil {
			return
		}
		if code == 196608 {
			break
		}
	}
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(pc.c, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[1:5])
		body := make([]byte, n-4)
		if _, err := io.ReadFull(pc.c, body); err != nil {
			return
		}
		msg := append(hdr[:], body...)
		q := pc.statement(hdr[0], body)
		if strings.Contains(q, "attack_marker") {
			pc.marked = true
			select {
			case p.markSeen <- struct{}{}:
			default:
			}
		}
		// A simple COMMIT acts at once; a bound one (pipelined behind a tx
		// step's record) at the Sync that ends its pipeline.
		act := false
		switch {
		case hdr[0] == 'Q' && (q == "commit" || q == "rollback"):
			act = q == "commit" && pc.marked && p.fired.CompareAndSwap(false, true)
			pc.marked = false
		case hdr[0] == 'B' && q == "commit":
			pc.commitBound = true
		case hdr[0] == 'S' && pc.commitBound:
			act = pc.marked && p.fired.CompareAndSwap(false, true)
			pc.marked, pc.commitBound = false, false
		}
		if act {
			switch p.mode {
			case "dropack":
				pc.blackhole.Store(true)
				if _, err := pc.s.Write(msg); err != nil {
					return
				}
				time.Sleep(300 * time.Millisecond) // the server commits
				pc.c.Close()
				pc.s.Close()
				return
			case "delay":
				pc.delayUntil.Store(time.Now().Add(p.delay).UnixNano())
			}
		}
		if _, err := pc.s.Write(msg); err != nil {
			return
		}
	}
}
