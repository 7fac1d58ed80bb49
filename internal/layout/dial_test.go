package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// bareDials lists the calls in src that open a WebSocket without
// msgconn.Dial or msgconn.Accept: websocket.Dial and msgconn.FromWebSocket.
// A socket made that way leaves the peer's pings to coder/websocket, whose
// pong gives the socket's reader up after 5 s behind a long frame write
// (docs/decisions.md, pong-owed), so a slow but healthy peer is dropped.
func bareDials(t *testing.T, fset *token.FileSet, name string, src any) []string {
	t.Helper()
	f, err := parser.ParseFile(fset, name, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && (x.Name == "websocket" && sel.Sel.Name == "Dial" || x.Name == "msgconn" && sel.Sel.Name == "FromWebSocket") {
			out = append(out, fset.Position(sel.Pos()).String()+" "+x.Name+"."+sel.Sel.Name)
		}
		return true
	})
	return out
}

// The product's Reach sockets (connector, client, the cluster's peer link)
// are dialed through msgconn.Dial, which answers pings itself.
func TestReachSocketsAreDialedThroughMsgconn(t *testing.T) {
	r := root(t)
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(r, "broker"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		if rel, _ := filepath.Rel(r, path); strings.HasPrefix(rel, filepath.Join("broker", "msgconn")+string(filepath.Separator)) {
			return nil // the adapter itself
		}
		for _, c := range bareDials(t, fset, path, nil) {
			t.Errorf("%s: dial Reach sockets with msgconn.Dial", c)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The check itself catches what it is for.
func TestBareDialsCatchesBothForms(t *testing.T) {
	src := "package x\nfunc f() { ws, _, _ := websocket.Dial(ctx, u, nil); _ = msgconn.FromWebSocket(ws, \"\"); _, _, _ = msgconn.Dial(ctx, u, nil, \"\") }\n"
	if got := bareDials(t, token.NewFileSet(), "x.go", src); len(got) != 2 {
		t.Fatalf("found %v, want websocket.Dial and msgconn.FromWebSocket only", got)
	}
}
