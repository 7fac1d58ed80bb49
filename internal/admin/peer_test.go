package admin

// Who may serve and who may open the admin socket, with real sockets and,
// when the tests run as root, real processes of another uid (nobody): the
// test binary re-runs itself as a helper (TestMain, ADMIN_TEST_HELPER).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/otheruid"
)

const nobody = otheruid.Nobody

func TestMain(m *testing.M) {
	sock := os.Getenv("ADMIN_TEST_SOCK")
	switch os.Getenv("ADMIN_TEST_HELPER") {
	case "serve": // a squatter: any HTTP server on the socket path
		ln, err := net.Listen("unix", sock)
		if err != nil {
			fmt.Println("listen:", err)
			os.Exit(1)
		}
		go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, http.StatusOK, map[string]string{"pin_sha256": "squatter"})
		}))
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin) // until the test closes stdin
		os.Exit(0)
	case "dial":
		_, err := NewClient(sock).Do(context.Background(), "GET", "/status", nil, nil)
		fmt.Println(err)
		os.Exit(0)
	case "listen":
		s, err := Listen(sock, zerolog.Nop())
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		s.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helper runs the test binary's copy in d as uid in mode against sock.
func helper(d otheruid.Dir, uid int, mode, sock string) *exec.Cmd {
	return d.Command(uid, []string{"ADMIN_TEST_HELPER=" + mode, "ADMIN_TEST_SOCK=" + sock})
}

func stateDir(t *testing.T, parent string, mode os.FileMode) string {
	t.Helper()
	d := filepath.Join(parent, "state")
	if err := os.Mkdir(d, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, mode); err != nil {
		t.Fatal(err)
	}
	return d
}

// A process of another uid bound the socket path (the daemon was stopped):
// the client refuses it before sending anything, rather than pair against
// whatever it answers.
func TestClientRefusesAServerOfAnotherUser(t *testing.T) {
	if os.Getuid() != 0 {
		// Without root there is no second uid: our own server, with the
		// expected uid another one.
		path := filepath.Join(t.TempDir(), "admin.sock")
		s, err := Listen(path, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		go s.Serve()
		defer s.Close()
		c := NewClient(path)
		c.serverUID = func() (int, error) { return os.Getuid() + 1, nil }
		if _, err := c.Do(context.Background(), "GET", "/status", nil, nil); !errors.Is(err, ErrUntrustedServer) {
			t.Fatalf("a server of uid %d, expected %d: %v, want ErrUntrustedServer", os.Getuid(), os.Getuid()+1, err)
		}
		return
	}
	d := otheruid.New(t)
	dir := d.Path
	state := stateDir(t, dir, 0o777) // root's, but anyone may bind in it
	sock := filepath.Join(state, "admin.sock")
	squatter := helper(d, nobody, "serve", sock)
	stdin, err := squatter.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := squatter.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := squatter.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); squatter.Wait() }()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("squatter: %q", line)
	}
	// The squatter does answer HTTP on the socket.
	hc := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	res, err := hc.Get("http://admin/identity")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("squatter not answering: %v", err)
	}
	res.Body.Close()

	var out2 map[string]string
	_, err = NewClient(sock).Do(context.Background(), "GET", "/identity", nil, &out2)
	if !errors.Is(err, ErrUntrustedServer) || errors.Is(err, ErrNoDaemon) || !strings.Contains(err.Error(), fmt.Sprintf("uid %d", nobody)) {
		t.Fatalf("client against a squatter of uid %d: %v, want ErrUntrustedServer naming the uid", nobody, err)
	}
	if out2 != nil {
		t.Fatalf("the client decoded the squatter's answer: %v", out2)
	}
	// The same check admits a server of the expected uid.
	c := NewClient(sock)
	c.serverUID = func() (int, error) { return nobody, nil }
	if _, err := c.Do(context.Background(), "GET", "/identity", nil, &out2); err != nil || out2["pin_sha256"] != "squatter" {
		t.Fatalf("with uid %d expected: %v %v", nobody, err, out2)
	}
}

// A socket the caller may not open says so and who may, instead of "no
// daemon is running".
func TestPermissionDeniedIsNotNoDaemon(t *testing.T) {
	d := otheruid.New(t)
	dir := d.Path
	state := stateDir(t, dir, 0o755)
	sock := filepath.Join(state, "admin.sock")
	s, err := Listen(sock, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	defer s.Close()
	var msg string
	if os.Getuid() == 0 {
		b, err := helper(d, nobody, "dial", sock).CombinedOutput()
		if err != nil {
			t.Fatalf("helper: %v %s", err, b)
		}
		msg = string(b)
	} else {
		if err := os.Chmod(sock, 0); err != nil {
			t.Fatal(err)
		}
		_, err := NewClient(sock).Do(context.Background(), "GET", "/status", nil, nil)
		if !errors.Is(err, ErrPermission) {
			t.Fatalf("%v, want ErrPermission", err)
		}
		msg = err.Error()
	}
	if !strings.Contains(msg, ErrPermission.Error()) || strings.Contains(msg, ErrNoDaemon.Error()) ||
		!strings.Contains(msg, "root") || !strings.Contains(msg, "service user") {
		t.Fatalf("a caller who may not open the socket was told: %s", msg)
	}
}

// The socket is 0600 whatever the process umask, and Listen leaves the
// umask alone (it is process-wide: a directory another goroutine creates
// meanwhile would get its bits). strace sees every umask call of a helper
// process that listens.
func TestListenKeepsTheUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "admin.sock")
	s, err := Listen(path, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	s.Close()
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket under umask 0: %v %v, want 0600", fi.Mode().Perm(), err)
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("no strace to watch the umask calls")
	}
	d := otheruid.New(t)
	dir := d.Path
	trace := filepath.Join(dir, "trace")
	cmd := helper(d, os.Getuid(), "listen", filepath.Join(dir, "admin.sock"))
	cmd.Args = append([]string{strace, "-f", "-qq", "-e", "trace=umask", "-o", trace}, cmd.Path)
	cmd.Path = strace
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("strace: %v %s", err, b)
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "umask(") {
		t.Fatalf("Listen changed the process umask:\n%s", b)
	}
}

// A daemon not running as root may not serve a socket in a directory it
// does not own (here root's, writable by all, as /tmp is): its own clients
// would refuse it as a squatter, so Listen refuses it first.
func TestListenRefusesADirectoryOfAnotherOwner(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run the daemon side as another uid")
	}
	d := otheruid.New(t)
	shared := stateDir(t, d.Path, 0o777) // root's, but anyone may bind in it
	b, err := helper(d, nobody, "listen", filepath.Join(shared, "admin.sock")).CombinedOutput()
	if err == nil || !strings.Contains(string(b), "admin.socket") || !strings.Contains(string(b), "belongs to uid 0") {
		t.Fatalf("nobody's Listen in root's shared directory: %v %s", err, b)
	}
	own := filepath.Join(d.Path, "own")
	if err := os.Mkdir(own, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(own, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if b, err := helper(d, nobody, "listen", filepath.Join(own, "admin.sock")).CombinedOutput(); err != nil {
		t.Fatalf("nobody's Listen in its own directory: %v %s", err, b)
	}
}
