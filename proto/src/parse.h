/*
 * Numbers and sizes as people type them: the one parser of the daemon's
 * options and the CLI's arguments (kvdock_vocab; internal: libkvdock does
 * not export it).
 *
 * Numbers are decimal, always: "010" is ten, "0x10" is refused.  No sign
 * on unsigned values, no spaces around.
 *
 * A SIZE is bytes: a number, optionally with a fraction ("1.5"), then a
 * unit, case aside, optionally after one space:
 *   (none), B                  bytes (no fraction)
 *   K, M, G, T, P              powers of 1024 (as the daemon prints sizes:
 *   KiB, MiB, GiB, TiB, PiB    "2.0 GiB")
 *   KB, MB, GB, TB, PB         powers of 1000
 * A fraction must come to whole bytes ("1.5K" is 1536; "0.1K" is refused).
 */
#ifndef KVDOCK_PARSE_H
#define KVDOCK_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "kvdock/status.h"

/* What a SIZE takes, for help texts. */
#define KVD_SIZE_WORDS                                                                             \
    "bytes, or with a unit: K, M, G, T (or KiB, MiB, ...: powers of 1024), KB, MB, GB, TB "       \
    "(powers of 1000); fractions like 1.5G"

/* A decimal number into *out: KVD_OK, KVD_EINVAL (not one; *out unset) or
 * KVD_ERANGE (past UINT64_MAX / the int64_t range). */
kvd_status_t kvd__parse_u64(const char *s, uint64_t *out);
kvd_status_t kvd__parse_i64(const char *s, int64_t *out);

/* A SIZE into *out (bytes): KVD_OK, KVD_EINVAL (not a size, or a fraction
 * of a byte) or KVD_ERANGE (past UINT64_MAX). */
kvd_status_t kvd__parse_size(const char *s, uint64_t *out);
/* Whether s would be a size but for a fraction of a byte (0.1G): the
 * refusal then says so. */
int kvd__size_inexact(const char *s);
/* What such a refusal says after the value. */
#define KVD_SIZE_INEXACT "is not a whole number of bytes: give it in a smaller unit (100M, not 0.1G)"

/* The edit distance of a[0..n) and b (99 past 32 characters): what names
 * a near miss for a suggestion. */
size_t kvd__edit_distance(const char *a, size_t n, const char *b);

#endif /* KVDOCK_PARSE_H */
