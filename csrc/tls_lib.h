/* tls_lib.h - names the package to install when a library the C core is
 * built against is missing, before any source includes its headers.
 *
 * Not included by any source: talaris_linux.go's #cgo CFLAGS force it into
 * every translation unit cgo compiles (-include), so a go build on a
 * machine without the TLS library's or liburing's headers fails here, with
 * the fix, instead of at the first <openssl/...> of the sources. It checks
 * presence only (__has_include) and includes nothing, so it runs before
 * talaris_core.c's _GNU_SOURCE without changing what that selects.
 *
 * The TLS library (README, "Requirements"): BoringSSL by default, from
 * Debian's android-libboringssl-dev (-I/usr/include/android); OpenSSL 3
 * under -tags talaris_openssl (TL_TLS_LIB_OPENSSL, flags from pkg-config);
 * a BoringSSL of the user's under -tags talaris_boringssl_custom
 * (TL_TLS_LIB_CUSTOM, flags from CGO_CFLAGS and CGO_LDFLAGS). A default
 * build that finds OpenSSL's headers instead of BoringSSL's (no
 * /usr/include/android: Fedora, Arch, Alpine) fails too: it would compile
 * the BoringSSL build against OpenSSL and link whichever libssl the linker
 * finds. BoringSSL has <openssl/base.h>; OpenSSL and LibreSSL have not. */
#ifndef TALARIS_TLS_LIB_H
#define TALARIS_TLS_LIB_H

#if defined(__has_include)

#if !__has_include(<liburing.h>)
#error "talaris: liburing.h not found: install liburing-dev (Debian/Ubuntu, Alpine), liburing-devel (Fedora) or liburing (Arch)"
#endif

#if defined(TL_TLS_LIB_OPENSSL)
#if !__has_include(<openssl/ssl.h>)
#error "talaris: OpenSSL headers not found (build tag talaris_openssl): install libssl-dev (Debian/Ubuntu), openssl-devel (Fedora), openssl (Arch) or openssl-dev (Alpine)"
#endif
#elif defined(TL_TLS_LIB_CUSTOM)
#if !__has_include(<openssl/ssl.h>)
#error "talaris: BoringSSL headers not found (build tag talaris_boringssl_custom): set CGO_CFLAGS=-I<prefix>/include and CGO_LDFLAGS=-L<prefix>/lib for your BoringSSL (README, Requirements)"
#elif !__has_include(<openssl/base.h>)
#error "talaris: the <openssl/ssl.h> found is not BoringSSL's (build tag talaris_boringssl_custom): put -I<prefix>/include of your BoringSSL in CGO_CFLAGS, or build with -tags talaris_openssl for OpenSSL 3"
#endif
#else
#if !__has_include(<openssl/ssl.h>)
#error "talaris: BoringSSL headers not found: install android-libboringssl-dev (Debian/Ubuntu), or build with -tags talaris_openssl (OpenSSL 3: libssl-dev / openssl-devel / openssl / openssl-dev), or point CGO_CFLAGS at your BoringSSL (tag talaris_boringssl_custom)"
#elif !__has_include(<openssl/base.h>)
#error "talaris: found OpenSSL's headers, not BoringSSL's (the default build reads Debian's android-libboringssl-dev in /usr/include/android): build with -tags talaris_openssl to use OpenSSL 3, install android-libboringssl-dev (Debian/Ubuntu), or point CGO_CFLAGS at your BoringSSL (tag talaris_boringssl_custom)"
#endif
#endif

#endif /* __has_include */

#endif
