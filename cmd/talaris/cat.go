//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/bits"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/talaris-go/talaris"
)

func catMain(args []string) error {
	fs := flag.NewFlagSet("cat", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: talaris cat [flags] URL\n\nDials a ws:// or wss:// URL, sends the --send messages once open, prints every\nmessage (text as is, binary as hex or length) and, on Ctrl-C, SIGTERM, --count or\n--duration, closes the connection (close handshake, at most --close-timeout; a\nsecond Ctrl-C drops it at once) and prints the counts and the inter-arrival\nhistogram.\nWith --reconnect the connection is re-dialed after every drop (with backoff)\nand the --send messages are sent again after every open.\n\n")
		fs.PrintDefaults()
	}
	var headers, sends, protos multiFlag
	fs.Var(&headers, "H", "request header 'Name: value' (repeatable)")
	fs.Var(&sends, "send", "text message to send after the connection opens (repeatable)")
	fs.Var(&protos, "subprotocol", "subprotocol to offer (repeatable)")
	ca := fs.String("ca", "", "PEM file of trusted root CAs (replaces the system store)")
	insecure := fs.Bool("insecure", false, "do not verify the server certificate")
	serverName := fs.String("servername", "", "TLS server name (SNI and certificate check); default: the URL host")
	tlsf := addTLSFlags(fs)
	count := fs.Int("count", 0, "stop after this many messages (0: no limit)")
	duration := fs.Duration("duration", 0, "stop after this long (0: no limit)")
	timeout := fs.Duration("timeout", 10*time.Second, "connect + TLS + upgrade timeout")
	hexMax := fs.Int("hex", 64, "print binary messages up to this many bytes as hex, longer ones as a length")
	quiet := fs.Bool("q", false, "do not print messages, only the summary")
	stats := fs.Bool("stats", false, "print the per-stage latency breakdown and the loop counters at exit")
	sample := fs.Uint("sample", 1, "with --stats: stamp one receive completion in N (Config.SampleEvery)")
	ping := fs.Duration("ping", 0, "send a ping after this long without receiving anything (0: never)")
	readTimeout := fs.Duration("read-timeout", 0, "fail when nothing at all arrives for this long (0: never); use with --ping below it")
	closeTimeout := fs.Duration("close-timeout", 2*time.Second, "how long a stop waits for the server's close handshake")
	reconnect := fs.Bool("reconnect", false, "re-dial after every drop, with exponential backoff; --send is re-sent after each open")
	rcMin := fs.Duration("reconnect-min", 100*time.Millisecond, "with --reconnect: first and shortest wait between attempts")
	rcMax := fs.Duration("reconnect-max", 30*time.Second, "with --reconnect: longest wait between attempts")
	rcAttempts := fs.Int("reconnect-attempts", 0, "with --reconnect: attempts without an open before giving up (0: forever)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return exitCode(2)
	}
	rawURL := pos[0]
	opts := &talaris.DialOptions{
		Header:       http.Header{},
		Subprotocols: protos,
		TLS:          talaris.TLSOptions{RootCAFile: *ca, InsecureSkipVerify: *insecure, ServerName: *serverName},
		PingInterval: *ping,
		ReadTimeout:  *readTimeout,
	}
	dialCtx := context.Background()
	if *reconnect {
		// The loop sends the --send messages after every open, the first
		// included; --timeout bounds each attempt, and Dial waits until
		// one opens or the policy gives up.
		opts.Reconnect = &talaris.ReconnectPolicy{MinDelay: *rcMin, MaxDelay: *rcMax, MaxAttempts: *rcAttempts}
		opts.HandshakeTimeout = *timeout
		for _, m := range sends {
			opts.Subscribe = append(opts.Subscribe, []byte(m))
		}
		sends = nil
	} else {
		var cancel context.CancelFunc
		dialCtx, cancel = context.WithTimeout(dialCtx, *timeout)
		defer cancel()
	}
	if err := tlsf.apply(&opts.TLS); err != nil {
		return err
	}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return fmt.Errorf("bad header %q: want 'Name: value'", h)
		}
		opts.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	cfg := talaris.Config{CloseTimeout: *closeTimeout}
	if *stats {
		cfg.SampleEvery = uint32(*sample)
	}
	pool, err := talaris.NewPool(cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	t0 := time.Now()
	c, err := pool.Dial(dialCtx, rawURL, opts)
	if err != nil {
		return describeDialErr(err)
	}
	info := fmt.Sprintf("connected to %s in %v", rawURL, time.Since(t0).Round(time.Microsecond))
	if sp := c.Subprotocol(); sp != "" {
		info += fmt.Sprintf(" (subprotocol %q)", sp)
	}
	fmt.Fprintln(os.Stderr, info)
	for _, m := range sends {
		if err := c.SendText([]byte(m)); err != nil {
			return fmt.Errorf("send: %w", err)
		}
	}

	// A stop (signal, --duration, --count) starts the close handshake from
	// whichever goroutine sees it: Close is safe from any goroutine, and
	// the handshake's final event wakes a Pump that sleeps on an idle
	// stream. The reason goes to the pumping loop through stopReq.
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	stopReq := make(chan string, 1)
	var stopOnce sync.Once
	requestStop := func(why string) {
		stopOnce.Do(func() {
			stopReq <- why
			c.Close(talaris.CloseNormal, "")
		})
	}
	go func() {
		s := <-sig
		requestStop(map[os.Signal]string{os.Interrupt: "interrupted", syscall.SIGTERM: "terminated"}[s])
		<-sig
		c.Abort() // a second signal does not wait for the close handshake
	}()
	if *duration > 0 {
		tm := time.AfterFunc(*duration, func() { requestStop("duration reached") })
		defer tm.Stop()
	}

	out := bufio.NewWriterSize(os.Stdout, 64<<10)
	defer out.Flush()
	var st catStats
	st.start = time.Now()
	closing := false
	var final error
	reason := ""
	done := false
	noteStop := func() {
		if closing {
			return
		}
		select {
		case why := <-stopReq:
			closing, reason = true, why
		default:
		}
	}
	for !done {
		_, err := pool.Pump(func(_ talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventText, talaris.EventBinary:
				if closing && *count > 0 && st.msgs >= uint64(*count) {
					return // in flight after --count was reached
				}
				st.add(len(ev.Payload), ev.Kind == talaris.EventText)
				if !*quiet {
					printMsg(out, ev, *hexMax)
				}
				if *count > 0 && st.msgs >= uint64(*count) {
					requestStop("count reached")
					noteStop()
				}
			case talaris.EventPing:
				st.pings++
			case talaris.EventReconnecting:
				st.reconnecting++
				fmt.Fprintf(os.Stderr, "connection dropped (%v); reconnecting in %v\n", describeDialErr(ev.Err), ev.Delay.Round(time.Millisecond))
			case talaris.EventOpen:
				if ev.Reconnects > 0 {
					fmt.Fprintf(os.Stderr, "reconnected to %s (reconnect %d)\n", rawURL, ev.Reconnects)
				}
			case talaris.EventClose:
				noteStop()
				if reason == "" {
					reason = fmt.Sprintf("server closed: %d %q", ev.Code, ev.Reason)
				} else {
					reason += fmt.Sprintf("; close handshake done (%d)", ev.Code)
				}
				done = true
			case talaris.EventError:
				noteStop()
				done = true
				switch {
				case closing && errors.Is(ev.Err, talaris.ErrAborted):
					reason += "; dropped without waiting for the close handshake"
				case closing && errors.Is(ev.Err, talaris.ErrCloseTimeout):
					reason += fmt.Sprintf("; no close handshake from the server within %v, connection dropped", *closeTimeout)
				default:
					if reason == "" {
						reason = "connection failed"
					}
					final = describeDialErr(ev.Err)
				}
			}
		})
		out.Flush()
		if err != nil {
			return err
		}
	}
	out.Flush()
	st.print(os.Stderr, reason)
	if *stats {
		printStages(os.Stderr, pool.Metrics())
	}
	return final
}

