package pgdurable_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeMaxLines keeps the README a ten-minute read: what it is, the two
// commands, a workflow, the guarantees and links. Everything else belongs
// on a page under docs/.
const readmeMaxLines = 300

// markdownLink finds the targets of inline links and images.
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// The README stays short and links every page under docs/, and every
// relative link in the README and the pages resolves to a file (and, for
// a link to a heading, to a heading of that file).
func TestReadmeIsShortAndLinksEveryPage(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	lines := strings.Count(string(readme), "\n")
	require.LessOrEqual(t, lines, readmeMaxLines, "README.md has %d lines", lines)
	require.Contains(t, string(readme), "<!-- test-command -->", ".ci/run reads the test command between these markers")

	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, pages)
	linked := map[string]bool{}
	for _, m := range markdownLink.FindAllStringSubmatch(withoutCode(string(readme)), -1) {
		linked[filepath.Clean(strings.SplitN(m[1], "#", 2)[0])] = true
	}
	for _, p := range pages {
		require.True(t, linked[p], "README.md does not link %s", p)
	}

	for _, file := range append([]string{"README.md"}, pages...) {
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range markdownLink.FindAllStringSubmatch(withoutCode(string(text)), -1) {
			target := m[1]
			if u, err := url.Parse(target); err == nil && u.Scheme != "" {
				continue // an outside address: not checked offline
			}
			name, anchor, _ := strings.Cut(target, "#")
			dest := file
			if name != "" {
				dest = filepath.Join(filepath.Dir(file), name)
			}
			info, err := os.Stat(dest)
			require.NoError(t, err, "%s links %s, which does not exist", file, target)
			if anchor != "" {
				require.False(t, info.IsDir(), "%s links a heading of a directory: %s", file, target)
				body, err := os.ReadFile(dest)
				require.NoError(t, err)
				require.Contains(t, headingAnchors(string(body)), anchor, "%s links %s: no such heading", file, target)
			}
		}
	}
}

// inlineCode matches `code` spans, whose brackets are not links.
var inlineCode = regexp.MustCompile("`[^`\n]*`")

// withoutCode is md without its fenced blocks and code spans.
func withoutCode(md string) string {
	var b strings.Builder
	inCode := false
	for line := range strings.Lines(md) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			b.WriteString(inlineCode.ReplaceAllString(line, "``"))
		}
	}
	return b.String()
}

// exampleLink matches a link to runnable examples: [`ExampleX`, `pkg.ExampleY`](file).
var exampleLink = regexp.MustCompile("\\[((?:`(?:\\w+\\.)?Example\\w*`(?:, )?)+)\\]\\(([^)]+)\\)")

// The README's table of runnable examples names functions that exist in
// the files it links, one for each feature it lists.
func TestReadmeExamplesExist(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	links := exampleLink.FindAllStringSubmatch(string(readme), -1)
	require.GreaterOrEqual(t, len(links), 15, "the README lists an example per feature")
	for _, m := range links {
		src, err := os.ReadFile(m[2])
		require.NoError(t, err)
		for _, name := range regexp.MustCompile("`(?:\\w+\\.)?(Example\\w*)`").FindAllStringSubmatch(m[1], -1) {
			require.Contains(t, string(src), "func "+name[1]+"()", "%s has no %s", m[2], name[1])
			require.Contains(t, string(src), "// Output:", "%s: %s checks no output", m[2], name[1])
		}
	}
}

