/* CRC-32C (Castagnoli) of the disk level's records: the SSE4.2 instruction
 * where the CPU has it (three streams interleaved, so that the
 * instruction's latency overlaps), a table otherwise. */
#include "disk_format.h"

#include <pthread.h>
#include <string.h>

static uint32_t table[8][256];
static int have_sse42 = -1;

static void table_init(void)
{
    uint32_t i, j, c;

    for (i = 0; i < 256; i++) {
        c = i;
        for (j = 0; j < 8; j++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[0][i] = c;
    }
    for (i = 0; i < 256; i++)
        for (j = 1; j < 8; j++)
            table[j][i] = (table[j - 1][i] >> 8) ^ table[0][table[j - 1][i] & 0xff];
}

static uint32_t crc_table(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = table[7][v & 0xff] ^ table[6][(v >> 8) & 0xff] ^ table[5][(v >> 16) & 0xff] ^
              table[4][(v >> 24) & 0xff] ^ table[3][(v >> 32) & 0xff] ^
              table[2][(v >> 40) & 0xff] ^ table[1][(v >> 48) & 0xff] ^ table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
/* Bytes each of the three streams takes per round.  The instruction's
 * result comes 3 cycles after its input, so one stream moves 8 bytes per
 * 3 cycles; three independent streams fill those cycles. */
#define LANE 8192

/* The register after LANE zero bytes, per byte of the register before:
 * the update is linear, so a stream started at 0 on the second lane and
 * joined to the first through this shift gives the single stream's
 * value. */
static uint32_t lane_shift[4][256];

__attribute__((target("sse4.2"))) static uint64_t crc_hw_one(uint64_t c, const uint8_t *p,
                                                              size_t n)
{
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return c;
}

static void lane_shift_init(void)
{
    static const uint8_t zeros[LANE];
    uint32_t basis[32];
    int b, k, v;

    for (b = 0; b < 32; b++)
        basis[b] = (uint32_t)crc_hw_one(1u << b, zeros, LANE);
    for (k = 0; k < 4; k++)
        for (v = 0; v < 256; v++) {
            uint32_t x = 0;
            for (b = 0; b < 8; b++)
                if (v >> b & 1)
                    x ^= basis[8 * k + b];
            lane_shift[k][v] = x;
        }
}

static uint32_t shift_lane(uint32_t c)
{
    return lane_shift[0][c & 0xff] ^ lane_shift[1][(c >> 8) & 0xff] ^
           lane_shift[2][(c >> 16) & 0xff] ^ lane_shift[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;

    while (n >= 3 * LANE) {
        uint64_t c1 = 0, c2 = 0;
        size_t i;

        for (i = 0; i < LANE; i += 8) {
            uint64_t v0, v1, v2;
            memcpy(&v0, p + i, 8);
            memcpy(&v1, p + LANE + i, 8);
            memcpy(&v2, p + 2 * LANE + i, 8);
            c = __builtin_ia32_crc32di(c, v0);
            c1 = __builtin_ia32_crc32di(c1, v1);
            c2 = __builtin_ia32_crc32di(c2, v2);
        }
        c = shift_lane(shift_lane((uint32_t)c) ^ (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * LANE;
        n -= 3 * LANE;
    }
    return (uint32_t)crc_hw_one(c, p, n);
}
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    if (have_sse42)
        lane_shift_init();
#else
    have_sse42 = 0;
#endif
    if (!have_sse42)
        table_init();
}

uint32_t kvd__disk_crc32c(uint32_t crc, const void *data, size_t n)
{
    const uint8_t *p = data;

    pthread_once(&once, crc_init);
    crc = ~crc;
#if defined(__x86_64__)
    if (have_sse42)
        return ~crc_hw(crc, p, n);
#endif
    return ~crc_table(crc, p, n);
}