type catStats struct {
	start            time.Time
	last             int64
	msgs, text, bin  uint64
	bytes, pings     uint64
	reconnecting     uint64     // EventReconnecting seen (drops and failed attempts)
	buckets          [40]uint64 // inter-arrival: bucket k holds gaps in [2^k, 2^(k+1)) ns
	minGap, maxGap   int64
	sumGap, gapCount int64
}

func (s *catStats) add(n int, text bool) {
	now := time.Now().UnixNano()
	s.msgs++
	s.bytes += uint64(n)
	if text {
		s.text++
	} else {
		s.bin++
	}
	if s.last != 0 {
		g := max(now-s.last, 1)
		s.buckets[min(bits.Len64(uint64(g))-1, len(s.buckets)-1)]++
		if s.gapCount == 0 || g < s.minGap {
			s.minGap = g
		}
		s.maxGap = max(s.maxGap, g)
		s.sumGap += g
		s.gapCount++
	}
	s.last = now
}

func fmtNs(ns int64) string {
	switch {
	case ns < 1e3:
		return fmt.Sprintf("%dns", ns)
	case ns < 1e6:
		return fmt.Sprintf("%.3gus", float64(ns)/1e3)
	case ns < 1e9:
		return fmt.Sprintf("%.3gms", float64(ns)/1e6)
	}
	return fmt.Sprintf("%.3gs", float64(ns)/1e9)
}

