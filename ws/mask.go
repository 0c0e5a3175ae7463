package ws

import (
	"encoding/binary"
	"math/bits"
)

// Mask XORs b in place with the masking key, as RFC 6455 section 5.3
// describes. pos is the offset of b[0] within the payload (only pos mod 4
// matters), which lets a payload be masked in pieces; Mask returns the
// position after b, to pass to the next call. Masking is its own inverse.
func Mask(key [4]byte, b []byte, pos int) int {
	pos &= 3
	end := (pos + len(b)) & 3
	// Bytes until the next 8-byte boundary of b are handled one by one
	// only for short buffers; the word loop handles any alignment.
	if len(b) < 16 {
		for i := range b {
			b[i] ^= key[(pos+i)&3]
		}
		return end
	}
	// Key as a little-endian word rotated so that its first byte lines up
	// with b[0].
	k32 := binary.LittleEndian.Uint32(key[:])
	k32 = bits.RotateLeft32(k32, -8*pos)
	k64 := uint64(k32)<<32 | uint64(k32)
	for len(b) >= 32 {
		v := binary.LittleEndian.Uint64(b[0:8])
		binary.LittleEndian.PutUint64(b[0:8], v^k64)
		v = binary.LittleEndian.Uint64(b[8:16])
		binary.LittleEndian.PutUint64(b[8:16], v^k64)
		v = binary.LittleEndian.Uint64(b[16:24])
		binary.LittleEndian.PutUint64(b[16:24], v^k64)
		v = binary.LittleEndian.Uint64(b[24:32])
		binary.LittleEndian.PutUint64(b[24:32], v^k64)
		b = b[32:]
	}
	for len(b) >= 8 {
		v := binary.LittleEndian.Uint64(b)
		binary.LittleEndian.PutUint64(b, v^k64)
		b = b[8:]
	}
	// Consumed a multiple of 8 bytes, so the key phase is still pos.
	for i := range b {
		b[i] ^= key[(pos+i)&3]
	}
	return end
}
