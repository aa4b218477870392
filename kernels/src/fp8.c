/*
 * FP8, FP16 and BF16 conversions, bit-exact with the GPU's
 * cvt.rn.satfinite: done on the float's bits with integers only, so no
 * intermediate rounding, excess precision or compiler flag can change a
 * result.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

/* One 8-bit float format.  Values are (1.m) * 2^(e - bias) for normals and
 * m * 2^(emin - mbits) for subnormals (emin = 1 - bias). */
typedef struct fp8_format {
    int mbits;       /* mantissa bits */
    int bias;        /* exponent bias */
    unsigned max;    /* code of the largest finite magnitude */
} fp8_format_t;

static const fp8_format_t e4m3 = {3, 7, 0x7e};  /* 448 */
static const fp8_format_t e5m2 = {2, 15, 0x7b}; /* 57344 */

static uint32_t float_bits(float x)
{
    uint32_t u;

    memcpy(&u, &x, sizeof(u));
    return u;
}

static float bits_float(uint32_t u)
{
    float x;

    memcpy(&x, &u, sizeof(x));
    return x;
}

static uint8_t encode(float x, const fp8_format_t *f)
{
    uint32_t u = float_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t mag = u & 0x7fffffffu;
    int emin = 1 - f->bias;

    if (mag > 0x7f800000u)
        return 0x7f; /* NaN of either sign */
    if (mag == 0x7f800000u)
        return (uint8_t)(sign | f->max); /* satfinite */
    /* Zero and float subnormals (< 2^-126) lie far below half the smallest
     * fp8 subnormal (2^-10 or 2^-17): signed zero. */
    if (mag < 0x00800000u)
        return sign;

    int e = (int)(mag >> 23) - 127;           /* value = m * 2^(e - 23) */
    uint32_t m = (mag & 0x7fffffu) | 0x800000u; /* 24 significant bits */
    /* Keep mbits bits below the leading one for a normal result; for a
     * subnormal one, count whole steps of 2^(emin - mbits). */
    int shift = 23 - f->mbits + (e < emin ? emin - e : 0);
    if (shift > 24)
        return sign; /* below half a step: m < 2^24 <= half of 2^shift */

    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++; /* round to nearest, ties to even */

    /* For a normal, q is 2^mbits + mantissa (or 2^(mbits+1) after a carry,
     * which the addition turns into the next exponent); for a subnormal, q
     * is the code itself (2^mbits being the smallest normal). */
    uint32_t code = e < emin ? q : ((uint32_t)(e + f->bias - 1) << f->mbits) + q;
    if (code > f->max)
        code = f->max; /* satfinite; also keeps e4m3 off its NaN code */
    return (uint8_t)(sign | code);
}

uint8_t kvd_fp8_from_float(float x, int fp8_dtype)
{
    switch (fp8_dtype) {
    case KVD_DTYPE_E4M3:
        return encode(x, &e4m3);
    case KVD_DTYPE_E5M2:
        return encode(x, &e5m2);
    }
    return 0x7f;
}

float kvd_fp8_to_float(uint8_t bits, int fp8_dtype)
{
    const fp8_format_t *f;
    int e, m;
    float v;

    switch (fp8_dtype) {
    case KVD_DTYPE_E4M3:
        f = &e4m3;
        if ((bits & 0x7f) == 0x7f)
            return NAN; /* e4m3fn has no infinities */
        break;
    case KVD_DTYPE_E5M2:
        f = &e5m2;
        if ((bits & 0x7c) == 0x7c) /* exponent all ones */
            return (bits & 0x03) ? NAN : ((bits & 0x80) ? -INFINITY : INFINITY);
        break;
    default:
        return NAN;
    }
    e = (bits & 0x7f) >> f->mbits;
    m = bits & ((1 << f->mbits) - 1);
    if (e == 0) /* subnormal: m steps of 2^(1 - bias - mbits) */
        v = ldexpf((float)m, 1 - f->bias - f->mbits);
    else
        v = ldexpf((float)((1 << f->mbits) + m), e - f->bias - f->mbits);
    return (bits & 0x80) ? -v : v; /* exact; 0x80 gives -0.0 */
}

float kvd_bf16_to_float(uint16_t bits)
{
    return bits_float((uint32_t)bits << 16);
}

float kvd_f16_to_float(uint16_t bits)
{
    uint32_t sign = (uint32_t)(bits & 0x8000) << 16;
    uint32_t e = (bits >> 10) & 0x1f;
    uint32_t m = bits & 0x3ff;

    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in float */
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    if (e == 31) /* inf, or NaN keeping its payload */
        return bits_float(sign | 0x7f800000u | (m << 13));
    return bits_float(sign | ((e - 15 + 127) << 23) | (m << 13));
}
