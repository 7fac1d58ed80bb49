package main

// The shipped clients' own stacks against the live front: the desktop
// client's recipe under Bun 1.3.14 (its runtime) and Node, and the Android
// app's recipe on a JVM with OkHttp. Installed by scripts/ensure-test-deps.sh;
// absent runtimes skip outside CI and fail in CI (CI=true).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/pinning"
	"github.com/hermes-securelink/securelink/pinning/pinningtest"
)

const bunVersion = "1.3.14"

// needRuntime skips (outside CI) or fails (in CI) when a client stack is
// missing.
func needRuntime(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing in CI (scripts/ensure-test-deps.sh installs it): %v", what, err)
	}
	t.Skipf("%s is missing (run scripts/ensure-test-deps.sh): %v", what, err)
}

// bun is the project-local Bun that scripts/ensure-test-deps.sh installs.
func bun(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../../.cache/bun/node_modules/@oven/bun-linux-x64/bin/bun")
	if err == nil {
		var out []byte
		if out, err = exec.Command(p, "--version").Output(); err == nil && strings.TrimSpace(string(out)) != bunVersion {
			t.Fatalf("Bun %s installed, want %s (scripts/ensure-test-deps.sh)", strings.TrimSpace(string(out)), bunVersion)
		}
	}
	needRuntime(t, "Bun "+bunVersion, err)
	return p
}

func node(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("node")
	needRuntime(t, "node", err)
	return p
}

type recipeResult struct {
	OK      bool   `json:"ok"`
	Stage   string `json:"stage"`
	Runtime string `json:"runtime"`
	Error   string `json:"error"`
}

// runRecipe runs a client recipe and reads its one JSON line.
func runRecipe(t *testing.T, env []string, runtime string, args ...string) recipeResult {
	t.Helper()
	cmd := exec.Command(runtime, args...)
	cmd.Env = append(os.Environ(), env...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%s %v did not finish: %s %s", runtime, args, so.String(), se.String())
	}
	var r recipeResult
	line := strings.TrimSpace(so.String())
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("%s %v: no result line: %q %q", runtime, args, so.String(), se.String())
	}
	return r
}

