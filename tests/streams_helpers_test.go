//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Stream specs and checkers: what a server sends (streamSpec), what a
// test expects of it (streamState), and the sequence-numbered messages
// (seqMsg) senders and sinks agree on.

// streamSpec is one /stream request and what to expect from it.
type streamSpec struct {
	n, size, frag int
	text, ping    bool
}

func (s streamSpec) op() ws.Opcode {
	if s.text {
		return ws.OpText
	}
	return ws.OpBinary
}

func (s streamSpec) path() string {
	op := "binary"
	if s.text {
		op = "text"
	}
	q := fmt.Sprintf("/stream?n=%d&size=%d&op=%s", s.n, s.size, op)
	if s.frag > 1 {
		q += "&frag=" + strconv.Itoa(s.frag)
	}
	if s.ping {
		q += "&ping=1"
	}
	return q
}

func (s streamSpec) String() string {
	k := "bin"
	if s.text {
		k = "text"
	}
	r := fmt.Sprintf("%s_n%d_size%d", k, s.n, s.size)
	if s.frag > 1 {
		r += fmt.Sprintf("_frag%d", s.frag)
	}
	if s.ping {
		r += "_ping"
	}
	return r
}

func (s streamSpec) checker() *wstest.Checker {
	if s.text {
		return wstest.NewTextChecker(s.size)
	}
	return wstest.NewChecker(s.size)
}

// wantPings is the number of pings the server interleaves.
func (s streamSpec) wantPings() int {
	switch {
	case !s.ping:
		return 0
	case s.frag > 1:
		return s.n * (s.frag - 1)
	}
	return s.n
}

// streamState tracks one connection's stream while pumping.
type streamState struct {
	spec    streamSpec
	chk     *wstest.Checker
	err     error // first integrity error
	opened  bool
	pings   int
	pingErr error
	final   *finalEvent
}

func newStreamState(s streamSpec) *streamState {
	return &streamState{spec: s, chk: s.checker()}
}

// on handles one event of the stream's connection.
func (st *streamState) on(ev talaris.Event) {
	switch ev.Kind {
	case talaris.EventOpen:
		if st.opened && st.err == nil {
			st.err = errors.New("second EventOpen")
		}
		st.opened = true
	case talaris.EventText, talaris.EventBinary:
		if st.err != nil {
			return
		}
		if !st.opened {
			st.err = errors.New("data before EventOpen")
			return
		}
		want := talaris.EventBinary
		if st.spec.text {
			want = talaris.EventText
		}
		if ev.Kind != want {
			st.err = fmt.Errorf("message %d: kind %v, want %v", st.chk.Count(), ev.Kind, want)
			return
		}
		st.err = st.chk.Check(ev.Payload)
	case talaris.EventPing:
		// The ping before/inside message i carries "p<i>", i being the
		// message being received (= messages checked so far).
		want := "p" + strconv.Itoa(st.chk.Count())
		if string(ev.Payload) != want && st.pingErr == nil {
			st.pingErr = fmt.Errorf("ping %d: payload %q, want %q", st.pings, ev.Payload, want)
		}
		st.pings++
	case talaris.EventClose, talaris.EventError:
		f := copyFinal(ev)
		st.final = &f
	}
}

// verify checks that the whole stream arrived and ended with close 1000.
func (st *streamState) verify(t testing.TB, label string) {
	t.Helper()
	if st.err != nil {
		t.Errorf("%s: integrity: %v", label, st.err)
	}
	if st.pingErr != nil {
		t.Errorf("%s: %v", label, st.pingErr)
	}
	if got := st.chk.Count(); got != st.spec.n {
		t.Errorf("%s: got %d messages, want %d", label, got, st.spec.n)
	} else if sum, want := st.chk.Sum(), wstest.StreamSum(st.spec.op(), st.spec.n, st.spec.size); sum != want {
		t.Errorf("%s: checksum %#x, want %#x", label, sum, want)
	}
	if st.pings != st.spec.wantPings() {
		t.Errorf("%s: got %d pings, want %d", label, st.pings, st.spec.wantPings())
	}
	switch {
	case st.final == nil:
		t.Errorf("%s: no final event", label)
	case st.final.Kind != talaris.EventClose || st.final.Code != talaris.CloseNormal || st.final.Reason != "done":
		t.Errorf("%s: final event %+v, want close 1000 \"done\"", label, *st.final)
	}
}

// runStream dials srv's /stream for spec on p and checks what arrives.
func runStream(t *testing.T, p *talaris.Pool, srv *wstest.Server, spec streamSpec, afterBatch func()) {
	t.Helper()
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, srv.URL+spec.path(), nil)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	st := newStreamState(spec)
	pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
		if cc != c {
			t.Fatalf("event %v for unknown connection %#x (dialed %#x)", ev.Kind, cc.ID(), c.ID())
			return
		}
		st.on(ev)
	}, func() bool { return st.final != nil }, afterBatch)
	st.verify(t, spec.String())
	if s := c.State(); s != talaris.StateClosed {
		t.Errorf("state after the final event: %v", s)
	}
	if n := p.ConnCount(); n != 0 {
		t.Errorf("ConnCount after the final event: %d", n)
	}
}

// Workloads.

