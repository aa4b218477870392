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
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;

    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2") ? 1 : 0;
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
