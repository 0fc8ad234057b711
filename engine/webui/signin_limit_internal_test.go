package webui

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Wrong tokens are counted per client address, in one-minute windows, in
// a table of bounded size whose old entries expire.
func TestSignInLimitCountsPerClientInBoundedMemory(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	l := newSignInLimit(func() time.Time { return now })
	for i := 1; i <= maxFailedSignIns+1; i++ {
		require.Equal(t, i, l.fail("192.0.2.1"))
	}
	require.Equal(t, 1, l.fail("192.0.2.2"), "each address has its own count")
	now = now.Add(59 * time.Second)
	require.Equal(t, maxFailedSignIns+2, l.fail("192.0.2.1"))
	now = now.Add(time.Second)
	require.Equal(t, 1, l.fail("192.0.2.1"), "a new minute, a new count")

	// The table holds at most maxSignInClients addresses; the others are
	// counted together until the old entries expire.
	l = newSignInLimit(func() time.Time { return now })
	for i := range maxSignInClients {
		l.fail(fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255))
	}
	require.Len(t, l.clients, maxSignInClients)
	require.Equal(t, 1, l.fail("198.51.100.1"))
	require.Equal(t, 2, l.fail("198.51.100.2"), "beyond the table, addresses share a count")
	require.Len(t, l.clients, maxSignInClients)
	now = now.Add(30 * time.Second)
	require.Equal(t, 2, l.fail("10.0.0.0"), "a tracked address keeps its count")
	require.Equal(t, 3, l.fail("198.51.100.3"))
	now = now.Add(30 * time.Second)
	require.Equal(t, 1, l.fail("198.51.100.3"), "expired entries make room")
	require.Len(t, l.clients, 1, "the expired entries are gone")
}

func TestClientKey(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"192.0.2.7:5555":             "192.0.2.7",
		"[::ffff:192.0.2.7]:5555":    "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:1":   "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:1":        "2001:db8:1:3::/64",
		"@":                          "@",
		"not an address":             "not an address",
		"[fe80::1%eth0]:80":          "fe80::1%eth0",
		"127.0.0.1":                  "127.0.0.1",
	} {
		require.Equal(t, want, clientKey(addr), addr)
	}
}
