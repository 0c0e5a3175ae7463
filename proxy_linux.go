//go:build linux && cgo

package talaris

/*
#include "csrc/talaris.h"
*/
import "C"

// The proxy's numbers mirror the C core's (csrc/ring.h, csrc/talaris.h): a
// negative array length fails to compile unless the two sides are equal.
type (
	_ [C.TL_E_PROXY - cErrProxy]byte
	_ [cErrProxy - C.TL_E_PROXY]byte
	_ [C.TL_PROXY_STATUS - cProxyStatus]byte
	_ [cProxyStatus - C.TL_PROXY_STATUS]byte
	_ [C.TL_PROXY_REPLY - cProxyReply]byte
	_ [cProxyReply - C.TL_PROXY_REPLY]byte
	_ [C.TL_PROXY_AUTH - cProxyAuth]byte
	_ [cProxyAuth - C.TL_PROXY_AUTH]byte
	_ [C.TL_PROXY_MALFORMED - cProxyMalformed]byte
	_ [cProxyMalformed - C.TL_PROXY_MALFORMED]byte
	_ [C.TL_PROXY_TOO_LARGE - cProxyTooLarge]byte
	_ [cProxyTooLarge - C.TL_PROXY_TOO_LARGE]byte
	_ [C.TL_PROXY_TIMEOUT - cProxyTimeout]byte
	_ [cProxyTimeout - C.TL_PROXY_TIMEOUT]byte
	_ [C.TL_PROXY_LOST - cProxyLost]byte
	_ [cProxyLost - C.TL_PROXY_LOST]byte
	_ [C.TL_PROXY_KIND_HTTP - proxyHTTP]byte
	_ [proxyHTTP - C.TL_PROXY_KIND_HTTP]byte
	_ [C.TL_PROXY_KIND_SOCKS5 - proxySOCKS5]byte
	_ [proxySOCKS5 - C.TL_PROXY_KIND_SOCKS5]byte
)
