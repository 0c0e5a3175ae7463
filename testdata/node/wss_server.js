// wss_server.js - a WebSocket-over-https server on Node's own TLS and the
// npm ws package, for talaris interop tests (tls_test.go TestTLSNodeWS).
//
//   NODE_PATH=build/node/node_modules node testdata/node/wss_server.js CERT KEY [TLSv1.2|TLSv1.3]
//
// Listens on 127.0.0.1 (free port), prints "LISTEN <port>", and for every
// connection to /stream?n=N&size=S sends N binary messages, message i being
// wstest.Payload(i, S) (8-byte little-endian i, then byte j =
// i*31 + j*7 + (j>>8) mod 256), then closes with 1000 "done" (with hold=1
// it keeps the connection open instead, for a close the client starts).
// Every close code the server receives is printed as "CLOSED <code>".
'use strict';
const fs = require('fs');
const https = require('https');
const { WebSocketServer } = require('ws');

const [certFile, keyFile, maxVersion] = process.argv.slice(2);
const server = https.createServer({
  cert: fs.readFileSync(certFile),
  key: fs.readFileSync(keyFile),
  maxVersion: maxVersion || 'TLSv1.3',
  minVersion: 'TLSv1.2',
});
const wss = new WebSocketServer({ server, perMessageDeflate: false });

function payload(i, size) {
  const p = Buffer.alloc(size);
  let j = 0;
  if (size >= 8) {
    p.writeBigUInt64LE(BigInt(i), 0);
    j = 8;
  }
  for (; j < size; j++) {
    p[j] = (i * 31 + j * 7 + (j >> 8)) & 0xff;
  }
  return p;
}

wss.on('connection', (ws, req) => {
  const q = new URL(req.url, 'https://x').searchParams;
  const n = parseInt(q.get('n') || '1', 10);
  const size = parseInt(q.get('size') || '64', 10);
  let i = 0;
  // Send while the socket buffer is short, resume on drain.
  const pump = () => {
    while (i < n) {
      ws.send(payload(i, size), { binary: true });
      i++;
      if (ws._socket.writableLength > (1 << 20)) {
        ws._socket.once('drain', pump);
        return;
      }
    }
    if (q.get('hold') !== '1') ws.close(1000, 'done');
  };
  ws.on('close', (code) => process.stdout.write('CLOSED ' + code + '\n'));
  pump();
  ws.on('error', () => {});
});

server.listen(0, '127.0.0.1', () => {
  process.stdout.write('LISTEN ' + server.address().port + '\n');
});
// The test kills the process when it is done.
