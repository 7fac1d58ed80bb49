package reachtest

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// slowReader reads at most rate bytes per second.
type slowReader struct {
	r     io.Reader
	rate  float64
	start time.Time
	n     int64
}

func (s *slowReader) Read(p []byte) (int, error) {
	if s.start.IsZero() {
		s.start = time.Now()
	}
	if due := s.start.Add(time.Duration(float64(s.n) / s.rate * float64(time.Second))); time.Until(due) > 0 {
		time.Sleep(time.Until(due))
	}
	n, err := s.r.Read(p[:min(len(p), 64<<10)])
	s.n += int64(n)
	return n, err
}

// TestSlowDownloadWithPingPong: our broker and our connector, credit on and
// off. A 16 MB download goes to a client that reads at 4 MB/s while another
// stream of the same host runs sequential small requests. In both modes
// the download is byte-exact and the ping-pong keeps completing round trips.
// With credit the broker never pauses the host socket and holds at most a
// few windows; with credit off the plain-v1 behaviour shows: the host
// socket is paused behind the slow reader's full queue. The round-trip
// p50/p99 are logged, not asserted.
func TestSlowDownloadWithPingPong(t *testing.T) {
	for _, credit := range []bool{true, false} {
		t.Run(map[bool]string{true: "credit", false: "plain_v1"}[credit], func(t *testing.T) {
			r := startReach(t, reachOptions{
				broker: brokerOptions{mutate: func(c *server.Config) { c.DisableCredit = !credit }},
			})
			const size = 16 << 20
			sent := make(chan string, 1)
			r.front.api.handle("/big16", func(w http.ResponseWriter, req *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(size))
				src, hw := chachaReader(3), newHashingWriter()
				buf := make([]byte, 128<<10)
				for hw.n.Load() < size {
					src.Read(buf)
					if _, err := w.Write(buf); err != nil {
						break
					}
					hw.Write(buf)
				}
				sent <- hw.hex()
			})
			bulk, small := r.open(), r.open()
			if err := bulk.writeRequest(http.MethodGet, "/api/big16", nil, nil, 0); err != nil {
				t.Fatal(err)
			}
			bulk.tc.SetDeadline(time.Now().Add(bulkDeadline))
			resp, err := http.ReadResponse(bulk.br, nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("/api/big16: %v %v", resp, err)
			}
			var peak atomic.Int64
			stopSample := make(chan struct{})
			go func() {
				for {
					select {
					case <-stopSample:
						return
					case <-time.After(2 * time.Millisecond):
					}
					if q := r.tb.B.Stats().QueuedBytes; q > peak.Load() {
						peak.Store(q)
					}
				}
			}()
			done := make(chan error, 1)
			got := newHashingWriter()
			go func() {
				_, err := io.Copy(got, &slowReader{r: resp.Body, rate: 4 << 20})
				done <- err
			}()
			var rtts []time.Duration
			var loopErr error
		loop:
			for i := 0; ; i++ {
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("download: %v after %d bytes", err, got.n.Load())
					}
					break loop
				default:
				}
				start := time.Now()
				resp, b, err := small.try(http.MethodGet, "/api/small/"+strconv.Itoa(i), nil, nil)
				if err == nil && (resp.StatusCode != http.StatusOK || string(b) != "upstream:/small/"+strconv.Itoa(i)) {
					err = fmt.Errorf("status %d body %q", resp.StatusCode, b)
				}
				if err != nil {
					loopErr = err
					break
				}
				rtts = append(rtts, time.Since(start))
			}
			close(stopSample)
			if loopErr != nil {
				t.Fatalf("ping-pong after %d round trips: %v", len(rtts), loopErr)
			}
			if got.n.Load() != size || got.hex() != <-sent {
				t.Fatalf("download: %d bytes, hash mismatch or short", got.n.Load())
			}
			if len(rtts) < 5 {
				t.Fatalf("only %d round trips completed during the download", len(rtts))
			}
			sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
			p50, p99 := rtts[len(rtts)/2], rtts[len(rtts)*99/100]
			st := r.tb.B.Stats()
			t.Logf("credit=%v: %d round trips, p50 %v p99 %v; broker peak queue %d bytes; paused:host %d; credit:grow %d",
				credit, len(rtts), p50, p99, peak.Load(), st.Counts["paused:host"], st.Counts["credit:grow"])
			if st.Counts["stream:slow_consumer"] != 0 {
				t.Fatalf("a slow but moving reader was cut: %v", st.Counts)
			}
			if credit {
				if st.Counts["host:credit"] != 1 || !r.c.Status().Credit {
					t.Fatalf("credit was not negotiated: %v", st.Counts)
				}
				if st.Counts["paused:host"] != 0 {
					t.Fatalf("the host socket was paused %d times under credit", st.Counts["paused:host"])
				}
				// Two streams' windows plus one client message in flight
				// each. The bulk stream's window may have grown while the
				// client's socket buffers and read queue filled (its
				// client kept up until then), never beyond
				// MaxStreamWindow; windows never shrink.
				def := server.DefaultConfig()
				if bound := int64(def.MaxStreamWindow() + wire.InitialWindow + 2*256<<10); peak.Load() > bound {
					t.Fatalf("broker queued %d bytes, bound %d", peak.Load(), bound)
				}
			} else {
				if st.Counts["host:credit"] != 0 || r.c.Status().Credit {
					t.Fatal("credit negotiated with a broker that did not offer it")
				}
				// Under the race detector the pipeline may be slower than
				// the reader, so the queue never fills: only then is a
				// missing pause no failure.
				if st.Counts["paused:host"] == 0 && !raceEnabled {
					t.Fatal("plain v1 never paused the host socket behind a 4 MB/s reader")
				}
				if bound := int64(2*wire.StreamQueueBytes + 2*wire.MaxHostFrameIn); peak.Load() > bound {
					t.Fatalf("broker queued %d bytes, bound %d", peak.Load(), bound)
				}
			}
			if r.c.Status().State != connector.StateConnected {
				t.Fatal("registration lost")
			}
		})
	}
}
