/* CPU kernels of thinwire's stochastic quantizers: noise, quantization and bit packing in one pass.
 *
 * Built and loaded by kernels/_native.py (gcc, -ffp-contract=off: no fused multiply-add, so every
 * product and sum rounds exactly as the pure-torch reference's separate ops do). The noise is a
 * counter-based hash of the element index and two 32-bit keys, u_i = (h(h(i ^ k1) ^ k2) >> 8) / 2^24,
 * uniform on [0, 1) with torch.rand's 24 bits; kernels._native.counter_uniform computes the same
 * numbers with torch ops, so each kernel is checked bit for bit against the reference given them.
 *
 * Shapes: n elements, read flat; one scale per bucket of `bucket` consecutive elements; packed
 * output ceil(n * bits / 8) bytes, codes little-endian within a byte (kernels/pack_bits layout).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TW_CHUNK 8192 /* codes staged per packing round: a multiple of 8 (every byte whole) */
#define TW_LEVELS_MAX (1 << 18) /* the 4- and 8-bit decoders' switch (see tw_decode_levels) */

/* Chris Wellons' lowbias32 with multipliers below 2^31 (hash-prospector), so its torch twin
 * can multiply in int64 without overflow. */
static inline uint32_t tw_hash(uint32_t x) {
    x ^= x >> 16;
    x *= 0x21f0aaadU;
    x ^= x >> 15;
    x *= 0x735a2d97U;
    x ^= x >> 15;
    return x;
}

static inline float tw_uniform_at(int64_t i, uint32_t k1, uint32_t k2) {
    uint32_t h = tw_hash(tw_hash((uint32_t)i ^ k1) ^ k2);
    return (float)(h >> 8) * 0x1p-24f;
}

static inline uint32_t tw_sign_bit(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b >> 31;
}

void tw_uniform(int64_t n, uint32_t k1, uint32_t k2, float *out) {
    for (int64_t i = 0; i < n; ++i) out[i] = tw_uniform_at(i, k1, k2);
}

/* kernels.segment_noise: segment s's entries [starts[s], starts[s + 1]) (the last to n) hashed at
 * their index within it under keys k1[s], k2[s]; uniform floats, or (priority) 30 hash bits as a
 * positive normal float's. */
void tw_segment_noise(int64_t segments, const int64_t *starts, const int64_t *k1, const int64_t *k2,
                      int64_t n, int priority, float *out) {
    for (int64_t s = 0; s < segments; ++s) {
        const int64_t start = starts[s], end = s + 1 < segments ? starts[s + 1] : n;
        const uint32_t a = (uint32_t)k1[s], b = (uint32_t)k2[s];
        if (priority) {
            for (int64_t i = start; i < end; ++i) {
                uint32_t bits = (tw_hash(tw_hash((uint32_t)(i - start) ^ a) ^ b) >> 2) + 0x00800000u;
                memcpy(out + i, &bits, sizeof bits);
            }
        } else {
            for (int64_t i = start; i < end; ++i) out[i] = tw_uniform_at(i - start, a, b);
        }
    }
}

/* Pack `count` codes of `bits` bits (8 / bits per byte, little-endian) into out. */
static void tw_pack(const uint8_t *codes, int64_t count, int bits, uint8_t *out) {
    const int per_byte = 8 / bits;
    const int64_t whole = count / per_byte;
    if (bits == 8) {
        memcpy(out, codes, (size_t)count);
        return;
    }
    for (int64_t j = 0; j < whole; ++j) {
        uint8_t byte = 0;
        for (int k = 0; k < per_byte; ++k) byte |= (uint8_t)(codes[j * per_byte + k] << (k * bits));
        out[j] = byte;
    }
    if (whole * per_byte < count) {
        uint8_t byte = 0;
        for (int64_t k = 0; whole * per_byte + k < count; ++k)
            byte |= (uint8_t)(codes[whole * per_byte + k] << (k * bits));
        out[whole] = byte;
    }
}

