package reachtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// Sizes of the bulk transfers; the race detector gets smaller ones (see
// raceEnabled).
var (
	downloadMin = pick(100<<20, 16<<20) // at least this much, while the other stream loops
	uploadSize  = pick(32<<20, 32<<20)  // the size the reference cut; race runs keep it
)

func pick(normal, race int64) int64 {
	if raceEnabled {
		return race
	}
	return normal
}

// chachaReader is a deterministic pseudo-random byte stream.
func chachaReader(seed byte) *rand.ChaCha8 {
	var s [32]byte
	s[0] = seed
	return rand.NewChaCha8(s)
}

// hashingWriter counts and hashes what passes.
type hashingWriter struct {
	n atomic.Int64
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
}

func newHashingWriter() *hashingWriter { return &hashingWriter{h: sha256.New()} }

func (w *hashingWriter) Write(p []byte) (int, error) {
	w.h.Write(p)
	w.n.Add(int64(len(p)))
	return len(p), nil
}

func (w *hashingWriter) hex() string { return hex.EncodeToString(w.h.Sum(nil)) }

// bulkResult is what the /big handler wrote.
type bulkResult struct {
	n      int64
	sum    string
	capped bool // stopped at the cap, not because the other stream finished
	err    error
}

// TestBulkDownloadDoesNotStarveOtherStreams: one stream downloads at full
// speed through broker, connector and front while another stream of the
// same host runs sequential small requests. The upstream keeps sending
// until the small loop has finished (and at least downloadMin bytes went
// out), so the loop runs entirely while the bulk stream is saturating every
// hop. The download is checked byte for byte.
func TestBulkDownloadDoesNotStarveOtherStreams(t *testing.T) {
	r := startReach(t, reachOptions{})
	loopDone := make(chan struct{})
	results := make(chan bulkResult, 1)
	// Plain v1 has head-of-line blocking on the host socket: each small
	// response waits behind the bulk bytes already queued in the broker and
	// the TCP buffers (a few MiB). 20 requests therefore cost some tens of
	// MiB of download; 1 GiB means the small stream was starved.
	const capBytes = 1 << 30
	r.front.api.handle("/big", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		src := chachaReader(1)
		hw := newHashingWriter()
		buf := make([]byte, 128<<10)
		res := bulkResult{}
		for {
			if hw.n.Load() >= downloadMin {
				select {
				case <-loopDone:
					res.n, res.sum = hw.n.Load(), hw.hex()
					results <- res
					return
				default:
				}
			}
			if hw.n.Load() >= capBytes {
				res.n, res.sum, res.capped = hw.n.Load(), hw.hex(), true
				results <- res
				return
			}
			src.Read(buf)
			if _, err := w.Write(buf); err != nil {
				res.err = err
				results <- res
				return
			}
			hw.Write(buf)
		}
	})

	bulk, small := r.open(), r.open()
	if err := bulk.writeRequest(http.MethodGet, "/api/big", nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	bulk.tc.SetDeadline(time.Now().Add(bulkDeadline))
	resp, err := http.ReadResponse(bulk.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/api/big: %d", resp.StatusCode)
	}
	got := newHashingWriter()
	started := make(chan struct{})
	copied := make(chan error, 1)
	go func() {
		// The first MiB proves the bulk stream is flowing before the
		// loop starts.
		_, err := io.CopyN(got, resp.Body, 1<<20)
		close(started)
		if err == nil {
			_, err = io.Copy(got, resp.Body)
		}
		copied <- err
	}()

	<-started
	var loopErr error
	var atLoopEnd int64
	for i := 0; i < 20; i++ {
		resp, body, err := small.try(http.MethodGet, "/api/small/"+strconv.Itoa(i), nil, nil)
		if err == nil && (resp.StatusCode != http.StatusOK || string(body) != "upstream:/small/"+strconv.Itoa(i)) {
			err = fmt.Errorf("status %d, body %q", resp.StatusCode, body)
		}
		if err != nil {
			loopErr = fmt.Errorf("small request %d: %w", i, err)
			break
		}
	}
	atLoopEnd = got.n.Load()
	close(loopDone)

	if err := <-copied; err != nil {
		t.Fatalf("download: %v after %d bytes", err, got.n.Load())
	}
	res := <-results
	if loopErr != nil {
		t.Fatal(loopErr)
	}
	if res.err != nil {
		t.Fatalf("upstream write: %v", res.err)
	}
	if res.capped {
		t.Fatalf("the small loop did not finish while %d bytes were downloaded: starved", res.n)
	}
	if got.n.Load() != res.n || got.hex() != res.sum {
		t.Fatalf("download: got %d bytes sha256 %s, sent %d bytes sha256 %s", got.n.Load(), got.hex(), res.n, res.sum)
	}
	if res.n < downloadMin || atLoopEnd >= res.n {
		t.Fatalf("the loop ended at %d of %d bytes: it did not overlap the download", atLoopEnd, res.n)
	}
	t.Logf("downloaded %d bytes byte-exact; the 20 small requests finished at byte %d", res.n, atLoopEnd)
	st := r.tb.B.Stats()
	if n := st.Counts["stream:slow_consumer"] + st.Counts["stream:write_failed"]; n != 0 {
		t.Fatalf("broker cut %d streams: %v", n, st.Counts)
	}
}

