//go:build linux && cgo

/* talaris_core.c lets cgo compile the C core in csrc/ with the package's
 * flags: one translation unit per file would need a prebuilt archive.
 * Its #include lines are the one list of the core's sources: cgo.mk
 * reads them too, and compiles each file on its own. Lower layers first:
 * base, codec, crypto, ws, transport, loop (each folder's README.md). */
#define _GNU_SOURCE
#include "csrc/base/bufring.c"
#include "csrc/base/slots.c"
#include "csrc/base/evq.c"
#include "csrc/base/timer.c"
#include "csrc/base/pub.c"
#include "csrc/codec/utf8.c"
#include "csrc/codec/ws.c"
#include "csrc/codec/http.c"
#include "csrc/crypto/gcm.c"
#include "csrc/ws/conn.c"
#include "csrc/ws/send.c"
#include "csrc/ws/upgrade.c"
#include "csrc/ws/frames.c"
#include "csrc/ws/close.c"
#include "csrc/ws/inject.c"
#include "csrc/transport/plain.c"
#include "csrc/transport/tls_verify.c"
#include "csrc/transport/tlsrec.c"
#include "csrc/transport/tls_bio.c"
#include "csrc/transport/tls_send.c"
#include "csrc/transport/tls_handover.c"
#include "csrc/transport/tls_read.c"
#include "csrc/transport/tls.c"
#include "csrc/loop/rx.c"
#include "csrc/loop/tx.c"
#include "csrc/loop/life.c"
#include "csrc/loop/tick.c"
#include "csrc/loop/dispatch.c"
#include "csrc/loop/probe.c"
#include "csrc/loop/stall.c"
#include "csrc/loop/wait.c"
#include "csrc/loop/run.c"
#include "csrc/loop/setup.c"
#include "csrc/loop/api.c"
#include "csrc/loop/cmdq.c"
#include "csrc/loop/decoder.c"
