#!/usr/bin/env python3
"""Writes app_integers_vectors.json: pairing payloads as the Hermes Relay
signs them after `securelink pair --ttl/--grants` (the Relay turns the
seconds into floats: server.py _parse_pairing_metadata), and the same
payloads with those numbers as integers, each signed the way the Relay's
signer does it (plugin/relay/qr_sign.py canonicalize + sign_payload:
json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=True,
allow_nan=False) without "sig", HMAC-SHA256, standard base64). The Relay
writes the QR itself with json.dumps(payload, separators=(",", ":")) in
insertion order (plugin/pair.py build_payload).

Run: python3 pairing/testdata/app_integers_vectors.py > pairing/testdata/app_integers_vectors.json
"""
import base64
import copy
import hashlib
import hmac
import json

KEY = b"0123456789abcdef0123456789abcdef"  # testQRKey in pairing/helpers_test.go


def canonical(payload):
    clean = {k: v for k, v in payload.items() if k != "sig"}
    return json.dumps(clean, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def sign(payload):
    return base64.b64encode(hmac.new(KEY, canonical(payload).encode("ascii"), hashlib.sha256).digest()).decode("ascii")


def relay_payload(ttl, grants, endpoints):
    relay = {"url": "ws://192.0.2.10:8767", "code": "ABC123"}
    if ttl is not None:
        relay["ttl_seconds"] = float(ttl)
    if grants is not None:
        relay["grants"] = {k: float(v) for k, v in grants.items()}
    payload = {"hermes": 3, "host": "192.0.2.10", "port": 8642, "key": "api-key-\u00e9/<&>", "tls": False,
               "relay": relay, "endpoints": endpoints}
    payload["sig"] = sign(payload)
    return payload


def as_integers(payload):
    out = copy.deepcopy(payload)
    out.pop("sig")
    r = out["relay"]
    if "ttl_seconds" in r:
        r["ttl_seconds"] = int(r["ttl_seconds"])
    if "grants" in r:
        r["grants"] = {k: int(v) for k, v in r["grants"].items()}
    out["sig"] = sign(out)
    return out


ENDPOINTS = [
    {"role": "plugin_proxy", "priority": 0, "recommended": True, "security": "pinned_tls",
     "display_name": "Secure Link \u2014 h\u00f4te", "proxy": {"url": "https://hermes.example:9443",
                                                            "pin_sha256": "sha256/" + "A" * 43 + "="}},
    {"role": "outbound_broker", "priority": 1, "recommended": False, "experimental": True,
     "security": "e2ee_pinned_tls", "broker": {"protocol_version": 1, "url": "wss://broker.example/v1/connect",
                                              "expires_at": 1780000000}},
]

CASES = [
    ("ttl and grants", 2592000, {"terminal": 604800, "bridge": 86400}),
    ("ttl never", 0, None),
    ("grants only", None, {"chat": 31536000, "tui": 3600}),
]

vectors = []
for name, ttl, grants in CASES:
    relay = relay_payload(ttl, grants, copy.deepcopy(ENDPOINTS))
    ints = as_integers(relay)
    vectors.append({
        "name": name,
        "relay_qr_payload": json.dumps(relay, separators=(",", ":")),
        "integer_canonical": canonical(ints),
        "integer_sig": ints["sig"],
    })
print(json.dumps({"key": KEY.decode("ascii"), "vectors": vectors}, indent=1))
