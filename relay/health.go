package relay

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/hermes-securelink/securelink/internal/surface"
)

// Availability is what the proxy's cached probes currently say about each
// upstream. The health handler never probes by itself, so public traffic on
// /relay/health cannot multiply loopback requests.
type Availability struct {
	Relay, API, Dashboard bool
}

// healthService is a surface.Service plus its current availability; the
// embedding keeps the descriptor fields byte-identical to the candidate's.
type healthService struct {
	surface.Service
	Available bool `json:"available"`
}

type healthServices struct {
	Relay     healthService `json:"relay"`
	API       healthService `json:"api"`
	Dashboard healthService `json:"dashboard"`
}

type healthBody struct {
	Status       string         `json:"status"`
	Surface      string         `json:"surface"`
	DisplayName  string         `json:"display_name"`
	Description  string         `json:"description"`
	Security     string         `json:"security"`
	Capabilities []string       `json:"capabilities"`
	Namespaces   []string       `json:"namespaces"`
	Services     healthServices `json:"services"`
}

// NewHealthHandler serves /relay/health. "status" describes the front itself,
// which is up whenever it answers; each upstream's state is in its service's
// "available", so a client can tell "front reachable, Relay down" apart from
// "front unreachable".
//
// The body depends only on the three availability bits, so the eight bodies
// (and their Content-Length values) are built once here; a request costs a
// table lookup, no encoding.
func NewHealthHandler(avail func(ctx context.Context) Availability) http.Handler {
	var bodies [8]healthAnswer
	for i := range bodies {
		a := Availability{Relay: i&1 != 0, API: i&2 != 0, Dashboard: i&4 != 0}
		b, err := json.Marshal(healthBodyFor(a))
		if err != nil { // only fixed types; unreachable in practice
			panic("relay: health body: " + err.Error())
		}
		bodies[i] = healthAnswer{body: b, length: []string{strconv.Itoa(len(b))}}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		var a Availability
		if avail != nil {
			a = avail(r.Context())
		}
		i := 0
		if a.Relay {
			i |= 1
		}
		if a.API {
			i |= 2
		}
		if a.Dashboard {
			i |= 4
		}
		ans := &bodies[i]
		// Canonical keys and shared values: net/http only reads them.
		h := w.Header()
		h["Content-Type"] = healthContentType
		h["Cache-Control"] = healthNoStore
		h["X-Content-Type-Options"] = healthNoSniff
		h["Content-Length"] = ans.length
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(ans.body)
	})
}

var (
	healthContentType = []string{"application/json"}
	healthNoStore     = []string{"no-store"}
	healthNoSniff     = []string{"nosniff"}
)

type healthAnswer struct {
	body   []byte
	length []string
}

func healthBodyFor(a Availability) healthBody {
	svc := surface.DefaultServices()
	return healthBody{
		Status:       "ok",
		Surface:      surface.HealthSurface,
		DisplayName:  surface.DisplayName,
		Description:  surface.Description,
		Security:     surface.Security,
		Capabilities: append([]string(nil), surface.Namespaces...),
		Namespaces:   append([]string(nil), surface.Namespaces...),
		Services: healthServices{
			Relay:     healthService{svc.Relay, a.Relay},
			API:       healthService{svc.API, a.API},
			Dashboard: healthService{svc.Dashboard, a.Dashboard},
		},
	}
}
