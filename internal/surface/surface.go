// Package surface holds the fixed description of what the front exposes: the
// three namespaces, their paths and the credential each keeps. The pairing
// candidate (package pinning) and the /relay/health body (package relay) both
// publish it, and clients compare the two, so it lives in one place.
package surface

// Fixed texts that clients display or match on.
const (
	// HealthSurface is the "surface" value of /relay/health.
	HealthSurface = "hermes_secure_proxy"
	DisplayName   = "Hermes Secure Link"
	Description   = "Pinned TLS access to this host's Relay, API, and Dashboard services"
	Security      = "pinned_tls"
	Role          = "plugin_proxy"
)

// Namespaces in the order clients expect them.
var Namespaces = []string{"relay", "api", "dashboard"}

// Service describes one namespace in the candidate and the health body. The
// optional paths are omitted when empty so the JSON has exactly the keys the
// contract lists.
type Service struct {
	Supported      bool   `json:"supported"`
	BasePath       string `json:"base_path"`
	HealthPath     string `json:"health_path,omitempty"`
	WebSocketPath  string `json:"websocket_path,omitempty"`
	Authentication string `json:"authentication"`
}

// Services is the services object of the candidate, keyed relay/api/dashboard.
type Services struct {
	Relay     Service `json:"relay"`
	API       Service `json:"api"`
	Dashboard Service `json:"dashboard"`
}

// DefaultServices returns the three namespaces as the front serves them.
func DefaultServices() Services {
	return Services{
		Relay: Service{Supported: true, BasePath: "/relay", HealthPath: "/relay/health",
			WebSocketPath: "/relay/ws", Authentication: "relay_session"},
		API:       Service{Supported: true, BasePath: "/api", Authentication: "api_bearer"},
		Dashboard: Service{Supported: true, BasePath: "/dashboard", Authentication: "dashboard_session"},
	}
}
