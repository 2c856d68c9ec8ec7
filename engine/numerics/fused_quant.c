/* Fused CPU passes of the quantizer (docs/methods.md §1, "Fused kernels"): engine/numerics/fused.py compiles this file
 * with the system's C compiler and calls it through ctypes. Each function is quant.quantize's (or
 * autograd._q_rows's) chain of torch passes as one pass over the tensor, with the same float operations in the
 * same order, so the results are the same bit for bit: u = (x - lo) / step (a subtraction, then an IEEE
 * division, as the device form and the GPU kernels compute it), the noise added, clamp to [0, qmax], round half
 * to even (nearbyintf in the default rounding mode), u * step + lo (a multiply, then an add). Compiled with
 * -ffp-contract=off, so the compiler fuses no multiply and add into one rounding; NaN passes through as it does
 * in torch's clamp and round. The 16-bit noise words are torch's own draw (quant.noise_words): the random
 * stream is unchanged.
 *
 * Threads: OpenMP, the runtime torch has already loaded (libgomp.so.1), so torch.set_num_threads holds here too.
 */
#include <math.h>
#include <stdint.h>

/* quant.NOISE_LEVELS: the noise is n = (v + 0.5) / 2^16, added as torch's passes add it: the 0.5 / 2^16 first,
 * then v / 2^16 (torch's add with alpha is a fused multiply-add, but v / 2^16 is exact, so a multiply and an add
 * round the same) */
#define NOISE_HALF (0.5f / 65536.0f)
#define NOISE_SCALE (1.0f / 65536.0f)
#define PARALLEL_MIN 32768 /* below this many elements one thread is faster than waking another */

static inline float level(float u, float qmax) {
    u = u < 0.0f ? 0.0f : u;
    u = u > qmax ? qmax : u;
    return nearbyintf(u);
}

/* quant.quantize, per-tensor range on the host: u = (x - lo) / step, u += 0.5 / 2^16 and u += v / 2^16
 * (stochastic, ``noise`` not NULL), level, out = u * step + lo. */
void fq_tensor(const float *x, float *out, const int16_t *noise, int64_t n, float lo, float step, float qmax) {
    if (noise) {
#pragma omp parallel for simd schedule(static) if (n > PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) {
            float u = (x[i] - lo) / step;
            u = u + NOISE_HALF;
            u = u + (float)noise[i] * NOISE_SCALE;
            out[i] = level(u, qmax) * step + lo;
        }
    } else {
#pragma omp parallel for simd schedule(static) if (n > PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++)
            out[i] = level((x[i] - lo) / step, qmax) * step + lo;
    }
}

/* autograd._q_rows on the host: ``rows`` rows of ``k`` values, row r in group gid[r]; params holds 3 floats per
 * group (lo, step, qmax) and each row gets fq_tensor's operations at its group's. A group with qmax 0 is 32
 * bits: its rows are copied. */
void fq_rows(const float *x, float *out, const int16_t *noise, int64_t rows, int64_t k,
             const int64_t *gid, const float *params) {
#pragma omp parallel for schedule(static) if (rows * k > PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *p = params + 3 * gid[r];
        const float lo = p[0], step = p[1], qmax = p[2];
        const float *xr = x + r * k;
        float *o = out + r * k;
        if (qmax <= 0.0f) {
            for (int64_t i = 0; i < k; i++) o[i] = xr[i];
        } else if (noise) {
            const int16_t *v = noise + r * k;
#pragma omp simd
            for (int64_t i = 0; i < k; i++) {
                float u = (xr[i] - lo) / step;
                u = u + NOISE_HALF;
                u = u + (float)v[i] * NOISE_SCALE;
                o[i] = level(u, qmax) * step + lo;
            }
        } else {
#pragma omp simd
            for (int64_t i = 0; i < k; i++)
                o[i] = level((xr[i] - lo) / step, qmax) * step + lo;
        }
    }
}

/* torch's CPU generator (at::mt19937, ATen/core/MT19937RNGEngine.h) stepped here, for quant.noise_words:
 * ``state`` is torch.get_rng_state()'s bytes (THGeneratorState: seed u64, left i32, seeded i32, next u64,
 * state[624] u64, ...), updated in place for torch.set_rng_state. Writes ``n`` 64-bit draws to ``out`` exactly
 * as Tensor.random_(-2**63, None) on int64 does (each draw two 32-bit outputs, the first the high half). The
 * state is regenerated a block of 624 words at a time in three loops the compiler vectorises; tempering, too. */
