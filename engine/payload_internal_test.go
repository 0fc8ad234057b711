package engine

import (
	"encoding/json"
	"testing"
)

func TestCheckStorable(t *testing.T) {
	for _, tc := range []struct {
		value any
		ok    bool
	}{
		{"plain", true},
		{"nul\x00inside", false},
		{`backslash then u0000: \u0000`, true}, // encodes as \\u0000: no NUL
		{map[string]string{"k\x00": "v"}, false},
		{[]string{`\`, "\x00"}, false},
		{`\\`, true},
	} {
		b, err := json.Marshal(tc.value)
		if err != nil {
			t.Fatal(err)
		}
		if got := checkStorable(b) == nil; got != tc.ok {
			t.Errorf("checkStorable(%s) ok = %v, want %v", b, got, tc.ok)
		}
	}
}