/* The hash's numbers for elements [start, end) into u[0, end - start). */
static void tw_hash_noise(int64_t start, int64_t end, uint32_t k1, uint32_t k2, float *u) {
    for (int64_t j = start; j < end; ++j) u[j - start] = tw_uniform_at(j, k1, k2);
}

/* TernGrad: code_i = keep_i << sign_i with keep_i = (u_i * s_b < |g_i|): 0 -> 0, +1 -> 1, -1 -> 2.
 * u holds the noise of elements [start, end). */
static void tw_ternary_codes(const float *g, int64_t start, int64_t end, const float *scalers,
                             int64_t bucket, const float *u, uint8_t *codes) {
    for (int64_t i = start; i < end;) {
        const int64_t b = i / bucket;
        const int64_t stop = (b + 1) * bucket < end ? (b + 1) * bucket : end;
        const float s = scalers[b];
        for (int64_t j = i; j < stop; ++j) {
            const float a = g[j] < 0.0f ? -g[j] : g[j];
            const uint8_t keep = u[j - start] * s < a;
            codes[j - start] = (uint8_t)(keep << tw_sign_bit(g[j]));
        }
        i = stop;
    }
}

/* Ternarize with the hash's noise (keys; noise NULL) or with the caller's (noise[n]: torch.rand's
 * numbers in the default path, so its codes are the reference's bit for bit). */
static void tw_ternarize_from(const float *g, int64_t n, const float *scalers, int64_t bucket, uint32_t k1,
                              uint32_t k2, const float *noise, uint8_t *out) {
    uint8_t codes[TW_CHUNK];
    float u[TW_CHUNK];
    for (int64_t start = 0; start < n; start += TW_CHUNK) {
        const int64_t end = start + TW_CHUNK < n ? start + TW_CHUNK : n;
        if (noise == NULL) tw_hash_noise(start, end, k1, k2, u);
        tw_ternary_codes(g, start, end, scalers, bucket, noise == NULL ? u : noise + start, codes);
        tw_pack(codes, end - start, 2, out + start / 4);
    }
}

void tw_ternarize(const float *g, int64_t n, const float *scalers, int64_t bucket, uint32_t k1,
                  uint32_t k2, uint8_t *out) {
    tw_ternarize_from(g, n, scalers, bucket, k1, k2, NULL, out);
}

void tw_ternarize_noise(const float *g, int64_t n, const float *scalers, int64_t bucket, const float *noise,
                        uint8_t *out) {
    tw_ternarize_from(g, n, scalers, bucket, 0, 0, noise, out);
}

/* QSGD: level_i = min(|v_i| * scale_b + u_i, s) truncated; code = level | (sign && level) << (bits-1).
 * u holds the noise of elements [start, end). */
static void tw_qsgd_codes(const float *v, int64_t start, int64_t end, const float *scales,
                          int64_t bucket, int bits, const float *u, uint8_t *codes) {
    const float s = (float)((1 << (bits - 1)) - 1);
    const uint8_t sign_shift = (uint8_t)(bits - 1);
    for (int64_t i = start; i < end;) {
        const int64_t b = i / bucket;
        const int64_t stop = (b + 1) * bucket < end ? (b + 1) * bucket : end;
        const float scale = scales[b];
        for (int64_t j = i; j < stop; ++j) {
            const float a = v[j] < 0.0f ? -v[j] : v[j];
            float x = a * scale;
            x = x + u[j - start];
            x = x < s ? x : s; /* min(x, s); a NaN becomes s, not an undefined conversion */
            const uint8_t level = (uint8_t)(int8_t)x;
            const uint8_t negative = (uint8_t)(tw_sign_bit(v[j]) & (level != 0));
            codes[j - start] = (uint8_t)(level + (negative << sign_shift));
        }
        i = stop;
    }
}

