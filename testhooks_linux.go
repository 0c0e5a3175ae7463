//go:build linux && cgo

package talaris

// What internal/testhook exposes of a running Pool to the benchmark and
// the black-box tests: the pump claim, the loop's counters, the own GCM's
// verdict, direct sends, a slot's loop and where a payload lies.

/*
#include "csrc/talaris.h"
#include "csrc/crypto/gcm.h"
*/
import "C"

import (
	"slices"
	"unsafe"

	"github.com/talaris-go/talaris/internal/testhook"
)

func init() {
	testhook.PumpClaim = func(p any) int32 { return p.(*Pool).pumping.Load() }
	testhook.Stats = func(p any) testhook.PoolStats { return p.(*Pool).poolStats() }
	testhook.OwnGCM = func() bool { return C.tl_gcm_supported() != 0 }
	testhook.DirectSends = func(c any) (uint64, uint64) { return c.(Conn).directSends() }
	testhook.ConnLoop = func(p any, slot int) int {
		pool := p.(*Pool)
		return slices.Index(pool.shards, pool.shardOf[slot])
	}
	testhook.PayloadOrigin = func(p any, b []byte) int {
		if len(b) == 0 {
			return testhook.OriginOther
		}
		for _, sh := range p.(*Pool).shards {
			if o := int(C.tl_loop_payload_origin(sh.loop, unsafe.Pointer(&b[0]))); o != testhook.OriginOther {
				return o
			}
		}
		return testhook.OriginOther
	}
}
