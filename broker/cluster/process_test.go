package cluster

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/testfake"
)

// TestClusterProcessKill runs three `securelink broker serve` processes
// with a `cluster:` block against the three-node JetStream cluster, kills
// the one holding the host with SIGKILL mid-transfer, and checks that the
// host, registering on another, is reached through every surviving
// instance with the credentials it published before.
func TestClusterProcessKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "securelink")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/securelink").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	hostsFile := filepath.Join(dir, "hosts.json")
	r := newEngineRig(t, hostsFile)
	certFile, keyFile, pool := testenv.WriteCert(t, dir)
	r.pool = pool
	ca := newPeerCA(t)
	urls := `["` + strings.Join(r.nats.urls(), `", "`) + `"]`
	addrs := make([]string, 3)
	procs := make([]*exec.Cmd, 3)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		name := fmt.Sprintf("b%d", i)
		pc, pk := ca.issue(name)
		peer := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		idir := filepath.Join(dir, name)
		if err := os.Mkdir(idir, 0o700); err != nil {
			t.Fatal(err)
		}
		cfg := fmt.Sprintf(`listen: %q
tls: {cert_file: %q, key_file: %q}
hosts_file: %q
state_file: %q
attempts_per_minute: 100000
log: {level: warn, format: json}
cluster:
  enabled: true
  instance_id: %s
  nats: {urls: %s, bucket_prefix: reach, replicas: 3}
  peer: {listen: %q, advertise: %q, cert_file: %q, key_file: %q, ca_file: %q}
  owner_ttl: %v
`, addrs[i], certFile, keyFile, hostsFile, filepath.Join(idir, "state.json"), name, urls, peer, peer, pc, pk, ca.CAFile,
			shortLease(outageEngineTimeout)) // engine_timeout: the default
		p := filepath.Join(idir, "broker.yaml")
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		procs[i] = startBrokerProc(t, bin, p)
	}
	r.url = func(i int) string { return "wss://" + addrs[i] + wire.ConnectPath }

	route := wire.Secret("route-" + testenv.RandomSecret(""))
	hA := r.hostOn(0)
	r.publishRoute(hA, "dev1", route)
	r.mirrored(hA, 2, route)
	drainOpens(hA)
	cC, idC := r.matched(hA, 2, wire.KindRoute, route) // forwarded by C to A
	echo(t, hA, cC, idC, payload(200_000))
	conn := wire.NewID()
	cA, idA := r.matchedConn(hA, 0, wire.KindRoute, route, conn)
	echo(t, hA, cA, idA, payload(200_000))
	cA.send(websocket.MessageBinary, payload(50_000)) // in flight at the kill
	cC.send(websocket.MessageBinary, payload(50_000))
	if err := procs[0].Process.Kill(); err != nil {
		t.Fatal(err)
	}
	procs[0].Wait()
	for _, p := range []*peer{cA, cC, hA} {
		for rr := p.read(); rr.err == nil; rr = p.read() {
		}
	}

	hB := r.hostOn(1)
	for _, i := range []int{1, 2} {
		c, id := r.matched(hB, i, wire.KindRoute, route)
		echo(t, hB, c, id, payload(300_000))
	}
	if _, m := r.client(2, wire.KindRoute, route, conn); code(m) != wire.CodeReplayed {
		t.Fatalf("connection_id accepted by the killed instance, reused on C: %#v", m)
	}
}

// startBrokerProc starts `securelink broker serve` and waits for the line
// saying it listens; the process is killed when the test ends.
func startBrokerProc(t *testing.T, bin, cfg string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "broker", "serve", "--config", cfg)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &testfake.LogBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "broker listening ") {
				close(ready)
				break
			}
		}
		for sc.Scan() {
		}
	}()
	select {
	case <-ready:
	case <-time.After(3 * testenv.Step):
		t.Fatalf("broker %s did not start: %s", cfg, stderr.String())
	}
	return cmd
}