#define MT_N 624
#define MT_M 397

static inline uint32_t mt_twist(uint32_t u, uint32_t v) {
    return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

static void mt_next_state(uint32_t *s) {
    uint32_t t[MT_N];
    for (int i = 0; i < MT_N - MT_M; i++) t[i] = s[i + MT_M] ^ mt_twist(s[i], s[i + 1]);
    for (int i = MT_N - MT_M; i < MT_N - 1; i++) t[i] = t[i + MT_M - MT_N] ^ mt_twist(s[i], s[i + 1]);
    t[MT_N - 1] = t[MT_M - 1] ^ mt_twist(s[MT_N - 1], t[0]);
    for (int i = 0; i < MT_N; i++) s[i] = t[i];
}

static inline uint32_t mt_temper(uint32_t y) {
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
}

int fq_mt_words(unsigned char *state, uint64_t *out, int64_t n) {
    int32_t left = *(int32_t *)(state + 8);
    uint64_t next = *(uint64_t *)(state + 16);
    uint64_t *legacy = (uint64_t *)(state + 24);
    uint32_t s[MT_N], t[MT_N];
    if (left < 1 || left > MT_N || next > MT_N || next + left - 1 > MT_N) return -1;
    for (int i = 0; i < MT_N; i++) s[i] = (uint32_t)legacy[i];
    /* the block's unread outputs are s[next..next + left - 1); a read with none left regenerates the block,
     * after which left + next == 625 (a freshly seeded engine has left 1, next 0: nothing unread) */
    uint32_t *o32 = (uint32_t *)out; /* output j is half (j ^ 1) of the little-endian words: first = high */
    int64_t total = 2 * n, o = 0;
    int64_t take = left - 1 < total ? left - 1 : total;
    for (int64_t i = 0; i < take; i++) o32[(o + i) ^ 1] = mt_temper(s[next + i]);
    o += take;
    next += take;
    left -= (int32_t)take;
    while (o < total) {
        mt_next_state(s);
        take = total - o < MT_N ? total - o : MT_N;
        for (int i = 0; i < MT_N; i++) t[i] = mt_temper(s[i]);
        uint32_t *dst = o32 + o;
        if ((o & 1) == 0) {
            int64_t i = 0;
            for (; i + 1 < take; i += 2) { dst[i] = t[i + 1]; dst[i + 1] = t[i]; }
            if (i < take) dst[i + 1] = t[i]; /* last output, the high half of a word still open */
        } else {
            for (int64_t i = 0; i < take; i++) o32[(o + i) ^ 1] = t[i];
        }
        o += take;
        next = take;
        left = MT_N + 1 - (int32_t)take;
    }
    *(int32_t *)(state + 8) = left;
    *(uint64_t *)(state + 16) = next;
    for (int i = 0; i < MT_N; i++) legacy[i] = s[i];
    return 0;
}

/* autograd._q_rows's per-row ranges (rows.amin(1), rows.amax(1)) in one pass: lo[r], hi[r]; a row holding a
 * NaN gets NaN for both, as torch's amin and amax give. Min and max are exact, so the order does not matter. */
void fq_row_range(const float *x, int64_t rows, int64_t k, float *lo, float *hi) {
#pragma omp parallel for schedule(static) if (rows * k > PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * k;
        float mn = INFINITY, mx = -INFINITY;
        int nan = 0;
#pragma omp simd reduction(min : mn) reduction(max : mx) reduction(| : nan)
        for (int64_t i = 0; i < k; i++) {
            float v = xr[i];
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
            nan |= v != v;
        }
        lo[r] = nan ? NAN : mn;
        hi[r] = nan ? NAN : mx;
    }
}

/* quant.tensor_range on the host: torch.aminmax of n values into out[0], out[1] (NaN for both where one is NaN,
 * as aminmax gives). */
void fq_minmax(const float *x, int64_t n, float *out) {
    float mn = INFINITY, mx = -INFINITY;
    int nan = 0;
#pragma omp parallel for simd schedule(static) reduction(min : mn) reduction(max : mx) reduction(| : nan) \
    if (n > PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
        nan |= v != v;
    }
    out[0] = nan ? NAN : mn;
    out[1] = nan ? NAN : mx;
}