static void tw_qsgd_quantize_from(const float *v, int64_t n, const float *scales, int64_t bucket, int bits,
                                  uint32_t k1, uint32_t k2, const float *noise, uint8_t *out) {
    uint8_t codes[TW_CHUNK];
    float u[TW_CHUNK];
    for (int64_t start = 0; start < n; start += TW_CHUNK) {
        const int64_t end = start + TW_CHUNK < n ? start + TW_CHUNK : n;
        if (noise == NULL) tw_hash_noise(start, end, k1, k2, u);
        tw_qsgd_codes(v, start, end, scales, bucket, bits, noise == NULL ? u : noise + start, codes);
        tw_pack(codes, end - start, bits, out + start * bits / 8);
    }
}

void tw_qsgd_quantize(const float *v, int64_t n, const float *scales, int64_t bucket, int bits,
                      uint32_t k1, uint32_t k2, uint8_t *out) {
    tw_qsgd_quantize_from(v, n, scales, bucket, bits, k1, k2, NULL, out);
}

void tw_qsgd_quantize_noise(const float *v, int64_t n, const float *scales, int64_t bucket, int bits,
                            const float *noise, uint8_t *out) {
    tw_qsgd_quantize_from(v, n, scales, bucket, bits, 0, 0, noise, out);
}

/* Decoders: out_i = ((0 + d_0,i) + d_1,i) + ... + d_{W-1},i in worker order, d_w,i = value * unit_w,b
 * with value the signed level (QSGD) or the ternary value in {-1, 0, 1} (TernGrad, code 3 -> 0) and
 * unit_w,b the bucket's level unit (n_b / s) or scaler: one product and one sum each, as the
 * reference's table lookup, bucket multiply and sum_in_worker_order round. packed is [W, M] rows of
 * M bytes, units [W, B].
 *
 * 2-bit codes (4 a byte) become their values (small integers, exact as int8 and as float) through
 * a table of 256 x 4 entries, a chunk at a time, and the product and sum run over contiguous int8
 * values; at 10^5-10^6 entries, one core, that is 1.4-2x faster than shifting each code out of its
 * byte where it is summed, which 4- and 8-bit codes keep (there the table was 1.3-2.5x slower).
 * A sign bit on level 0 (2-bit QSGD's code 2; no encoder writes it) decodes to +0 where the
 * reference has -0: after the first worker's 0 + d the sum is never -0, so adding either zero
 * leaves it unchanged, and 0 times an infinite unit is the same default NaN, so the outputs are
 * the same bits (tests/kernels/test_native.py decodes random bytes against the reference). */
/* The value of code k of a byte: QSGD's signed level, or TernGrad's {0, 1, -1, 0} (codes 1 and 2,
 * i.e. bit 0 minus bit 1 when both are not set). */
static inline float tw_code_value(uint32_t byte, int k, int bits, int ternary) {
    const uint32_t code = (byte >> (k * bits)) & ((1U << bits) - 1);
    if (ternary) return (float)((int)(code & 1U) - (int)(code >> 1)) * (float)(code != 3U);
    const uint32_t s = (1U << (bits - 1)) - 1;
    const float level = (float)(code & s);
    return (code >> (bits - 1)) ? -level : level;
}

/* [byte][k]: the value of the byte's code k, for TernGrad and 2-bit QSGD (and TernGrad's as floats,
 * tw_decode_first_row's); filled when the library is loaded (before any call, so no two threads
 * race to fill them). */
static int8_t tw_values_ternary[256][4], tw_values_q2[256][4];
static float tw_floats_ternary[256][4];

static void tw_fill_values(int8_t *table, int bits, int ternary) {
    const int per = 8 / bits;
    for (uint32_t byte = 0; byte < 256; ++byte)
        for (int k = 0; k < per; ++k) table[byte * per + k] = (int8_t)tw_code_value(byte, k, bits, ternary);
}

__attribute__((constructor)) static void tw_fill_tables(void) {
    tw_fill_values(&tw_values_ternary[0][0], 2, 1);
    tw_fill_values(&tw_values_q2[0][0], 2, 0);
    for (int byte = 0; byte < 256; ++byte)
        for (int k = 0; k < 4; ++k) tw_floats_ternary[byte][k] = (float)tw_values_ternary[byte][k];
}

