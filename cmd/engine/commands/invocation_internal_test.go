package commands

import (
	"runtime/debug"
	"testing"
)

// The commands a binary prints run it as it was run: go run with its
// package (relative from its module's root), or the path it was started
// by.
func TestInvocationOf(t *testing.T) {
	bi := &debug.BuildInfo{Path: "example.com/shop/cmd/shopengine", Main: debug.Module{Path: "example.com/shop"}}
	for _, c := range []struct {
		args0, exe string
		bi         *debug.BuildInfo
		module     string
		want       string
	}{
		{"/tmp/go-build123/b001/exe/shopengine", "/tmp/go-build123/b001/exe/shopengine", bi, "example.com/shop", "go run ./cmd/shopengine"},
		{"/tmp/go-build123/b001/exe/shopengine", "/tmp/go-build123/b001/exe/shopengine", bi, "", "go run example.com/shop/cmd/shopengine"},
		{"/tmp/go-build123/b001/exe/shopengine", "/tmp/go-build123/b001/exe/shopengine", bi, "example.com/other", "go run example.com/shop/cmd/shopengine"},
		{"/tmp/go-build1/b001/exe/shop", "/tmp/go-build1/b001/exe/shop", &debug.BuildInfo{Path: "example.com/shop", Main: debug.Module{Path: "example.com/shop"}}, "example.com/shop", "go run ."},
		{"./bin/shopengine", "/srv/shop/bin/shopengine", bi, "example.com/shop", "./bin/shopengine"},
		{"shopengine", "/usr/local/bin/shopengine", bi, "", "shopengine"},
		{"/tmp/go-build9/b001/commands.test", "/tmp/go-build9/b001/commands.test", &debug.BuildInfo{Path: "example.com/shop/x.test"}, "", "/tmp/go-build9/b001/commands.test"},
	} {
		if got := invocationOf(c.args0, c.exe, c.bi, c.module); got != c.want {
			t.Errorf("invocationOf(%q, %q, %s, %q) = %q, want %q", c.args0, c.exe, c.bi.Path, c.module, got, c.want)
		}
	}
}
