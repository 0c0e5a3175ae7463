//go:build linux && cgo

/* talaris_core.c lets cgo compile the C core in csrc/ with the package's
 * flags: one translation unit per file would need a prebuilt archive. */
#define _GNU_SOURCE
#include "csrc/utf8.c"
#include "csrc/ws.c"
#include "csrc/http.c"
#include "csrc/bufring.c"
#include "csrc/slots.c"
#include "csrc/evq.c"
#include "csrc/timer.c"
#include "csrc/pub.c"
#include "csrc/rx.c"
#include "csrc/tx.c"
#include "csrc/life.c"
#include "csrc/tick.c"
#include "csrc/loop.c"
#include "csrc/cmdq.c"
#include "csrc/decoder.c"
#include "csrc/conn.c"
#include "csrc/plain.c"
#include "csrc/tls_verify.c"
#include "csrc/gcm.c"
#include "csrc/tlsrec.c"
#include "csrc/tls.c"