/* TernGrad's first payload with one scaler for its whole row (a scaler per tensor, the default):
 * each byte's four values as floats from a 256 x 4 table, times the scaler, 0 + d as the other
 * loops' first worker. On one core of the AMX Xeon 0.82-0.85 of the table-and-scale loop's time at
 * 10^5 and 10^7 entries and 0.67-0.81 at 10^6 with warm caches, 0.92-1.0 with the caches flushed
 * between calls (/tmp/s17/proto3.c, ab.py, throw-away; the same bits); for the later workers'
 * out + d it was 1.04-1.33, so they keep that loop. */
static inline void tw_decode_first_row(const uint8_t *restrict row, int64_t n, const float unit,
                                       float *restrict out) {
    const int64_t whole = n / 4;
    for (int64_t m = 0; m < whole; ++m) {
        const float *t = tw_floats_ternary[row[m]];
        for (int k = 0; k < 4; ++k) out[4 * m + k] = 0.0f + t[k] * unit;
    }
    for (int64_t i = whole * 4; i < n; ++i) out[i] = 0.0f + tw_floats_ternary[row[i / 4]][i % 4] * unit;
}

/* A chunk's int8 values [start, end) times their buckets' units, into out (w == 0: 0 + d, the first
 * worker; else out + d): the product and sum over contiguous values (vectorized). */
static inline void tw_scale_chunk(const int8_t *restrict values, int64_t start, int64_t end,
                                  const float *restrict unit_row, int64_t bucket, int w, float *restrict out) {
    for (int64_t i = start; i < end;) { /* each bucket's share of the chunk */
        const int64_t b = i / bucket;
        const int64_t stop = (b + 1) * bucket < end ? (b + 1) * bucket : end;
        const float unit = unit_row[b];
        const int8_t *restrict v = values + (i - start);
        float *restrict o = out + i;
        const int64_t len = stop - i;
        if (w == 0)
            for (int64_t j = 0; j < len; ++j) o[j] = 0.0f + (float)v[j] * unit;
        else
            for (int64_t j = 0; j < len; ++j) o[j] = o[j] + (float)v[j] * unit;
        i = stop;
    }
}

/* 2-bit codes (TernGrad, QSGD 2 bits): a chunk's values looked up 4 a byte, then the product and
 * sum over contiguous int8 values (vectorized). */
static inline void tw_decode_table(const uint8_t *restrict row, int64_t n, const float *restrict unit_row,
                                   int64_t bucket, const int8_t *restrict table, int w, float *restrict out) {
    int8_t values[TW_CHUNK + 4]; /* a chunk's values; its last byte may reach past the chunk's end */
    for (int64_t start = 0; start < n; start += TW_CHUNK) { /* start: a whole byte */
        const int64_t end = start + TW_CHUNK < n ? start + TW_CHUNK : n;
        const int64_t first = start / 4, last = (end + 3) / 4;
        for (int64_t m = first; m < last; ++m) memcpy(values + (m - first) * 4, table + row[m] * 4, 4);
        tw_scale_chunk(values, start, end, unit_row, bucket, w, out);
    }
}

/* 4- and 8-bit codes up to TW_LEVELS_MAX entries: a chunk's signed levels computed into int8 values
 * (a byte's codes shifted out, the sign applied as an integer negation), then the same product and
 * sum over contiguous values as the table's. On one core of the AMX Xeon this took 0.53-0.69 of the
 * shifting loop's time at 10^5 entries and 0.80-1.25 of it at 10^6-10^7 between runs (the loops
 * alternated, the same bits; /tmp/s16/ab_dec.py, throw-away), so larger payloads keep the shifting
 * loop. A sign bit on level 0 gives +0 where the shifting loop's -level gave -0: after the first
 * worker's 0 + d the sum is never -0, so either zero leaves it unchanged (the 2-bit table's
 * argument above), and the tests decode random bytes against the reference. */
