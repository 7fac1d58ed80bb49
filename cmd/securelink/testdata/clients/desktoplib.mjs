// Shared steps of the desktop recipes (see desktop.mjs for the sources).
import { createHash, randomBytes, X509Certificate } from 'node:crypto'
import * as tls from 'node:tls'

export function report(ok, stage, err) {
  const line = { ok, stage, runtime: process.versions.bun ? 'bun ' + process.versions.bun : 'node ' + process.versions.node }
  if (!ok) line.error = String(err?.message ?? err)
  console.log(JSON.stringify(line))
  process.exit(ok ? 0 : 1)
}

// certPin.ts:33-41: sha256/ + base64(SHA-256(SPKI DER)) of the leaf.
export function spkiPin(der) {
  const spki = new X509Certificate(der).publicKey.export({ type: 'spki', format: 'der' })
  return 'sha256/' + createHash('sha256').update(spki).digest('base64')
}

// certPin.ts:59-62.
export function pemOf(der) {
  return `-----BEGIN CERTIFICATE-----\n${der.toString('base64').match(/.{1,64}/g).join('\n')}\n-----END CERTIFICATE-----\n`
}

// RelayTransport.ts:434-500 with a pin expected: no verification during the
// probe, the leaf's pin compared, the leaf returned.
export function probePin(host, port, expectedPin) {
  return new Promise((resolve, reject) => {
    const socket = tls.connect({ host, port, servername: host, rejectUnauthorized: false })
    const timer = setTimeout(() => socket.destroy(new Error('TLS probe timed out')), 10_000)
    socket.once('secureConnect', () => {
      clearTimeout(timer)
      const raw = socket.getPeerX509Certificate?.()?.raw ?? socket.getPeerCertificate?.(false)?.raw
      socket.end()
      if (!raw || raw.length === 0) return reject(new Error('no peer certificate'))
      const pin = spkiPin(raw)
      if (pin !== expectedPin) return reject(new Error(`cert pin mismatch: expected ${expectedPin}, got ${pin}`))
      resolve(Buffer.from(raw))
    })
    socket.once('error', err => { clearTimeout(timer); reject(err) })
  })
}

// A client WebSocket over an established TLS socket: the upgrade and
// masked frames as BrokerRelaySocket.ts:118-123,148-155 write them; sends
// one text message and resolves with the first text message back.
export function manualWebSocket(secure, u, message) {
  return new Promise((resolve, reject) => {
    const key = randomBytes(16).toString('base64')
    const accept = createHash('sha1').update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64')
    const timer = setTimeout(() => { secure.destroy(); reject(new Error('WebSocket timed out')) }, 10_000)
    let buf = Buffer.alloc(0)
    let upgraded = false
    secure.on('data', chunk => {
      buf = Buffer.concat([buf, chunk])
      if (!upgraded) {
        const end = buf.indexOf('\r\n\r\n')
        if (end < 0) return
        const head = buf.subarray(0, end).toString('utf8')
        if (!/^HTTP\/1\.1 101 /.test(head) || !head.toLowerCase().includes('sec-websocket-accept: ' + accept.toLowerCase())) {
          clearTimeout(timer); secure.destroy(); return reject(new Error('upgrade refused: ' + head.split('\r\n')[0]))
        }
        upgraded = true
        buf = buf.subarray(end + 4)
        secure.write(frame(Buffer.from(message), 1))
      }
      if (buf.length < 2) return
      const len = buf[1] & 0x7f
      if (len > 125) { clearTimeout(timer); secure.destroy(); return reject(new Error('unexpected long frame')) }
      if (buf.length < 2 + len) return
      clearTimeout(timer)
      const opcode = buf[0] & 0x0f
      const payload = buf.subarray(2, 2 + len).toString('utf8')
      secure.end(frame(Buffer.from([0x03, 0xe8]), 8))
      if (opcode !== 1) return reject(new Error('unexpected opcode ' + opcode))
      resolve(payload)
    })
    secure.once('error', err => { clearTimeout(timer); reject(err) })
    secure.write(`GET ${u.pathname}${u.search} HTTP/1.1\r\nHost: ${u.host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\n\r\n`)
  })
}

function frame(payload, opcode) {
  const mask = randomBytes(4)
  const body = Buffer.from(payload)
  for (let i = 0; i < body.length; i++) body[i] ^= mask[i % 4]
  return Buffer.concat([Buffer.from([0x80 | opcode, 0x80 | body.length]), mask, body])
}