// TestFastUploaderIsPausedNotCut: a client uploads 32 MiB much faster than
// the API reads it (64 KiB every 2 ms, and nothing for 1.5 s after the
// first MiB). The broker must stop reading that client (TCP backpressure)
// and never close the stream for it; the upload completes byte for byte. The broker's slow-consumer timeout is shortened
// to show that it does not apply to the host-bound direction.
func TestFastUploaderIsPausedNotCut(t *testing.T) {
	r := startReach(t, reachOptions{
		broker: brokerOptions{mutate: func(c *server.Config) { c.SlowConsumerTimeout = time.Second }},
		connector: func(c *connector.Config) {
			c.SlowConsumerTimeout = 3 * time.Second
			// A small stream buffer (and so credit window) makes the
			// broker hold the uploader back however fast this machine
			// runs the client and the upstream.
			c.StreamBufferBytes = 1 << 20
		},
	})
	r.front.api.handle("/upload", func(w http.ResponseWriter, req *http.Request) {
		hw := newHashingWriter()
		buf := make([]byte, 64<<10)
		for i := 0; ; i++ {
			n, err := io.ReadFull(req.Body, buf)
			hw.Write(buf[:n])
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					http.Error(w, err.Error(), http.StatusBadGateway)
					return
				}
				break
			}
			// One pause longer than the broker's slow-consumer timeout
			// after the first MiB: the uploader fills the stream's credit
			// however slowly a loaded machine runs it, so the broker must
			// pause it (the precondition below), and must not cut it.
			pause := 2 * time.Millisecond
			if i == 16 {
				pause = 1500 * time.Millisecond
			}
			time.Sleep(pause)
		}
		fmt.Fprintf(w, "%d %s", hw.n.Load(), hw.hex())
	})
	// The reference sent everything in one go; a second stream checks that
	// the paused upload does not stall the host's other streams.
	up, other := r.open(), r.open()
	want := newHashingWriter()
	body := io.TeeReader(io.LimitReader(chachaReader(2), uploadSize), want)
	up.tc.SetDeadline(time.Now().Add(bulkDeadline))

	var otherErr error
	var wg sync.WaitGroup
	stopOther := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stopOther:
				return
			default:
			}
			resp, b, err := other.try(http.MethodGet, "/api/ping", nil, nil)
			if err == nil && (resp.StatusCode != http.StatusOK || string(b) != "upstream:/ping") {
				err = fmt.Errorf("status %d body %q", resp.StatusCode, b)
			}
			if err != nil {
				otherErr = fmt.Errorf("request %d on the other stream: %w", i, err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	if err := up.writeRequest(http.MethodPost, "/api/upload", nil, body, uploadSize); err != nil {
		t.Fatalf("upload: %v after %d bytes", err, want.n.Load())
	}
	resp, err := http.ReadResponse(up.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	close(stopOther)
	wg.Wait()
	if exp := fmt.Sprintf("%d %s", uploadSize, want.hex()); resp.StatusCode != http.StatusOK || string(answer) != exp {
		t.Fatalf("upload: status %d, upstream saw %q, want %q", resp.StatusCode, answer, exp)
	}
	if otherErr != nil {
		t.Fatal(otherErr)
	}
	st := r.tb.B.Stats()
	t.Logf("broker counts %v; connector counts %v", st.Counts, r.c.Counts())
	// Under credit the broker stops reading the uploader when the host's
	// credit is spoken for (paused:credit), or when the stream's queue is
	// full first (paused:client: many small client messages).
	if st.Counts["paused:client"]+st.Counts["paused:credit"] == 0 {
		t.Fatal("the broker never paused the uploader: the test did not exercise backpressure")
	}
	for _, k := range []string{"stream:slow_consumer", "stream:write_failed", "stream:too_big", "stream:idle"} {
		if st.Counts[k] != 0 {
			t.Fatalf("broker %s = %d", k, st.Counts[k])
		}
	}
	if n := r.c.Counts()["slow_consumer"]; n != 0 {
		t.Fatalf("connector cut %d streams as slow consumers", n)
	}
}

// TestStalledReaderGets1013OthersContinue (plain v1: the broker does not
// offer credit): a client that stops reading a download entirely loses its
// stream after the broker's slow-consumer timeout (shortened to 1 s) with
// close 1013, while another stream of the same host keeps completing
// requests before, during and after.
func TestStalledReaderGets1013OthersContinue(t *testing.T) {
	r := startReach(t, reachOptions{
		broker: brokerOptions{mutate: func(c *server.Config) {
			c.SlowConsumerTimeout = time.Second
			c.DisableCredit = true
		}},
	})
	var written atomic.Int64
	writeErr := make(chan error, 1)
	r.front.api.handle("/endless", func(w http.ResponseWriter, req *http.Request) {
		buf := bytes.Repeat([]byte("stalled-"), 8<<10)
		for written.Load() < 512<<20 {
			if _, err := w.Write(buf); err != nil {
				writeErr <- err
				return
			}
			written.Add(int64(len(buf)))
		}
		writeErr <- nil
	})
	stuck, other := r.open(), r.open()

	var requests atomic.Int64
	otherErr := make(chan error, 1)
	stopOther := make(chan struct{})
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stopOther:
				otherErr <- nil
				return
			default:
			}
			resp, b, err := other.try(http.MethodGet, "/api/still-here", nil, nil)
			if err == nil && (resp.StatusCode != http.StatusOK || string(b) != "upstream:/still-here") {
				err = fmt.Errorf("status %d body %q", resp.StatusCode, b)
			}
			if err != nil {
				otherErr <- fmt.Errorf("request %d on the other stream: %w", i, err)
				return
			}
			requests.Add(1)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	testenv.WaitFor(t, "the other stream to work", func() bool { return requests.Load() >= 3 })

	if err := stuck.writeRequest(http.MethodGet, "/api/endless", nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	stuck.tc.SetDeadline(time.Now().Add(2 * step))
	resp, err := http.ReadResponse(stuck.br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/api/endless: %v %v", resp, err)
	}
	// From here on the stuck client reads nothing.
	testenv.WaitFor(t, "the broker to close the stalled stream", func() bool {
		return r.tb.B.Stats().Counts["stream:slow_consumer"] == 1
	})
	select {
	case err := <-writeErr:
		if err == nil {
			t.Fatal("the upstream wrote everything: the stream was never stalled")
		}
	case <-time.After(step):
		t.Fatal("the host side of the stalled stream was not closed")
	}
	before := requests.Load()
	testenv.WaitFor(t, "the other stream to continue after the close", func() bool { return requests.Load() >= before+5 })
	close(stopOther)
	if err := <-otherErr; err != nil {
		t.Fatal(err)
	}

	// Reading again, the stuck client gets what was already on its way,
	// then the broker's 1013.
	n, err := io.Copy(io.Discard, stuck.br)
	var ce *client.CloseError
	if !errors.As(err, &ce) || ce.Code != wire.CloseTryAgain {
		t.Fatalf("the stalled stream ended with %v after %d bytes, want close %d", err, n, wire.CloseTryAgain)
	}
	if n+int64(stuck.br.Buffered()) >= written.Load() {
		t.Fatalf("the stalled client received all %d bytes", n)
	}
	t.Logf("the stalled client had %d bytes on their way of %d written; the other stream did %d requests",
		n, written.Load(), requests.Load())
	if r.c.Status().State != connector.StateConnected || r.tb.B.Stats().HostsOnline != 1 {
		t.Fatal("the host registration did not survive the slow consumer")
	}
}