static inline void tw_decode_levels(const uint8_t *restrict row, int64_t n, const float *restrict unit_row,
                                    int64_t bucket, const int bits, int w, float *restrict out) {
    const int per = 8 / bits;
    const uint32_t mask = (1U << bits) - 1, s = (1U << (bits - 1)) - 1;
    int8_t values[TW_CHUNK + 8]; /* a chunk's values; its last byte may reach past the chunk's end */
    for (int64_t start = 0; start < n; start += TW_CHUNK) { /* start: a whole byte */
        const int64_t end = start + TW_CHUNK < n ? start + TW_CHUNK : n;
        const int64_t first = start / per, last = (end + per - 1) / per;
        for (int64_t m = first; m < last; ++m) {
            const uint32_t byte = row[m];
            for (int k = 0; k < per; ++k) {
                const uint32_t code = (byte >> (k * bits)) & mask;
                const int32_t level = (int32_t)(code & s), negative = (int32_t)(code >> (bits - 1));
                values[(m - first) * per + k] = (int8_t)((level ^ -negative) + negative);
            }
        }
        tw_scale_chunk(values, start, end, unit_row, bucket, w, out);
    }
}

/* 4- and 8-bit codes: each code shifted out of its byte where it is summed (whole bytes vectorize;
 * at these widths this beats the table, which moves as many bytes as it decodes). */
#define TW_VALUE(byte, k) tw_code_value((byte), (k), bits, 0)
static inline void tw_decode_shift(const uint8_t *restrict row, int64_t n, const float *restrict unit_row,
                                   int64_t bucket, const int bits, int w, float *restrict out) {
    const int per = 8 / bits;
    for (int64_t i = 0; i < n;) {
        const int64_t b = i / bucket;
        const int64_t stop = (b + 1) * bucket < n ? (b + 1) * bucket : n;
        const float unit = unit_row[b];
        /* whole bytes inside [i, stop) a byte at a time, the ragged ends an element at a time */
        const int64_t head = (i + per - 1) / per * per < stop ? (i + per - 1) / per * per : stop;
        const int64_t tail = head + (stop - head) / per * per;
        for (int64_t j = i; j < head; ++j)
            out[j] = (w ? out[j] : 0.0f) + TW_VALUE(row[j / per], j % per) * unit;
        if (w == 0) {
            for (int64_t m = head / per; m < tail / per; ++m)
                for (int k = 0; k < per; ++k) out[m * per + k] = 0.0f + TW_VALUE(row[m], k) * unit;
        } else {
            for (int64_t m = head / per; m < tail / per; ++m)
                for (int k = 0; k < per; ++k) out[m * per + k] = out[m * per + k] + TW_VALUE(row[m], k) * unit;
        }
        for (int64_t j = tail; j < stop; ++j)
            out[j] = (w ? out[j] : 0.0f) + TW_VALUE(row[j / per], j % per) * unit;
        i = stop;
    }
}

static inline void tw_decode(const uint8_t *restrict packed, int64_t workers, int64_t row_bytes, int64_t n,
                             const float *restrict units, int64_t num_units, int64_t bucket, const int bits,
                             const int ternary, float *restrict out) {
    const int8_t *table = ternary ? &tw_values_ternary[0][0] : &tw_values_q2[0][0];
    for (int64_t w = 0; w < workers; ++w) {
        const uint8_t *row = packed + w * row_bytes;
        const float *unit_row = units + w * num_units;
        if (ternary && w == 0 && bucket >= n) tw_decode_first_row(row, n, unit_row[0], out);
        else if (bits == 2) tw_decode_table(row, n, unit_row, bucket, table, (int)(w != 0), out);
        else if (n > TW_LEVELS_MAX) tw_decode_shift(row, n, unit_row, bucket, bits, (int)(w != 0), out);
        else if (bits == 4) tw_decode_levels(row, n, unit_row, bucket, 4, (int)(w != 0), out);
        else tw_decode_levels(row, n, unit_row, bucket, 8, (int)(w != 0), out);
    }
}

