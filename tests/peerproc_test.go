package talaris_test

import (
	"bufio"
	"crypto/tls"
	"os/exec"
	"strings"
	"testing"

	"github.com/talaris-go/talaris"
)

// startListener starts cmd, a peer process that prints "LISTEN <port or
// addr>" as its first line of stdout, kills it when the test ends, and
// returns what followed LISTEN. what names the peer in a failure.
func startListener(t testing.TB, what string, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "LISTEN ") {
		t.Fatalf("%s did not start: %q %v", what, line, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "LISTEN "))
}

// startWS starts an in-process server over ws:// (start) or, with useTLS,
// over wss:// with the test certificate (startTLS), and returns the
// DialOptions that trust it (nil for ws://). Pass the server's methods:
// startWS(t, useTLS, srv.Start, srv.StartTLS).
func startWS[S any](t testing.TB, useTLS bool, start func(testing.TB) S, startTLS func(testing.TB, *tls.Config) S) *talaris.DialOptions {
	t.Helper()
	if useTLS {
		startTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
		return tlsOpts
	}
	start(t)
	return nil
}

// dialPumped dials url on p (within dialCtx) and pumps p in the
// background (startPump) for c's final event.
func dialPumped(t *testing.T, p *talaris.Pool, url string, opts *talaris.DialOptions) (talaris.Conn, *bgPump) {
	t.Helper()
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, url, opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	return c, startPump(t, p, c)
}
