/* codec/socks.c - SOCKS5 replies (RFC 1928 sections 3 and 6, RFC 1929
 * section 2): stateless, bounded, a re-parse of the bytes gathered so far
 * on every call (a reply is at most TL_SOCKS_MAX_REPLY bytes). */
#include "codec/socks.h"

int tl_socks_parse(int step, const uint8_t *b, size_t n, uint8_t *code)
{
	size_t need;

	*code = 0;
	switch (step) {
	case TL_SOCKS_METHOD:
	case TL_SOCKS_AUTH:
		if (n < 1)
			return TL_SOCKS_MORE;
		if (b[0] != (step == TL_SOCKS_METHOD ? 5 : 1))
			return TL_SOCKS_BAD;
		if (n < 2)
			return TL_SOCKS_MORE;
		*code = b[1];
		return 2;
	case TL_SOCKS_REPLY:
		if (n < 1)
			return TL_SOCKS_MORE;
		if (b[0] != 5)
			return TL_SOCKS_BAD;
		if (n < 3)
			return TL_SOCKS_MORE;
		if (b[2] != 0)
			return TL_SOCKS_BAD;
		if (n < 4)
			return TL_SOCKS_MORE;
		switch (b[3]) {
		case 1: /* IPv4 */
			need = 4 + 4 + 2;
			break;
		case 4: /* IPv6 */
			need = 4 + 16 + 2;
			break;
		case 3: /* domain name: a length byte, then the name */
			if (n < 5)
				return TL_SOCKS_MORE;
			if (b[4] == 0)
				return TL_SOCKS_BAD;
			need = 4 + 1 + (size_t)b[4] + 2;
			break;
		default:
			return TL_SOCKS_BAD;
		}
		if (n < need)
			return TL_SOCKS_MORE;
		*code = b[1];
		return (int)need;
	}
	return TL_SOCKS_BAD;
}
