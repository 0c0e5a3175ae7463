package talaris_test

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/talaris-go/talaris/internal/testhook"
)

// TLS-only runs (TALARIS_TEST_TLS_ONLY=1, what ./build.sh test sets for the
// second TLS backend's pass): the two backends differ only in the TLS
// library linked (the #cgo lines of talaris_linux.go), so a test that
// never reaches TLS runs the same code on both and the default pass has
// run it. TestMain then runs only the tests that may reach TLS, as found
// by tlsTests from this package's source, and forEachTransport skips its
// ws:// half (tlsOnly).
// An explicit -run wins.
var tlsOnly = os.Getenv("TALARIS_TEST_TLS_ONLY") != ""

// The pass without the own TLS record layer (TALARIS_TEST_NO_TLSREC=1,
// with TALARIS_TEST_TLS_ONLY in ./build.sh test): every Pool reads TLS
// with the library's SSL_read (testhook.NoTLSRecordLayer); the tests of
// the own record layer itself skip (needOwnRecordLayer).
var noTLSRec = os.Getenv("TALARIS_TEST_NO_TLSREC") != ""

// needOwnRecordLayer skips a test of the own record layer in the pass
// that turns it off.
func needOwnRecordLayer(t *testing.T) {
	t.Helper()
	if noTLSRec {
		t.Skip("tests the own TLS record layer: off in this pass (TALARIS_TEST_NO_TLSREC)")
	}
}

func TestMain(m *testing.M) {
	testhook.NoTLSRecordLayer = noTLSRec
	if tlsOnly {
		flag.Parse()
		if f := flag.Lookup("test.run"); f != nil && f.Value.String() == "" {
			all, names, err := tlsTests(".")
			if err != nil || len(names) == 0 {
				fmt.Fprintf(os.Stderr, "TALARIS_TEST_TLS_ONLY: cannot select the TLS tests (%d found): %v\n", len(names), err)
				os.Exit(2)
			}
			fmt.Fprintf(os.Stderr, "TALARIS_TEST_TLS_ONLY: %d of %d tests may reach TLS; the others ran in the default backend's pass\n", len(names), all)
			if err := flag.Set("test.run", "^("+strings.Join(names, "|")+")$"); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
		}
	}
	os.Exit(m.Run())
}

// skipPlainInTLSOnly skips a ws:// subtest in a TLS-only run: its wss://
// sibling is what the second backend has to run.
func skipPlainInTLSOnly(t *testing.T) {
	t.Helper()
	if tlsOnly {
		t.Skip("ws:// half: ran in the default backend's pass (TALARIS_TEST_TLS_ONLY)")
	}
}

// tlsTests returns how many Test functions the package in dir declares and
// the names of those that may reach TLS: whose body, or anything it
// refers to (transitively), names something TLS (an identifier containing
// "tls" in any case: StartTLS, tlsOpts, useTLS, DialOptions.TLS,
// TLSBackend) or holds a string literal with "wss", "tls", "openssl" or
// "s_server". What a declaration refers to: every package-level
// function, variable, constant or type it names; a type refers to all its
// methods (a method runs only on a value of its type, and code that makes
// or declares one names the type). It over-selects (a test with a TLS
// helper it never calls on TLS still runs); it cannot miss a test that
// dials wss:// or starts a TLS peer through this package's code, since
// every such path names one of those.
func tlsTests(dir string) (int, []string, error) {
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return 0, nil, err
	}
	type node struct {
		marked bool
		refs   map[string]bool
	}
	nodes := map[string]*node{} // package-level names; methods as "Type.Name"
	get := func(name string) *node {
		if nodes[name] == nil {
			nodes[name] = &node{refs: map[string]bool{}}
		}
		return nodes[name]
	}
	var tests []string
	// scan adds what n names to nd (merged: a name may be declared twice,
	// in files with opposite build tags).
	scan := func(nd *node, n ast.Node) {
		ast.Inspect(n, func(x ast.Node) bool {
			switch x := x.(type) {
			case *ast.Ident:
				if strings.Contains(strings.ToLower(x.Name), "tls") {
					nd.marked = true
				}
				nd.refs[x.Name] = true
			case *ast.BasicLit:
				if x.Kind == token.STRING {
					s := strings.ToLower(x.Value)
					for _, w := range []string{"wss", "tls", "openssl", "s_server"} {
						if strings.Contains(s, w) {
							nd.marked = true
						}
					}
				}
			}
			return true
		})
	}
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return 0, nil, err
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				name := d.Name.Name
				if d.Recv != nil && len(d.Recv.List) == 1 {
					typ := recvType(d.Recv.List[0].Type)
					name = typ + "." + name
					get(typ).refs[name] = true
				} else if strings.HasPrefix(name, "Test") && name != "TestMain" {
					tests = append(tests, name)
				}
				scan(get(name), d)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, id := range s.Names {
							scan(get(id.Name), s)
						}
					case *ast.TypeSpec:
						scan(get(s.Name.Name), s)
					}
				}
			}
		}
	}
	// Fixpoint: a name is marked once anything it refers to is.
	for changed := true; changed; {
		changed = false
		for _, nd := range nodes {
			if nd.marked {
				continue
			}
			for r := range nd.refs {
				if o := nodes[r]; o != nil && o.marked {
					nd.marked, changed = true, true
					break
				}
			}
		}
	}
	var out []string
	for _, name := range tests {
		if nodes[name].marked {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return len(tests), out, nil
}

// recvType is the type name of a method receiver: T for T, *T, T[P].
func recvType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// TestTLSOnlySelection: the selection above keeps the tests that are TLS
// by name or by a helper they call, and leaves out some plain ones (else
// the TLS-only pass would save nothing).
func TestTLSOnlySelection(t *testing.T) {
	all, names, err := tlsTests(".")
	if err != nil {
		t.Fatal(err)
	}
	sel := map[string]bool{}
	for _, n := range names {
		sel[n] = true
	}
	t.Logf("%d of %d tests selected for TLS-only runs", len(names), all)
	if testing.Verbose() {
		_, plain := tlsSplit(t, sel)
		t.Logf("left to the default pass: %s", strings.Join(plain, " "))
	}
	// TLS by name, by forEachTransport, by startWS, by tlsOpts, by a
	// Python peer with TLS, by the TLS server helper:
	for _, want := range []string{"TestTLSVersions", "TestHostileAPIRaces", "TestFairShareFloodsAlone",
		"TestPoolCloseRace", "TestPythonWebsockets", "TestFaultTLSCutMidRecord", "TestTLSOnlySelection"} {
		if !sel[want] {
			t.Errorf("%s not selected for the TLS-only pass", want)
		}
	}
	for _, plain := range []string{"TestIntegrity", "TestManyConnections"} {
		if sel[plain] {
			t.Errorf("%s (ws:// only) selected for the TLS-only pass", plain)
		}
	}
	if len(names) == all {
		t.Errorf("every test selected: the TLS-only pass would save nothing")
	}
}

// tlsSplit lists this package's Test functions that sel leaves out.
func tlsSplit(t *testing.T, sel map[string]bool) (int, []string) {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var plain []string
	n := 0
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Test") && fd.Name.Name != "TestMain" {
					n++
					if !sel[fd.Name.Name] {
						plain = append(plain, fd.Name.Name)
					}
				}
			}
		}
	}
	sort.Strings(plain)
	return n, plain
}