/* norms [W, B]: each bucket's level unit n_b / s is computed here, one fp32 division as the
 * reference's level_units (torch's fp32 true division by the scalar s). */
int tw_qsgd_decode(const uint8_t *packed, int64_t workers, int64_t row_bytes, int64_t n,
                   const float *norms, int64_t num_units, int64_t bucket, int bits, float *out) {
    const int64_t total = workers * num_units;
    float *units = malloc((size_t)(total > 0 ? total : 1) * sizeof *units);
    if (units == NULL) return 1;
    const float s = (float)((1 << (bits - 1)) - 1);
    for (int64_t i = 0; i < total; ++i) units[i] = norms[i] / s;
    if (bits == 2) tw_decode(packed, workers, row_bytes, n, units, num_units, bucket, 2, 0, out);
    else if (bits == 4) tw_decode(packed, workers, row_bytes, n, units, num_units, bucket, 4, 0, out);
    else tw_decode(packed, workers, row_bytes, n, units, num_units, bucket, 8, 0, out);
    free(units);
    return 0;
}

void tw_ternary_decode(const uint8_t *packed, int64_t workers, int64_t row_bytes, int64_t n,
                       const float *scalers, int64_t num_scalers, int64_t bucket, float *out) {
    tw_decode(packed, workers, row_bytes, n, scalers, num_scalers, bucket, 2, 1, out);
}

/* TernGrad's integer route (GradientSync all-reduces the codes' int8 sum when every rank shares
 * one scaler): a payload's codes as int8 values {-1, 0, +1} (the unused code 3 as 0), four a byte
 * from the value table, and a code sum decoded, (float)v_i * s, as torch's cast then product. */
void tw_ternary_values(const uint8_t *restrict packed, int64_t n, int8_t *restrict out) {
    const int64_t whole = n / 4;
    for (int64_t m = 0; m < whole; ++m) memcpy(out + 4 * m, tw_values_ternary[packed[m]], 4);
    for (int64_t i = whole * 4; i < n; ++i) out[i] = tw_values_ternary[packed[i / 4]][i % 4];
}

void tw_scale_int8(const int8_t *restrict v, int64_t n, float s, float *restrict out) {
    for (int64_t i = 0; i < n; ++i) out[i] = (float)v[i] * s;
}

void tw_scale_int16(const int16_t *restrict v, int64_t n, float s, float *restrict out) {
    for (int64_t i = 0; i < n; ++i) out[i] = (float)v[i] * s;
}

/* Threshold selection (DGC, ExDyna): the entries with |x_i| >= thr, in ascending position, into
 * buffers of `capacity` slots (slots past the count hold value 0 at index 0); returns the exact count,
 * which may exceed capacity. The reference's compare, nonzero and gather in one pass.
 *
 * A block of TW_SELECT_BLOCK entries is first tested as a whole (|x| >= thr anywhere: a loop with no
 * stores, which vectorizes) and only a block that holds a selected entry is scanned, one entry at a
 * time without a branch on the data: at DGC's density nearly every block is skipped, and at its
 * warm-up densities (6-25 %) a branch would mispredict often. At 10^6 entries on one core of an AMX
 * Xeon the loop with a branch on every entry took 1.6-2.2 ms at densities 0.001 and 0.01 and 7 ms at
 * 0.3; this one 0.3, 0.9 and 1.5 ms, the same outputs. fabsf and the reference's abs agree on every
 * input (NaN is never selected, -0 is 0). */
#define TW_SELECT_BLOCK 64
/* Entry i into the next slot if selected, without a branch on the data: every entry is stored, to
 * the next slot or, past the capacity, to a scratch one, and the count moves by the comparison's 0
 * or 1 (a slot written by an entry that was not selected is overwritten or zeroed at the end). */
static inline void tw_select_one(const float *x, int64_t i, float thr, int64_t capacity, float *values,
                                 int32_t *indices, int64_t *count, float *scratch_value, int32_t *scratch_index) {
    const int64_t c = *count;
    float *value = c < capacity ? values + c : scratch_value;
    int32_t *index = c < capacity ? indices + c : scratch_index;
    *value = x[i];
    *index = (int32_t)i;
    *count = c + (fabsf(x[i]) >= thr);
}