func seqSpec() streamSpec { return streamSpec{n: scaled(1_000_000), size: 16} }

var payloadSizes = []int{0, 1, 125, 126, 127, 65535, 65536, 1 << 20}

func sizeSpecs() []streamSpec {
	var out []streamSpec
	for _, size := range payloadSizes {
		// (Scaled under -short, the race run: the counts repeat the same
		// frames; every size and kind still streams.)
		n := scaled(2000)
		switch {
		case size >= 1<<20:
			n = 8
		case size >= 65535:
			n = scaled(100)
		}
		out = append(out, streamSpec{n: n, size: size})
		if size == 125 || size == 65536 || size == 1<<20 {
			out = append(out, streamSpec{n: n, size: size, text: true})
		}
	}
	return out
}

func fragSpecs() []streamSpec {
	return []streamSpec{
		{n: scaled(20000), size: 300, frag: 4, ping: true, text: true},
		{n: scaled(2000), size: 3, frag: 5, ping: true}, // some fragments are empty
		{n: scaled(3000), size: 40, ping: true},         // a ping before every message
		{n: 6, size: 1 << 20, frag: 7, ping: true},
		{n: scaled(200), size: 65536, frag: 3, text: true},
	}
}

func allSpecs(withSeq bool) []streamSpec {
	var specs []streamSpec
	if withSeq {
		specs = append(specs, seqSpec())
	}
	specs = append(specs, sizeSpecs()...)
	return append(specs, fragSpecs()...)
}

// sendPayload is message i of sender g: its size varies from 12 bytes to
// well over the 16 KiB command-record limit of a 64 KiB command ring, so
// big messages go out as several fragments while other senders wait.
func sendPayload(g, i int) (ws.Opcode, []byte) {
	size := 12 + (i*7919+g*104729)%3000
	if i%97 == 5 {
		size = 40000 + g*1000
	}
	op := ws.OpBinary
	if (i+g)%3 == 0 {
		op = ws.OpText
	}
	b := wstest.AppendPayload(make([]byte, 0, size), op, i*senderStride+g, size)
	return op, b
}

const senderStride = 16

func parseSendPayload(op ws.Opcode, b []byte) (g, seq int, ok bool) {
	if len(b) < 12 {
		return 0, 0, false
	}
	var id int
	if op == ws.OpText {
		v, err := strconv.ParseUint(string(b[:8]), 16, 32)
		if err != nil {
			return 0, 0, false
		}
		id = int(v)
	} else {
		id = int(binary.LittleEndian.Uint64(b))
	}
	g, seq = id%senderStride, id/senderStride
	wop, want := sendPayload(g, seq)
	if wop != op || !bytes.Equal(want, b) {
		return 0, 0, false
	}
	return g, seq, true
}

// pumpStreams pumps p until every connection in sts has its final event,
// feeding each connection's events to its streamState (afterBatch, when
// not nil, runs after every Pump), then verifies every stream.
func pumpStreams(t *testing.T, p *talaris.Pool, sts map[talaris.Conn]*streamState, label string, afterBatch func()) {
	t.Helper()
	finals := 0
	pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
		if st := sts[c]; st != nil {
			st.on(ev)
			if ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError {
				finals++
			}
		}
	}, func() bool { return finals == len(sts) }, afterBatch)
	for c, st := range sts {
		st.verify(t, fmt.Sprintf("%sslot %d", label, c.Slot()))
	}
}

// readRequest reads an upgrade request and returns its Sec-WebSocket-Key.
func readRequest(nc net.Conn) (string, error) {
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	req, err := http.ReadRequest(bufio.NewReader(nc))
	if err != nil {
		return "", err
	}
	return req.Header.Get("Sec-WebSocket-Key"), nil
}

// upgrade answers an upgrade request with a 101.
func upgrade(nc net.Conn, key string) error {
	_, err := io.WriteString(nc, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Accept: "+ws.AcceptKey(key)+"\r\n\r\n")
	return err
}

// sendRetry sends b, retrying while the queue is full.
func sendRetry(c talaris.Conn, b []byte) error {
	for {
		err := c.SendBinary(b)
		if !errors.Is(err, talaris.ErrWouldBlock) {
			return err
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// seqBlock is the content source of seqMsg payloads.
var seqBlock = func() []byte {
	b := make([]byte, 1<<21)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}()

// seqMsg fills p as message i: i in the first 8 bytes, then bytes of
// seqBlock from an offset chosen by i.
func seqMsg(p []byte, i int) []byte {
	binary.LittleEndian.PutUint64(p, uint64(i))
	off := (i * 4099) % 65521
	copy(p[8:], seqBlock[off:off+len(p)-8])
	return p
}

// checkSeqMsg reports whether p is message i as seqMsg builds it.
func checkSeqMsg(p []byte, i int) error {
	if len(p) < 8 {
		return fmt.Errorf("message %d: %d bytes", i, len(p))
	}
	if got := int(binary.LittleEndian.Uint64(p)); got != i {
		return fmt.Errorf("message %d arrived as number %d (lost or reordered)", i, got)
	}
	off := (i * 4099) % 65521
	if !bytes.Equal(p[8:], seqBlock[off:off+len(p)-8]) {
		return fmt.Errorf("message %d: payload corrupt", i)
	}
	return nil
}