// headingAnchors are the anchors GitHub gives a Markdown file's headings:
// lower case, punctuation dropped, spaces as dashes.
func headingAnchors(md string) []string {
	var out []string
	inCode := false
	for line := range strings.Lines(md) {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ' || r == '-':
				b.WriteRune('-')
			case r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') || r > 127:
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}

// docImports are the packages a snippet may use without importing them:
// a snippet shows the calls, not the import block. Each page is one
// package; unused imports and variables are not errors there.
var docImports = []string{
	"context", "encoding/json", "errors", "fmt", "io", "log", "net/http", "os", "testing", "time",
	"github.com/jackc/pgx/v5", "github.com/jackc/pgx/v5/pgxpool",
	"github.com/pgdurable/pgdurable/activities",
	"github.com/pgdurable/pgdurable/compensation",
	"github.com/pgdurable/pgdurable/engine",
	"github.com/pgdurable/pgdurable/engine/enginetest",
	"github.com/pgdurable/pgdurable/storage/migrations",
	"github.com/pgdurable/pgdurable/cmd/engine/commands",
}

// docsPrelude declares, per page, what its snippets use and do not show:
// the caller's values (ctx, e, pool) and the functions the prose says
// stand for your own code. Keep it to names the page's text explains.
var docsPrelude = map[string]string{
	"README.md": `
func chargeCard(context.Context, Order) (string, error) { return "", nil }
`,
	"docs/queues.md": `
func chargeCode(*engine.Context, Payment) (string, error) { return "", nil }
`,
	"docs/concepts.md": `
var ctx context.Context
`,
	"docs/deploys.md": `
var ctx *engine.Context
var checkout *engine.Workflow[string, string]
var e *engine.Engine
type Receipt struct{}
func checkoutCode(*engine.Context, string) (Receipt, error) { return Receipt{}, nil }
func checkoutCodeV2(*engine.Context, string) (Receipt, error) { return Receipt{}, nil }
func checkoutCodeV3(*engine.Context, string) (Receipt, error) { return Receipt{}, nil }
func checkFraud(context.Context) (bool, error) { return true, nil }
`,
	"docs/steps-and-activities.md": `
var (
	ctx      *engine.Context
	qty      int
	sku      string
	apiURL   string
	client   = activities.NewHTTPClient(0)
	o        struct{ ID string; Amount int }
	fetchQuote func(context.Context) (int, error)
)
type ChargeReq struct{ OrderID string; Amount int }
type Charge struct{ ID string }
func form(ChargeReq) io.Reader { return nil }
func decodeCharge(io.Reader) (Charge, error) { return Charge{}, nil }
`,
	"docs/errors.md": `
var (
	ctx *engine.Context
	charge *activities.Activity[ChargeReq, Charge]
	req ChargeReq
	chargePrimary, chargeFallback func(context.Context, *engine.ActivityAttempt) (string, error)
)
type ChargeReq struct{ OrderID string }
type Charge struct{ ID string }
`,
	"docs/composition.md": `
var (
	ctx *engine.Context
	carriers []interface{ Quote(context.Context, string) (Quote, error) }
	parcel string
	review *engine.ChildRun[string]
	refundWorkflow *engine.Workflow[RefundReq, string]
	ch struct{ ID string }
)
type Quote struct{}
type RefundReq struct{ Charge string }
type Receipt struct{}
`,
	"docs/sagas-and-cancellation.md": `
var (
	ctx *engine.Context
	reserve func(context.Context, pgx.Tx) (int, error)
	release func(context.Context, pgx.Tx, int) error
	charge *activities.Activity[ChargeReq, Charge]
	req ChargeReq
)
type ChargeReq struct{}
type Charge struct{ ID string }
type Receipt struct{}
func refund(context.Context, string, string) error { return nil }
`,
	"docs/time.md": `
var (
	ctx context.Context
	e *engine.Engine
	runIDOrWorkflowID string
)
type Expense struct{}
type Approval struct{ By string }
`,
	"docs/operating.md": `
var checkout *engine.Workflow[struct{}, string]
func myMigrations(context.Context, *pgxpool.Pool) error { return nil }
`,
}

// codeBlock is one fenced Go block of a Markdown file.
type codeBlock struct {
	file string
	line int
	text string
	// results are the result types of the function a block of
	// statements is the body of, from a "<!-- go-results: (T, error) -->"
	// line right above the block: for a snippet that returns.
	results string
}

var goResults = regexp.MustCompile(`^<!-- go-results: (.*) -->$`)

// goBlocks returns the fenced ```go blocks of a Markdown file.
func goBlocks(t *testing.T, file string) []codeBlock {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var out []codeBlock
	var cur *codeBlock
	var results, prev string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n, prev = n+1, sc.Text() {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			results = ""
			if m := goResults.FindStringSubmatch(prev); m != nil {
				results = m[1]
			}
			cur = &codeBlock{file: file, line: n + 1, results: results}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a ```go block is not closed", file)
	return out
}

// Every ```go block in the README and under docs/ type-checks against
// the module's current API, so a page cannot fall behind a rename. The
// blocks of one page form one package: a block that starts with a package
// clause is a file of it, a block of declarations is a file, and a block
// of statements is the body of a function. docsPrelude supplies what the
// page's prose says the snippets assume.
func TestDocsCodeBlocksCompile(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	pages = append([]string{"README.md"}, pages...)
	exports := exportData(t)
	for _, page := range pages {
		blocks := goBlocks(t, page)
		if len(blocks) == 0 {
			continue
		}
		t.Run(page, func(t *testing.T) {
			checkPage(t, page, blocks, exports)
		})
	}
	for page := range docsPrelude {
		require.Contains(t, pages, page, "docsPrelude names a page that does not exist")
	}
}

func checkPage(t *testing.T, page string, blocks []codeBlock, exports map[string]string) {
	fset := token.NewFileSet()
	imports := "import (\n"
	for _, imp := range docImports {
		imports += fmt.Sprintf("\t%q\n", imp)
	}
	imports += ")\n"
	var files []*ast.File
	// origin maps a generated file's name to the block it came from, for
	// the error messages.
	origin := map[string]codeBlock{}
	add := func(name, src string, b codeBlock) {
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		require.NoError(t, err, "%s:%d: the block does not parse", b.file, b.line)
		files = append(files, f)
		origin[name] = b
	}
	add("prelude.go", "package docs\n"+imports+docsPrelude[page], codeBlock{file: page + " (docsPrelude)", line: 1})
	for i, b := range blocks {
		name := fmt.Sprintf("block%d.go", i)
		switch {
		case strings.HasPrefix(b.text, "package "):
			_, rest, _ := strings.Cut(b.text, "\n")
			add(name, "package docs\n"+rest, b)
		case parsesAsFile("package docs\n" + b.text):
			add(name, "package docs\n"+imports+b.text, b)
		default:
			add(name, "package docs\n"+imports+"func _() "+b.results+" {\n"+b.text+"}\n", b)
		}
	}
	conf := types.Config{
		Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
			file, ok := exports[path]
			if !ok {
				return nil, fmt.Errorf("no export data for %s: add it to docImports", path)
			}
			return os.Open(file)
		}),
		Error: func(err error) {
			var te types.Error
			if errors.As(err, &te) && (strings.Contains(te.Msg, "not used") || te.Msg == "missing return") {
				return // a snippet shows a call, not what the caller does after it
			}
			pos := fset.Position(te.Pos)
			b := origin[pos.Filename]
			t.Errorf("%s, block at line %d: %s (generated %s:%d)", b.file, b.line, te.Msg, pos.Filename, pos.Line)
		},
	}
	_, _ = conf.Check("docs", fset, files, nil)
}

// parsesAsFile reports whether src is a Go file: a block of declarations.
func parsesAsFile(src string) bool {
	_, err := parser.ParseFile(token.NewFileSet(), "", src, parser.SkipObjectResolution)
	return err == nil
}

// exportData builds docImports and their dependencies (from the build
// cache, usually) and returns each package's export data file.
func exportData(t *testing.T) map[string]string {
	t.Helper()
	args := []string{"list", "-export", "-deps", "-json=ImportPath,Export"}
	if raceEnabled {
		args = append(args, "-race") // the test binary's own build: cached
	}
	if bi, ok := debug.ReadBuildInfo(); ok && slices.Contains(bi.Settings, debug.BuildSetting{Key: "-trimpath", Value: "true"}) {
		args = append(args, "-trimpath") // as the README's test command builds: cached too
	}
	cmd := exec.Command("go", append(args, docImports...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	exports := map[string]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		if p.Export != "" {
			exports[p.ImportPath] = p.Export
		}
	}
	require.True(t, slices.ContainsFunc(docImports, func(p string) bool { return exports[p] != "" }))
	return exports
}
