package ws

import (
	"encoding/binary"
	"unicode/utf8"
)

// ValidUTF8 reports whether b is entirely valid UTF-8 as RFC 3629 defines it
// (no overlong forms, no surrogates, nothing above U+10FFFF).
func ValidUTF8(b []byte) bool { return utf8.Valid(b) }

// UTF8Validator checks UTF-8 that arrives in pieces, such as the fragments
// of a text message. It fails fast: Feed returns false at the first byte that
// no valid continuation could follow, even in the middle of a code point
// (F4 90 fails at 90 because it would exceed U+10FFFF, ED A0 at A0 because
// it starts a surrogate). The zero value is ready to use.
type UTF8Validator struct {
	need   uint8 // continuation bytes still expected for the current code point
	lo, hi byte  // allowed range for the next continuation byte
	bad    bool  // sticky failure
}

// Feed validates the next piece of input. It returns false once the input
// seen so far can no longer be a prefix of valid UTF-8; every later call
// returns false too until Reset.
func (v *UTF8Validator) Feed(b []byte) bool {
	if v.bad {
		return false
	}
	need, lo, hi := v.need, v.lo, v.hi
	for i := 0; i < len(b); {
		if need == 0 {
			// ASCII fast path, eight bytes at a time.
			for len(b)-i >= 8 && binary.LittleEndian.Uint64(b[i:])&0x8080808080808080 == 0 {
				i += 8
			}
			if i == len(b) {
				break
			}
			c := b[i]
			i++
			switch {
			case c < 0x80:
			case c >= 0xC2 && c <= 0xDF:
				need, lo, hi = 1, 0x80, 0xBF
			case c == 0xE0:
				need, lo, hi = 2, 0xA0, 0xBF // no overlongs
			case c == 0xED:
				need, lo, hi = 2, 0x80, 0x9F // no surrogates
			case c >= 0xE1 && c <= 0xEF:
				need, lo, hi = 2, 0x80, 0xBF
			case c == 0xF0:
				need, lo, hi = 3, 0x90, 0xBF // no overlongs
			case c >= 0xF1 && c <= 0xF3:
				need, lo, hi = 3, 0x80, 0xBF
			case c == 0xF4:
				need, lo, hi = 3, 0x80, 0x8F // nothing above U+10FFFF
			default: // 80-C1 (stray continuation, overlong lead), F5-FF
				v.bad = true
				return false
			}
			continue
		}
		c := b[i]
		i++
		if c < lo || c > hi {
			v.bad = true
			return false
		}
		need--
		lo, hi = 0x80, 0xBF
	}
	v.need, v.lo, v.hi = need, lo, hi
	return true
}

// Complete reports whether the input fed so far is valid UTF-8 that does not
// end in the middle of a code point. Call it after the final fragment.
func (v *UTF8Validator) Complete() bool { return !v.bad && v.need == 0 }

// Reset makes v ready for a new stream.
func (v *UTF8Validator) Reset() { *v = UTF8Validator{} }
