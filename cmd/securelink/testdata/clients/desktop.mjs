// What the Hermes desktop client does to open its Relay WebSocket on a
// pinned Secure Link route, run under the client's own runtime (Bun) or Node.
// It mirrors Codename-11/hermes-relay desktop/src (read for behaviour, not
// copied):
//   - transport/RelayTransport.ts:434-500 verifyOrCapturePin: a throwaway
//     tls.connect with servername = the URL's host and rejectUnauthorized
//     false when a pin is expected, leaf SPKI pin compared, the leaf kept
//     as PEM;
//   - certPin.ts:33-62 extractSpkiSha256 / peerCertificateDer /
//     certificateDerToPem;
//   - transport/RelayTransport.ts:107-128 defaultWSFactory: Bun's
//     WebSocket(url, {tls: {rejectUnauthorized: true, ca: leafPEM}}).
// Node 20 has no WebSocket global: there the upgrade runs over
// tls.connect({ca: leafPEM, rejectUnauthorized: true}) by hand, as
// transport/BrokerRelaySocket.ts:136-155 does over its inner TLS.
//
// Usage: desktop.mjs wss://HOST:PORT/relay/ws sha256/PIN
// Prints one JSON line {"ok":bool,"stage":...,"error":...} and exits 0 only
// when a text message came back through the WebSocket.
import * as tls from 'node:tls'
import { probePin, pemOf, manualWebSocket, report } from './desktoplib.mjs'

const [url, expectedPin] = process.argv.slice(2)
const u = new URL(url)
const host = u.hostname
const port = Number(u.port || 443)

let leaf
try {
  leaf = await probePin(host, port, expectedPin)
} catch (e) {
  report(false, 'pin', e)
}
const pem = pemOf(leaf)
const message = 'hello from the desktop recipe'

if (process.versions.bun) {
  const ws = new WebSocket(url, { tls: { rejectUnauthorized: true, ca: pem } })
  const timer = setTimeout(() => report(false, 'websocket', new Error('timed out')), 10_000)
  ws.addEventListener('open', () => ws.send(message))
  ws.addEventListener('message', ev => {
    clearTimeout(timer)
    report(String(ev.data) === message, 'echo', new Error('unexpected echo ' + String(ev.data)))
  })
  ws.addEventListener('error', ev => { clearTimeout(timer); report(false, 'websocket', new Error(ev.message ?? 'WebSocket error')) })
  ws.addEventListener('close', ev => { clearTimeout(timer); report(false, 'websocket', new Error(`closed ${ev.code} ${ev.reason}`)) })
} else {
  try {
    const secure = tls.connect({ host, port, servername: host, rejectUnauthorized: true, ca: pem })
    await new Promise((resolve, reject) => { secure.once('secureConnect', resolve); secure.once('error', reject) })
    const echo = await manualWebSocket(secure, u, message)
    report(echo === message, 'echo', new Error('unexpected echo ' + echo))
  } catch (e) {
    report(false, 'websocket', e)
  }
}
