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
func NewHealthHandler(avail func(ctx context.Context) Availability) http.Handler {
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
		svc := surface.DefaultServices()
		body := healthBody{
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
		b, err := json.Marshal(body)
		if err != nil { // only fixed types above; unreachable in practice
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(b)
	})
}
