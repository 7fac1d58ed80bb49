package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/admin"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "ask the running daemon (admin socket) what it serves",
		Flags: []cli.Flag{configFlag, &cli.BoolFlag{Name: "json", Usage: "print the daemon's JSON"}},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			e, err := loadEnv(c.String("config"), false)
			if err != nil {
				return err
			}
			var st admin.Status
			var raw json.RawMessage
			if _, err := adminClient(e).Do(c.Context, http.MethodGet, admin.PathStatus, nil, &raw); err != nil {
				return err
			}
			if c.Bool("json") {
				os.Stdout.Write(append(raw, '\n'))
				return nil
			}
			if err := json.Unmarshal(raw, &st); err != nil {
				return err
			}
			up := func(ok bool) string {
				if ok {
					return "available"
				}
				return "unavailable"
			}
			fmt.Printf("version      %s (started %s)\nauthority    %s\npin_sha256   %s\nidentity     changed %s (%s ago)\nrelay        %s\napi          %s\ndashboard    %s\nreach        enabled=%v state=%s\nwebsockets   %d open\n",
				st.Version, st.StartedAt, st.Authority, st.PinSHA256, st.IdentityChangedAt, ago(st.IdentityChangedAt),
				up(st.Upstreams["relay"].Available), up(st.Upstreams["api"].Available), up(st.Upstreams["dashboard"].Available),
				st.Reach.Enabled, st.Reach.State, st.ActiveWebSockets)
			if r := st.Reach; r.Enabled && (r.PermanentError != "" || r.RetryAt != nil) {
				next := "unknown"
				if r.RetryAt != nil {
					next = r.RetryAt.UTC().Format(time.RFC3339)
				}
				fmt.Printf("reach wait   last error %s, next attempt %s", orNone(r.LastError), next)
				if r.PermanentError != "" {
					fmt.Printf(" (the broker refused with %s: check reach.host_id and the host token)", r.PermanentError)
				}
				fmt.Println()
			}
			fmt.Printf("tls          %s, %s", st.TLS.Mode, st.TLS.State)
			if st.TLS.NotAfter != "" {
				fmt.Printf(", issuer %s, expires %s", st.TLS.Issuer, st.TLS.NotAfter)
			}
			if st.TLS.NextRenewal != "" {
				fmt.Printf(", renewal from %s", st.TLS.NextRenewal)
			}
			fmt.Println()
			if st.TLS.LastError != "" {
				fmt.Printf("tls error    %s: %s (next attempt %s)\n", st.TLS.Problem, st.TLS.LastError, orNone(st.TLS.NextAttempt))
			}
			if st.TLS.State == string(acme.StateWaiting) {
				fmt.Printf("tls needs    %s\n", st.TLS.Needs)
			}
			if r := st.TLS.Rotation; r != nil {
				fmt.Printf("ROTATION     %s (old pin %s, new pin %s)\n", r.Message, r.OldPin, r.NewPin)
			}
			return nil
		},
	}
}

func ago(ts string) string {
	t, err := time.Parse(time.RFC3339, ts)
	if err != nil {
		return "?"
	}
	return time.Since(t).Round(time.Second).String()
}