// frontFor starts a daemon whose authority is advertise, in front of an
// echoing Relay; legacy (when set) is the identity file it finds.
func frontFor(t *testing.T, advertise string, legacy []byte) *daemonProc {
	t.Helper()
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, echoRelay(t))
	setAdvertise(t, cfgPath, advertise)
	if legacy != nil {
		state := filepath.Join(dir, "state")
		if err := os.MkdirAll(state, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(pinning.IdentityPath(state), legacy, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return startDaemon(t, cfgPath)
}

// setAdvertise replaces writeConfig's advertise line.
func setAdvertise(t *testing.T, cfgPath, host string) {
	t.Helper()
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	nb := bytes.Replace(b, []byte(`advertise: "127.0.0.1"`), []byte(`advertise: "`+host+`"`), 1)
	if bytes.Equal(b, nb) && host != "127.0.0.1" {
		t.Fatal("writeConfig has no advertise line to replace")
	}
	if err := os.WriteFile(cfgPath, nb, 0o600); err != nil {
		t.Fatal(err)
	}
}

func relayWSURL(host string, d *daemonProc) string {
	_, port, _ := strings.Cut(d.addr, ":")
	return "wss://" + host + ":" + port + "/relay/ws"
}

const desktopRecipe = "testdata/clients/desktop.mjs"

var wrongPin = "sha256/" + strings.Repeat("A", 43) + "="

// The desktop client's pinned route, as it opens it (desktop.mjs names the
// client lines), under Bun 1.3.14 and Node against a DNS-name authority:
// the current identity profile connects with the right pin and is refused
// with a wrong one.
func TestDesktopClientConnectsWithTheCurrentProfile(t *testing.T) {
	runtimes := map[string]string{"bun": bun(t), "node": node(t)}
	d := frontFor(t, "localhost", nil)
	for name, rt := range runtimes {
		t.Run(name, func(t *testing.T) {
			if r := runRecipe(t, nil, rt, desktopRecipe, relayWSURL("localhost", d), d.pin); !r.OK || r.Stage != "echo" {
				t.Fatalf("right pin: %+v\ndaemon: %s", r, d.stderr.String())
			}
			if r := runRecipe(t, nil, rt, desktopRecipe, relayWSURL("localhost", d), wrongPin); r.OK || r.Stage != "pin" || !strings.Contains(r.Error, "pin mismatch") {
				t.Fatalf("wrong pin: %+v", r)
			}
		})
	}
}

// The older profile (keyUsage digitalSignature) is what the released
// desktop client could not use: Bun refuses it as its own trust anchor in
// the live WebSocket handshake after the pin matched. Node accepts it, so
// only the client's own runtime shows the failure.
func TestDesktopClientRefusesTheOldProfileOnBun(t *testing.T) {
	b, n := bun(t), node(t)
	legacy, err := pinningtest.LegacyIdentityPEM("localhost")
	if err != nil {
		t.Fatal(err)
	}
	d := frontFor(t, "localhost", legacy)
	r := runRecipe(t, nil, b, desktopRecipe, relayWSURL("localhost", d), d.pin)
	if r.OK || r.Stage != "websocket" || !strings.Contains(r.Error, "TLS handshake failed") {
		t.Fatalf("Bun with the old profile: %+v (want the WebSocket's TLS handshake to fail)", r)
	}
	if r := runRecipe(t, nil, n, desktopRecipe, relayWSURL("localhost", d), d.pin); !r.OK {
		t.Fatalf("Node with the old profile: %+v", r)
	}
}

// An IP authority: Bun refuses an IP address as TLS server name, so the
// desktop client cannot connect (pair and doctor say so).
func TestDesktopClientCannotUseAnIPAuthorityOnBun(t *testing.T) {
	b := bun(t)
	d := frontFor(t, "127.0.0.1", nil)
	r := runRecipe(t, nil, b, desktopRecipe, relayWSURL("127.0.0.1", d), d.pin)
	if r.OK || r.Stage != "pin" || !strings.Contains(r.Error, "IP address") {
		t.Fatalf("Bun with an IP authority: %+v (want the probe refused for an IP server name)", r)
	}
}

const androidRecipe = "testdata/clients/AndroidPinned.java"

// okhttp is the classpath of Debian's OkHttp (libokhttp-java), which
// scripts/ensure-test-deps.sh installs with the JDK.
func okhttp(t *testing.T) (java, classpath string) {
	t.Helper()
	java, err := exec.LookPath("java")
	needRuntime(t, "java (openjdk-17-jdk-headless)", err)
	jars := []string{"/usr/share/java/okhttp.jar", "/usr/share/java/okio.jar"}
	for _, j := range jars {
		_, err := os.Stat(j)
		needRuntime(t, "OkHttp (libokhttp-java)", err)
	}
	return java, strings.Join(jars, ":")
}

// compileAndroid compiles the recipe once (launching the source file
// compiles it on every run, seconds each).
func compileAndroid(t *testing.T, cp string) string {
	t.Helper()
	javac, err := exec.LookPath("javac")
	needRuntime(t, "javac (openjdk-17-jdk-headless)", err)
	dir := t.TempDir()
	if out, err := exec.Command(javac, "-cp", cp, "-d", dir, androidRecipe).CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	return dir
}

func runAndroid(t *testing.T, java, cp string, props []string, url, pin string) recipeResult {
	t.Helper()
	args := append(append([]string{}, props...), "-cp", cp, "AndroidPinned", url, pin)
	return runRecipe(t, nil, java, args...)
}

// The Android app's recipe refuses the self-signed identity even with the
// right pin: OkHttp cleans the chain against the trust manager's accepted
// issuers (the system's) before CertificatePinner compares pins, and a
// self-signed leaf chains to none of them. This is why pair and doctor say
// Android needs tls.mode acme. The control: the same recipe accepts a
// certificate that chains to a root in its trust store, and then still
// refuses a wrong pin.
func TestAndroidAppRefusesTheSelfSignedIdentity(t *testing.T) {
	java, cp := okhttp(t)
	cp = compileAndroid(t, cp) + ":" + cp
	d := frontFor(t, "localhost", nil)
	url := "https://" + strings.Replace(d.addr, "127.0.0.1", "localhost", 1) + "/relay/health"
	r := runAndroid(t, java, cp, nil, url, d.pin)
	if r.OK || !strings.Contains(r.Error, "SSLPeerUnverifiedException") || !strings.Contains(r.Error, "Failed to find a trusted cert that signed") {
		t.Fatalf("self-signed identity with the right pin: %+v (want OkHttp's chain cleaner to refuse it)", r)
	}
	t.Logf("%s: %.120s", r.Runtime, r.Error)

	// Control: files mode with a leaf from a CA the JVM trusts.
	dir := t.TempDir()
	caPEM, certPEM, keyPEM, err := pinningtest.IssuedPEM("localhost")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "ca.pem")
	os.WriteFile(certFile, certPEM, 0o644)
	os.WriteFile(keyFile, keyPEM, 0o600)
	os.WriteFile(caFile, caPEM, 0o644)
	store := filepath.Join(dir, "trust.p12")
	if out, err := exec.Command("keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", caFile,
		"-keystore", store, "-storetype", "PKCS12", "-storepass", "changeit").CombinedOutput(); err != nil {
		t.Fatalf("keytool: %v %s", err, out)
	}
	cfgPath := writeConfig(t, dir, echoRelay(t))
	setAdvertise(t, cfgPath, "localhost")
	appendConfig(t, cfgPath, "tls:\n  mode: files\n  cert_file: "+certFile+"\n  key_file: "+keyFile+"\n")
	fd := startDaemon(t, cfgPath)
	furl := "https://" + strings.Replace(fd.addr, "127.0.0.1", "localhost", 1) + "/relay/health"
	props := []string{"-Djavax.net.ssl.trustStore=" + store, "-Djavax.net.ssl.trustStorePassword=changeit", "-Djavax.net.ssl.trustStoreType=PKCS12"}
	if r := runAndroid(t, java, cp, props, furl, fd.pin); !r.OK {
		t.Fatalf("a certificate from a trusted CA with the right pin: %+v\ndaemon: %s", r, fd.stderr.String())
	}
	if r := runAndroid(t, java, cp, props, furl, wrongPin); r.OK || !strings.Contains(r.Error, "Certificate pinning failure") {
		t.Fatalf("a trusted certificate with a wrong pin: %+v", r)
	}
}

// The desktop client pairs through Reach (desktop-reach.mjs names the client
// lines): the outbound_broker candidate of the QR `pair` prints carries it
// through our broker to the front, and its Relay WebSocket echoes, under
// Bun 1.3.14 against a DNS-name authority. The bootstrap then is spent.
func TestDesktopClientThroughReachOnBun(t *testing.T) {
	b := bun(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	certFile, keyFile := brokerCert(t, dir)
	bport := freePort(t)
	bcfg := writeBrokerConfig(t, dir, fmt.Sprintf("listen: \"127.0.0.1:%d\"\ntls: {cert_file: %s, key_file: %s}\n", bport, certFile, keyFile))
	hostID, hostToken := addHost(t, bcfg)
	startLineProc(t, "broker listening", "broker", "serve", "--config", bcfg)
	tokenFile := filepath.Join(dir, "host.token")
	os.WriteFile(tokenFile, []byte(hostToken+"\n"), 0o600)
	cfgPath := writeConfig(t, dir, echoRelay(t))
	setAdvertise(t, cfgPath, "localhost")
	appendConfig(t, cfgPath, fmt.Sprintf("reach:\n  enabled: true\n  broker_url: \"wss://127.0.0.1:%d/v1/connect\"\n  host_id: %q\n  host_token_file: %q\n  ca_file: %q\n",
		bport, hostID, tokenFile, certFile))
	d := startDaemon(t, cfgPath)
	cl := admin.NewClient(filepath.Join(dir, "state", "admin.sock"))
	eventually(t, 30*time.Second, func() string { return "connector never connected: " + d.stderr.String() }, func() bool {
		var st struct {
			Reach connector.Status `json:"reach"`
		}
		_, err := cl.Do(context.Background(), "GET", "/status", nil, &st)
		return err == nil && st.Reach.State == "connected"
	})

	secret := bytes.Repeat([]byte{3}, 32)
	home := newHermesHome(t, dir, secret)
	eps := pairReachEndpoints(t, home, cfgPath, fakeMintRelay(t, secret, nil).URL)
	candFile := filepath.Join(dir, "reach-candidate.json")
	os.WriteFile(candFile, eps[1], 0o600)
	env := []string{"NODE_EXTRA_CA_CERTS=" + certFile}
	if r := runRecipe(t, env, b, "testdata/clients/desktop-reach.mjs", candFile); !r.OK || r.Stage != "echo" {
		t.Fatalf("desktop through Reach: %+v\ndaemon: %s", r, d.stderr.String())
	}
	if r := runRecipe(t, env, b, "testdata/clients/desktop-reach.mjs", candFile); r.OK || !strings.Contains(r.Error, "replayed") {
		t.Fatalf("a spent bootstrap carried a second connection: %+v", r)
	}
}
