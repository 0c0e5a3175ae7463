package talaris

// TLSBackend names the TLS library linked into the C core: "boringssl"
// (default) or "openssl" (build tag talaris_openssl); "" without cgo.
func TLSBackend() string { return tlsBackend() }

// PinCurrentThreadTo locks the calling goroutine to its OS thread and pins
// that thread to cpu.
func PinCurrentThreadTo(cpu int) error { return pinCurrentThreadTo(cpu) }
