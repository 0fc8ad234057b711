package commands

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
)

// invocation is Env.Invocation.
func (g *global) invocation() string {
	if g.opts.Invocation != "" {
		return g.opts.Invocation
	}
	exe, _ := os.Executable()
	bi, _ := debug.ReadBuildInfo()
	wd, _ := os.Getwd()
	return invocationOf(os.Args[0], exe, bi, moduleAt(wd))
}

// invocationOf is how the binary at exe, started as args0 and built as bi,
// is run again from a directory that is the root of module cwdModule (""
// if none): "go run ./<dir>" or "go run <package>" when exe lies in go
// run's build cache (a go-build directory) and is not a test binary,
// else args0.
func invocationOf(args0, exe string, bi *debug.BuildInfo, cwdModule string) string {
	goRun := strings.Contains(filepath.ToSlash(exe), "/go-build") && bi != nil && bi.Path != "" && !strings.HasSuffix(bi.Path, ".test")
	if !goRun {
		return args0
	}
	if cwdModule != "" && cwdModule == bi.Main.Path {
		if bi.Path == bi.Main.Path {
			return "go run ."
		}
		if rel, ok := strings.CutPrefix(bi.Path, bi.Main.Path+"/"); ok {
			return "go run ./" + rel
		}
	}
	return "go run " + bi.Path
}

// moduleAt is the module path that dir/go.mod declares, "" without one.
func moduleAt(dir string) string {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}