func (s *catStats) print(w *os.File, reason string) {
	el := time.Since(s.start).Seconds()
	fmt.Fprintf(w, "\n--- %s ---\n", strings.TrimPrefix(reason, "; "))
	fmt.Fprintf(w, "%d messages (%d text, %d binary), %d payload bytes, %d pings in %.2f s (%.1f msg/s)\n",
		s.msgs, s.text, s.bin, s.bytes, s.pings, el, float64(s.msgs)/max(el, 1e-9))
	if s.reconnecting > 0 {
		fmt.Fprintf(w, "%d drops or failed attempts while reconnecting\n", s.reconnecting)
	}
	if s.gapCount == 0 {
		return
	}
	fmt.Fprintf(w, "inter-arrival: min %s  mean %s  max %s\n", fmtNs(s.minGap), fmtNs(s.sumGap/s.gapCount), fmtNs(s.maxGap))
	var peak uint64
	lo, hi := -1, 0
	for k, v := range s.buckets {
		if v > 0 {
			if lo < 0 {
				lo = k
			}
			hi = k
			peak = max(peak, v)
		}
	}
	for k := lo; k <= hi; k++ {
		v := s.buckets[k]
		bar := strings.Repeat("#", int((v*50+peak-1)/peak))
		fmt.Fprintf(w, "  %8s - %-8s %10d %s\n", fmtNs(1<<k), fmtNs(1<<(k+1)), v, bar)
	}
}

func printMsg(w *bufio.Writer, ev talaris.Event, hexMax int) {
	if ev.Kind == talaris.EventText {
		w.Write(ev.Payload)
		w.WriteByte('\n')
		return
	}
	if len(ev.Payload) <= hexMax {
		fmt.Fprintf(w, "binary %d: %s\n", len(ev.Payload), hex.EncodeToString(ev.Payload))
		return
	}
	fmt.Fprintf(w, "binary %d bytes: %s...\n", len(ev.Payload), hex.EncodeToString(ev.Payload[:min(16, len(ev.Payload))]))
}

// describeDialErr turns a talaris error into one line that says which
// stage failed (DNS, TCP, TLS, WebSocket handshake) and what to try.
func describeDialErr(err error) error {
	if err == nil {
		return nil
	}
	var stage, hint string
	switch {
	case errors.Is(err, talaris.ErrBadURL):
		stage, hint = "bad URL", "use ws://host[:port]/path or wss://..."
	case errors.Is(err, talaris.ErrResolve):
		stage, hint = "DNS", "check the host name"
	case errors.Is(err, talaris.ErrDial):
		stage, hint = "TCP", "is the server listening on that port?"
	case errors.Is(err, talaris.ErrTLSUnknownCA):
		stage, hint = "TLS", "certificate not trusted: pass --ca FILE (or --insecure for tests)"
	case errors.Is(err, talaris.ErrTLSHostname):
		stage, hint = "TLS", "certificate is for another name: check the URL host or --servername"
	case errors.Is(err, talaris.ErrTLSExpired):
		stage = "TLS"
	case errors.Is(err, talaris.ErrTLSPin):
		stage, hint = "TLS", "the server's public key matches no --pin"
	case errors.Is(err, talaris.ErrInvalidConfig):
		stage = "options"
	case errors.Is(err, talaris.ErrTLSNotTLS):
		stage, hint = "TLS", "the server does not speak TLS on that port: try ws://"
	case errors.Is(err, talaris.ErrTLS):
		stage = "TLS"
	case errors.Is(err, talaris.ErrBadStatus):
		stage, hint = "WebSocket handshake", "the server did not switch protocols: check the path, headers and subprotocol"
	case errors.Is(err, talaris.ErrHandshake), errors.Is(err, talaris.ErrHeaderTooLarge):
		stage = "WebSocket handshake"
	case errors.Is(err, talaris.ErrTimeout):
		stage, hint = "timeout", "no answer in time (--timeout)"
	case errors.Is(err, talaris.ErrConnectionLost):
		stage = "connection lost"
	case errors.Is(err, talaris.ErrReadTimeout):
		stage, hint = "read timeout", "nothing arrived within --read-timeout: add --ping below it if the server is just quiet"
	case errors.Is(err, talaris.ErrProtocol), errors.Is(err, talaris.ErrInvalidUTF8), errors.Is(err, talaris.ErrMessageTooBig):
		stage = "protocol"
	default:
		return err
	}
	msg := stage + ": " + err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		msg = stage + ": " + ue.Err.Error()
	}
	if hint != "" {
		msg += " (" + hint + ")"
	}
	return errors.New(msg)
}