int64_t tw_threshold_select(const float *x, int64_t n, float thr, int64_t capacity, float *values,
                            int32_t *indices) {
    int64_t count = 0;
    float scratch_value;
    int32_t scratch_index;
    const int64_t whole = n - n % TW_SELECT_BLOCK;
    for (int64_t start = 0; start < whole; start += TW_SELECT_BLOCK) {
        int any = 0;
        for (int j = 0; j < TW_SELECT_BLOCK; ++j) any |= fabsf(x[start + j]) >= thr;
        if (!any) continue;
        for (int64_t i = start; i < start + TW_SELECT_BLOCK; ++i)
            tw_select_one(x, i, thr, capacity, values, indices, &count, &scratch_value, &scratch_index);
    }
    for (int64_t i = whole; i < n; ++i)
        tw_select_one(x, i, thr, capacity, values, indices, &count, &scratch_value, &scratch_index);
    for (int64_t j = count < capacity ? count : capacity; j < capacity; ++j) {
        values[j] = 0.0f;
        indices[j] = 0;
    }
    return count;
}

/* DGC's momentum correction (kernels/ef_update): u = m * u + g, v = v + u, in place, one pass; the
 * product and each sum rounded on their own, as the reference's mul_, add_, add_. */
void tw_ef_update(float *restrict u, float *restrict v, const float *restrict g, int64_t n, float m) {
    for (int64_t i = 0; i < n; ++i) {
        float t = m * u[i];
        t = t + g[i];
        u[i] = t;
        v[i] = v[i] + t;
    }
}

/* The same, the new v also written to v_out (its own memory): one pass where a copy would be a second. */
void tw_ef_update_out(float *restrict u, float *restrict v, const float *restrict g, int64_t n, float m,
                      float *restrict v_out) {
    for (int64_t i = 0; i < n; ++i) {
        float t = m * u[i];
        t = t + g[i];
        u[i] = t;
        float w = v[i] + t;
        v[i] = w;
        v_out[i] = w;
    }
}

/* Sparse payloads (top-k, DGC; kernels/masked_compact's masked_scatter): out[indices[j]] =
 * values[j] for j in order, the reference's index_copy_ without its int64 copy of the indices.
 * Returns -1, or the first j whose index is outside [0, n): then nothing is written. */
int64_t tw_scatter(const float *restrict values, const int32_t *restrict indices, int64_t k, int64_t n,
                   float *restrict out) {
    int64_t bad = 0;
    for (int64_t j = 0; j < k; ++j) bad |= indices[j] < 0 || indices[j] >= n; /* no branch: vectorizes */
    if (bad)
        for (int64_t j = 0; j < k; ++j)
            if (indices[j] < 0 || indices[j] >= n) return j;
    for (int64_t j = 0; j < k; ++j) out[indices[j]] = values[j];
    return -1;
}

/* torch.rand's stream on a CPU generator (ATen's CPUGeneratorImpl): MT19937, one 32-bit draw per
 * number, its low 24 bits times 2^-24 (uniform_real_distribution<float>), in the engine's order:
 * a draw first decrements `left` and regenerates the 624 words when it reaches 0, then tempers
 * state[next++]. `state` (624 words), `left` and `next` are the engine's, read from and written
 * back to the generator by kernels/_native.py; numbers are made a run of state words at a time
 * (the tempering vectorizes), the same numbers and final state as n calls of the engine. */
#define TW_MT_N 624
#define TW_MT_M 397

static inline uint32_t tw_mt_twist(uint32_t u, uint32_t v) {
    return (((u & 0x80000000U) | (v & 0x7fffffffU)) >> 1) ^ ((v & 1U) ? 0x9908b0dfU : 0U);
}

