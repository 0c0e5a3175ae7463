//go:build linux

package main

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talaris-go/talaris/ws"
)

// floor is a bare recv() loop: raw sockets, the upgrade done by hand, then
// unix.Read into a 1 MiB buffer with no parsing at all. Frames are bytes
// divided by the frame length. With tlsOn (wss) the TLS handshake and the
// upgrade go through crypto/tls, then the socket is read raw: the
// ciphertext is counted, never decrypted, so the row is what the feed
// server can encrypt and send when its client costs nearly nothing (the
// ceiling any wss client can reach on this box). Its frames are the
// records' plaintext bytes (the feed server writes whole 16 KiB records:
// 256 KiB writes) divided by the frame length.
func (b *bench) floor(addr, path string, size, conns int, tlsOn bool) (Result, error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	req := "GET " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " +
		ws.NewKey() + "\r\nSec-WebSocket-Version: 13\r\n\r\n"
	ctrs := make([]counter, conns)
	recOverhead := 0 // bytes a TLS record adds to its plaintext
	for i := range conns {
		var fd int
		var err error
		if tlsOn {
			var over int
			fd, over, err = b.floorDialTLS(addr, req)
			recOverhead = over
		} else {
			fd, err = floorDialRaw(addr, req, &ctrs[i])
		}
		if fd >= 0 {
			fds = append(fds, fd)
		}
		if err != nil {
			return Result{}, err
		}
	}
	var wg sync.WaitGroup
	for i, fd := range fds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			c := &ctrs[i]
			total := c.b.Load()
			for {
				n, err := unix.Read(fd, buf)
				if n <= 0 {
					if err == unix.EINTR {
						continue
					}
					return
				}
				total += uint64(n)
				c.b.Store(total)
			}
		}()
	}
	snap := func() uint64 {
		var s uint64
		for i := range ctrs {
			s += ctrs[i].b.Load()
		}
		return s
	}
	time.Sleep(b.warm)
	b0, c0, s0, t0 := snap(), cpuSeconds(), b.feed.cpu(), time.Now()
	time.Sleep(b.dur)
	b1 := snap()
	r := Result{Bytes: b1 - b0, Secs: time.Since(t0).Seconds(), CPUSecs: cpuSeconds() - c0, ServerCPUSecs: serverDelta(s0, b.feed.cpu())}
	for _, fd := range fds {
		unix.Shutdown(fd, unix.SHUT_RDWR)
	}
	wg.Wait()
	frameLen := len(ws.AppendFrame(nil, true, ws.OpBinary, make([]byte, size)))
	wire := r.Bytes
	if recOverhead > 0 {
		wire = wire * floorRecord / uint64(floorRecord+recOverhead)
	}
	r.Frames = wire / uint64(frameLen)
	r.Bytes = r.Frames * uint64(size) // payload bytes, like the other clients
	return r, nil
}

// floorRecord is the plaintext of one full TLS record: the feed server's
// 256 KiB writes are whole records of it.
const floorRecord = 16384

// serverDelta is the feed server's CPU seconds between two readings of
// feedProc.cpu, 0 when either failed.
func serverDelta(s0, s1 float64) float64 {
	if s0 < 0 || s1 < 0 {
		return 0
	}
	return s1 - s0
}

// floorConnect returns a blocking TCP socket connected to addr.
func floorConnect(addr string) (int, error) {
	ap, err := net.ResolveTCPAddr("tcp4", addr)
	if err != nil {
		return -1, err
	}
	sa := &unix.SockaddrInet4{Port: ap.Port}
	copy(sa.Addr[:], ap.IP.To4())
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// floorDialRaw connects a raw socket to addr and upgrades it by hand
// (req), returning its fd (-1 when the socket failed) with the bytes that
// followed the 101's head counted in c.
func floorDialRaw(addr, req string, c *counter) (int, error) {
	fd, err := floorConnect(addr)
	if err != nil {
		return -1, err
	}
	if _, err := unix.Write(fd, []byte(req)); err != nil {
		return fd, err
	}
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte("\r\n\r\n")) {
		n, err := unix.Read(fd, buf)
		if n <= 0 {
			return fd, fmt.Errorf("upgrade: %v", err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 101")) {
		return fd, errors.New("upgrade refused")
	}
	c.b.Store(uint64(len(got) - bytes.Index(got, []byte("\r\n\r\n")) - 4))
	return fd, nil
}

// floorDialTLS connects a raw socket to addr, runs crypto/tls' handshake
// and the upgrade (req) over a duplicate of it, then closes the duplicate
// (so Go's netpoller no longer watches the socket) and returns the socket,
// blocking, to read the ciphertext from, with the bytes each record adds to
// its plaintext under the negotiated version (TLS 1.3: header 5, content
// type 1, tag 16; 1.2 AEAD: header 5, explicit nonce 8, tag 16; 1.2
// ChaCha20: no nonce). Whatever crypto/tls buffered past the 101 is not
// counted: it comes before the warm-up ends.
func (b *bench) floorDialTLS(addr, req string) (int, int, error) {
	fd, err := floorConnect(addr)
	if err != nil {
		return -1, 0, err
	}
	dup, err := unix.Dup(fd)
	if err != nil {
		return fd, 0, err
	}
	f := os.NewFile(uintptr(dup), "floor")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return fd, 0, err
	}
	defer nc.Close() // the duplicate only: the socket stays open on fd
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(nc, b.peerTLS(true))
	if _, err := io.WriteString(tc, req); err != nil {
		return fd, 0, err
	}
	var got []byte
	buf := make([]byte, 1)
	for !bytes.HasSuffix(got, []byte("\r\n\r\n")) {
		// One byte at a time: the frames after the head stay in crypto/tls'
		// record buffer, and nothing is read from the socket past the
		// record that holds the head's end.
		if _, err := tc.Read(buf); err != nil {
			return fd, 0, fmt.Errorf("upgrade: %v", err)
		}
		got = append(got, buf[0])
		if len(got) > 16384 {
			return fd, 0, errors.New("upgrade: head too long")
		}
	}
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 101")) {
		return fd, 0, errors.New("upgrade refused")
	}
	st := tc.ConnectionState()
	over := 22
	if st.Version != tls.VersionTLS13 {
		over = 29
		if st.CipherSuite == tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 || st.CipherSuite == tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 {
			over = 21
		}
	}
	// net.FileConn made the socket non-blocking (O_NONBLOCK belongs to the
	// socket, not to the descriptor): the read loop blocks in read(2).
	if err := unix.SetNonblock(fd, false); err != nil {
		return fd, 0, err
	}
	return fd, over, nil
}

// floorFractions sets FloorPct of every ingress result from the floor run
// with the same transport and connection count.
func (b *bench) floorFractions() {
	type key struct {
		tr    string
		conns int
	}
	floor := map[key]float64{}
	for _, r := range b.results {
		if r.Workload == "ingress" && r.Client == "floor" && r.Err == "" {
			floor[key{r.Transport, r.Conns}] = r.FramesPerSec
		}
	}
	for i := range b.results {
		r := &b.results[i]
		if f := floor[key{r.Transport, r.Conns}]; r.Workload == "ingress" && f > 0 && r.Err == "" {
			r.FloorPct = 100 * r.FramesPerSec / f
		}
	}
}
