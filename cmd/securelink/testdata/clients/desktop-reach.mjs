// What the Hermes desktop client does to open its Relay WebSocket through
// Reach, under its own runtime (Bun). It mirrors Codename-11/hermes-relay
// desktop/src (read for behaviour, not copied):
//   - pairingQr.ts:163-186 parseCandidate: an outbound_broker candidate's
//     inner Relay URL is wss://<proxy host>/relay/ws;
//   - transport/BrokerRelaySocket.ts:125-155 openBrokerRelaySocket: an outer
//     WebSocket to <broker>/v1/connect (system trust; here the test broker's
//     CA comes through NODE_EXTRA_CA_CERTS), the client registration, binary
//     records after "matched" (lines 20-56), cert_der checked against the pin,
//     tls.connect over that stream with servername = the proxy host and
//     ca = cert_der as PEM, the peer's pin and name checked again, and a
//     hand-written WebSocket upgrade (desktoplib.mjs manualWebSocket).
// Usage: desktop-reach.mjs CANDIDATE.json
import { randomBytes } from 'node:crypto'
import { Duplex } from 'node:stream'
import * as tls from 'node:tls'
import { spkiPin, pemOf, manualWebSocket, report } from './desktoplib.mjs'
import { readFileSync } from 'node:fs'

const cand = JSON.parse(readFileSync(process.argv[2], 'utf8'))
const { broker, proxy } = cand
const base = new URL(proxy.url)
const inner = new URL(`wss://${base.host}/relay/ws`)

class BrokerStream extends Duplex {
  constructor(ws, registration) {
    super()
    this.ws = ws
    this.binary = false
    this.matched = new Promise((resolve, reject) => { this.resolve = resolve; this.reject = reject })
    this.timer = setTimeout(() => this.reject(new Error('host match timed out')), 10_000)
    ws.binaryType = 'arraybuffer'
    ws.addEventListener('open', () => ws.send(JSON.stringify(registration)))
    ws.addEventListener('message', ev => {
      if (!this.binary) {
        let m
        try { m = JSON.parse(String(ev.data)) } catch { return this.reject(new Error('invalid match response')) }
        if (m.type === 'matched' && m.protocol_version === 1 && /^[A-Za-z0-9_-]{22}$/.test(m.stream_id ?? '')) {
          clearTimeout(this.timer); this.binary = true; this.resolve(); return
        }
        if (m.type === 'error') this.reject(new Error('Reach rejected route: ' + m.code))
        return
      }
      const d = ev.data
      if (d instanceof ArrayBuffer) this.push(Buffer.from(d))
      else if (ArrayBuffer.isView(d)) this.push(Buffer.from(d.buffer, d.byteOffset, d.byteLength))
      else this.destroy(new Error('text record after matched'))
    })
    ws.addEventListener('close', () => { this.push(null); if (!this.binary) this.reject(new Error('broker closed before matching')) })
    ws.addEventListener('error', ev => { const e = new Error('broker WebSocket failed: ' + (ev.message ?? '')); this.reject(e); this.destroy(e) })
  }
  _read() {}
  _write(chunk, _enc, cb) {
    if (this.ws.readyState !== WebSocket.OPEN) return cb(new Error('tunnel not open'))
    this.ws.send(chunk); cb()
  }
  _destroy(err, cb) { clearTimeout(this.timer); try { this.ws.close() } finally { cb(err) } }
}

let stage = 'broker'
try {
  const outer = new WebSocket(new URL('/v1/connect', broker.url).toString())
  const stream = new BrokerStream(outer, {
    type: 'register', protocol_version: 1, role: 'client', host_id: broker.host_id,
    connection_id: randomBytes(16).toString('base64url'), credential_kind: broker.credential_kind, token: broker.token,
  })
  await stream.matched
  stage = 'pin'
  const der = Buffer.from(proxy.cert_der, 'base64')
  if (spkiPin(der) !== proxy.pin_sha256) throw new Error('cert_der does not match the pin')
  stage = 'tls'
  const secure = tls.connect({ socket: stream, servername: inner.hostname, rejectUnauthorized: true, ca: pemOf(der) })
  await new Promise((resolve, reject) => { secure.once('secureConnect', resolve); secure.once('error', reject) })
  const raw = secure.getPeerX509Certificate?.()?.raw ?? secure.getPeerCertificate?.(false)?.raw
  if (!raw || spkiPin(raw) !== proxy.pin_sha256) throw new Error('inner pin mismatch')
  const idErr = tls.checkServerIdentity(inner.hostname, secure.getPeerCertificate(true))
  if (idErr) throw idErr
  stage = 'websocket'
  const message = 'hello through Reach'
  const echo = await manualWebSocket(secure, inner, message)
  report(echo === message, 'echo', new Error('unexpected echo ' + echo))
} catch (e) {
  report(false, stage, e)
}