static void tw_mt_next_state(uint32_t *p) {
    int j = 0;
    for (; j < TW_MT_N - TW_MT_M; ++j) p[j] = p[j + TW_MT_M] ^ tw_mt_twist(p[j], p[j + 1]);
    for (; j < TW_MT_N - 1; ++j) p[j] = p[j + TW_MT_M - TW_MT_N] ^ tw_mt_twist(p[j], p[j + 1]);
    p[TW_MT_N - 1] = p[TW_MT_M - 1] ^ tw_mt_twist(p[TW_MT_N - 1], p[0]);
}

void tw_mt_uniform(uint32_t *state, int64_t *left_next, int64_t n, float *out) {
    int64_t left = left_next[0], next = left_next[1];
    for (int64_t i = 0; i < n;) {
        if (left == 1) { /* the next draw regenerates, then reads word 0 */
            tw_mt_next_state(state);
            left = TW_MT_N + 1;
            next = 0;
        }
        const int64_t take = left - 1 < n - i ? left - 1 : n - i;
        const uint32_t *restrict words = state + next;
        float *restrict o = out + i;
        for (int64_t t = 0; t < take; ++t) {
            uint32_t y = words[t];
            y ^= y >> 11;
            y ^= (y << 7) & 0x9d2c5680U;
            y ^= (y << 15) & 0xefc60000U;
            y ^= y >> 18;
            o[t] = (float)(y & 0xffffffU) * 0x1p-24f;
        }
        i += take;
        next += take;
        left -= take;
    }
    left_next[0] = left;
    left_next[1] = next;
}

/* signSGD (common.compressors.signsgd): bit i % 8 of byte i / 8 set where x[i] < 0 (-0.0 and
 * NaN are not: as torch's x < 0), kernels.pack_bits' 1-bit layout, the last byte zero-padded. */
void tw_sign_pack(const float *restrict x, int64_t n, uint8_t *restrict out) {
    const int64_t whole = n / 8;
    for (int64_t b = 0; b < whole; ++b) {
        const float *p = x + 8 * b;
        uint8_t v = 0;
        for (int j = 0; j < 8; ++j) v |= (uint8_t)(p[j] < 0.0f) << j;
        out[b] = v;
    }
    if (n % 8) {
        uint8_t v = 0;
        for (int64_t i = 8 * whole; i < n; ++i) v |= (uint8_t)(x[i] < 0.0f) << (i - 8 * whole);
        out[whole] = v;
    }
}

/* out[i] = d_0 + d_1 + ... in worker order, d_w = -s_w where worker w's bit i is set, else s_w
 * (s_w = scales[w], or 1 when scales is NULL): the payloads' decoding summed as the reference's
 * clone-then-add, each product exact (a sign times a scale). Per worker a 256 x 8 table of the
 * eight values each byte decodes to: a byte's eight outputs are one row copied (or added). */
void tw_sign_decode(const uint8_t *restrict packed, int64_t workers, int64_t row_bytes, int64_t n,
                    const float *restrict scales, float *restrict out) {
    float table[256][8]; /* on the stack: calls from several threads (collective callbacks) do not share it */
    const int64_t whole = n / 8;
    for (int64_t w = 0; w < workers; ++w) {
        const float s = scales ? scales[w] : 1.0f;
        for (int v = 0; v < 256; ++v)
            for (int j = 0; j < 8; ++j) table[v][j] = ((v >> j) & 1) ? -s : s;
        const uint8_t *row = packed + w * row_bytes;
        if (w == 0) {
            for (int64_t b = 0; b < whole; ++b) memcpy(out + 8 * b, table[row[b]], sizeof table[0]);
        } else {
            for (int64_t b = 0; b < whole; ++b) {
                const float *t = table[row[b]];
                float *o = out + 8 * b;
                for (int j = 0; j < 8; ++j) o[j] += t[j];
            }
        }
        for (int64_t i = 8 * whole; i < n; ++i) {
            const float d = table[row[whole]][i - 8 * whole];
            out[i] = w == 0 ? d : out[i] + d;
        }
    }
}
