"""An independent WebSocket peer for talaris's interop test: Python's
websockets library. Prints "LISTEN <port>" once ready. Each connection's
path selects the behaviour:
  /stream?n=N&size=S   N binary messages, payload = 8-byte little-endian seq
                       followed by (seq + i) & 0xff filler, then close 1000 "done"
  /echo                echo every message until the client closes
  /record              read until the connection ends, then print
                       "CLOSED <code> <reason>" (the client's close frame)
With --tls CERT KEY it serves wss://.
"""
import asyncio
import ssl
import struct
import sys
from urllib.parse import parse_qs, urlparse

import websockets


def payload(seq, size):
    head = struct.pack("<Q", seq)
    fill = bytes((seq + i) & 0xFF for i in range(8, size))
    return (head + fill)[:size]


async def handler(ws):
    path = ws.request.path if hasattr(ws, "request") else ws.path
    u = urlparse(path)
    q = parse_qs(u.query)
    if u.path == "/stream":
        n = int(q.get("n", ["1000"])[0])
        size = int(q.get("size", ["64"])[0])
        for seq in range(n):
            await ws.send(payload(seq, size))
        await ws.close(1000, "done")
    elif u.path == "/echo":
        async for msg in ws:
            await ws.send(msg)
    elif u.path == "/record":
        async for msg in ws:
            pass
        rcvd = getattr(getattr(ws, "protocol", ws), "close_rcvd", None)
        code = rcvd.code if rcvd else ws.close_code
        reason = rcvd.reason if rcvd else ws.close_reason
        print(f"CLOSED {code} {reason}", flush=True)


async def main():
    ctx = None
    if len(sys.argv) == 4 and sys.argv[1] == "--tls":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[2], sys.argv[3])
        ctx.set_alpn_protocols(["http/1.1"])
    async with websockets.serve(handler, "127.0.0.1", 0, ssl=ctx, max_size=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(f"LISTEN {port}", flush=True)
        await asyncio.Future()


asyncio.run(main())
