package loopback

import "testing"

func TestHost(t *testing.T) {
	for h, want := range map[string]bool{
		"localhost": true, "LOCALHOST": true, "127.0.0.1": true, "127.9.9.9": true, "::1": true,
		"::ffff:127.0.0.1": true, "0.0.0.0": false, "10.0.0.1": false, "example.com": false, "": false,
	} {
		if Host(h) != want {
			t.Errorf("Host(%q) = %v", h, !want)
		}
	}
	if CheckListen("127.0.0.1:9464") != nil || CheckListen("0.0.0.0:9464") == nil || CheckListen("nonsense") == nil {
		t.Fatal("CheckListen")
	}
}
