// Exact softmax attention fused on a CUDA device (issue 34), compiled at run time by NVRTC
// (src/numerics/cuda/mod.rs). The online-softmax ("flash") form of numerics/flash/mod.rs:
// for a block of BR query rows and each tile of BC keys in order,
//
//   S = Q̃_b K_cᵀ,  m' = max(m, max_j S_ij),  E = exp(S − m'),
//   ℓ ← ℓ·exp(m − m') + Σ_j E_ij (in double),  acc ← acc·exp(m − m') + E·V_c,
//
// and at the end O = acc/ℓ, log D = m + ln ℓ. The score tile lives in registers and shared memory
// and is never written to global memory. Plain FMAs in the element type: no tensor cores, so f32
// is not rounded to TF32 and f64 stays f64.
//
// q [H, n, P] (already scaled by 1/√P), k and v [H_kv, n, P], o [H, n, P], lse [H, n]; query
// head h reads K/V head h / g (grouped-query heads). Under the causal mask row i sees keys j ≤ i,
// and with a sliding window w > 0 also j > i − w; key tiles wholly outside are skipped.
// Grid (⌈n/BR⌉, H); BR/4 · 8 threads.
//
// Thread layout: thread (ty, tx), ty in [0, BR/4), tx in [0, 8), lane = 4·tx + ty mod 4, warp ty/4.
// It owns query rows 4·ty .. 4·ty+3 of the block, score columns tx, tx+8, tx+16, .. of the tile
// (interleaved, so that the 8 threads of a row read 8 consecutive rows of K: no bank conflicts),
// and the output columns P/8·tx .. P/8·(tx+1) − 1, a contiguous run (so that V's rows are read as vectors).
// The 8 threads of a row group differ in lane bits 2..4: row reductions are xor-shuffles 4, 8, 16.

// Copies rows [r0, r0 + rows) of a [n, P] matrix into shared memory with row stride LD, zeros past n.
template <typename T, int P, int LD, int NT>
__device__ __forceinline__ void load_rows(T* dst, const T* __restrict__ src, int r0, int rows, int n) {
    constexpr int V = P / 4;
    for (int idx = threadIdx.x; idx < rows * V; idx += NT) {
        int i = idx / V, c = (idx % V) * 4;
        Vec4<T> a = (r0 + i < n) ? Vec4<T>::load(src + (long long)(r0 + i) * P + c) : Vec4<T>{0, 0, 0, 0};
        a.store(dst + i * LD + c);
    }
}

template <typename T, int P, int BR, int BC>
__device__ void flash_forward(const T* __restrict__ q, const T* __restrict__ k,
                              const T* __restrict__ v, T* __restrict__ o, T* __restrict__ lse,
                              int n, int g, int causal, int window) {
    constexpr int NT = BR / 4 * 8;   // threads
    constexpr int CS = BC / 8;       // score columns per thread
    constexpr int CO = P / 8;        // output columns per thread
    constexpr int LQ = P + 4;        // padded row strides of Q and K in shared memory
    constexpr int LP = BC + 4;       // and of the probability tile
    static_assert(P % 8 == 0 && BC % 8 == 0 && BR % 16 == 0, "tile shape");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* qs = reinterpret_cast<T*>(smem_raw);             // [BR][LQ]
    T* kp = qs + BR * LQ;                                // K tile [BC][LQ], then P tile [BR][LP]
    constexpr int KP = (BC * LQ > BR * LP) ? BC * LQ : BR * LP;
    T* vs = kp + KP;                                     // [BC][P]

    const int nqb = (n + BR - 1) / BR;
    // Under the causal mask the longest blocks (last rows) go first.
    const int qb = causal ? nqb - 1 - (int)blockIdx.x : (int)blockIdx.x;
    const int h = blockIdx.y;
    const int r0 = qb * BR;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int tx = lane / 4, ty = warp * 4 + lane % 4;
    const T* qh = q + (long long)h * n * P;
    const T* kh = k + (long long)(h / g) * n * P;
    const T* vh = v + (long long)(h / g) * n * P;

    load_rows<T, P, LQ, NT>(qs, qh, r0, BR, n);

    T acc[4][CO];
    T m[4];
    double l[4];
    for (int r = 0; r < 4; r++) {
        m[r] = neg_inf(T(0));
        l[r] = 0.0;
        for (int c = 0; c < CO; c++) acc[r][c] = 0;
    }
    const int key_end = causal ? min(n, r0 + BR) : n;
    const int key_begin = (causal && window > 0) ? max(0, r0 + 1 - window) / BC * BC : 0;
    for (int k0 = key_begin; k0 < key_end; k0 += BC) {
        __syncthreads();  // the previous tile's P and V are no longer read
        load_rows<T, P, LQ, NT>(kp, kh, k0, BC, n);
        load_rows<T, P, P, NT>(vs, vh, k0, BC, n);
        __syncthreads();

        T s[4][CS];
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < CS; c++) s[r][c] = 0;
#pragma unroll 4
        for (int p = 0; p < P; p += 4) {
            Vec4<T> a[4], b[CS];
#pragma unroll
            for (int r = 0; r < 4; r++) a[r] = Vec4<T>::load(qs + (ty * 4 + r) * LQ + p);
#pragma unroll
            for (int c = 0; c < CS; c++) b[c] = Vec4<T>::load(kp + (c * 8 + tx) * LQ + p);
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int c = 0; c < CS; c++) {
                    T t = s[r][c];
                    t = fma(a[r].x, b[c].x, t);
                    t = fma(a[r].y, b[c].y, t);
                    t = fma(a[r].z, b[c].z, t);
                    t = fma(a[r].w, b[c].w, t);
                    s[r][c] = t;
                }
        }
        // Keys past n, under the causal mask keys after the row, and keys before its window are
        // not seen.
        const bool edge = (k0 + BC > n) || (causal && k0 + BC - 1 > r0) ||
                          (causal && window > 0 && k0 + window <= r0 + BR - 1);
        if (edge) {
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int c = 0; c < CS; c++) {
                    int i = r0 + ty * 4 + r, j = k0 + c * 8 + tx;
                    if (j >= n || (causal && (j > i || (window > 0 && j + window <= i))))
                        s[r][c] = neg_inf(T(0));
                }
        }
        __syncthreads();  // every thread is done with the K tile: its space takes P
#pragma unroll
        for (int r = 0; r < 4; r++) {
            T mt = s[r][0];
#pragma unroll
            for (int c = 1; c < CS; c++) mt = max_nan(mt, s[r][c]);
            mt = max_nan(mt, __shfl_xor_sync(0xffffffff, mt, 4));
            mt = max_nan(mt, __shfl_xor_sync(0xffffffff, mt, 8));
            mt = max_nan(mt, __shfl_xor_sync(0xffffffff, mt, 16));
            const T mn = max_nan(m[r], mt);
            // A row that has seen no key yet (padding rows past n) keeps 0 weights, not NaN.
            const T shift = (mn == neg_inf(T(0))) ? T(0) : mn;
            const T scale = exp_t(m[r] - shift);
            m[r] = mn;
            T sum = 0;
#pragma unroll
            for (int c = 0; c < CS; c++) {
                const T e = exp_t(s[r][c] - shift);
                sum += e;
                kp[(ty * 4 + r) * LP + c * 8 + tx] = e;
            }
            l[r] = l[r] * (double)scale + (double)sum;
#pragma unroll
            for (int c = 0; c < CO; c++) acc[r][c] *= scale;
        }
        __syncthreads();
        // This tile's E·V in its own partial sums, added to acc once: each sum then runs over BC
        // terms and n/BC tiles instead of n terms in one chain (f32 error 1.7e-6 of max |O| at
        // n = 1500 in one chain, against float64; cuBLAS's blocked path had 6.1e-7).
        T part[4][CO];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < CO; c++) part[r][c] = 0;
#pragma unroll 2
        for (int j = 0; j < BC; j += 4) {
            Vec4<T> pr[4];
#pragma unroll
            for (int r = 0; r < 4; r++) pr[r] = Vec4<T>::load(kp + (ty * 4 + r) * LP + j);
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                T vv[CO];
#pragma unroll
                for (int c = 0; c < CO; c += 4) {
                    Vec4<T> t = Vec4<T>::load(vs + (j + jj) * P + tx * CO + c);
                    vv[c] = t.x; vv[c + 1] = t.y; vv[c + 2] = t.z; vv[c + 3] = t.w;
                }
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const T pw = jj == 0 ? pr[r].x : jj == 1 ? pr[r].y : jj == 2 ? pr[r].z : pr[r].w;
#pragma unroll
                    for (int c = 0; c < CO; c++) part[r][c] = fma(pw, vv[c], part[r][c]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < CO; c++) acc[r][c] += part[r][c];
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        double lr = l[r];
        lr += __shfl_xor_sync(0xffffffff, lr, 4);
        lr += __shfl_xor_sync(0xffffffff, lr, 8);
        lr += __shfl_xor_sync(0xffffffff, lr, 16);
        const int i = r0 + ty * 4 + r;
        if (i < n) {
            const T inv = (T)(1.0 / lr);
            T* orow = o + ((long long)h * n + i) * P + tx * CO;
#pragma unroll
            for (int c = 0; c < CO; c += 4)
                Vec4<T>{acc[r][c] * inv, acc[r][c + 1] * inv, acc[r][c + 2] * inv, acc[r][c + 3] * inv}
                    .store(orow + c);
            if (tx == 0) lse[(long long)h * n + i] = (T)((double)m[r] + log(lr));
        }
    }
}

// The instantiations cuda.rs launches: f32 with 64-row blocks and 64-key tiles (128 threads), f64
// with 32 × 32 (64 threads), each for head sizes 64 and 128.
#define FLASH_KERNEL(NAME, T, P, BR, BC)                                                          \
    extern "C" __global__ void __launch_bounds__(BR / 4 * 8)                                     \
    NAME(const T* q, const T* k, const T* v, T* o, T* lse, int n, int g, int causal, int window) { \
        flash_forward<T, P, BR, BC>(q, k, v, o, lse, n, g, causal, window);                       \
    }
FLASH_KERNEL(flash_f32_p64, float, 64, 64, 64)
FLASH_KERNEL(flash_f32_p128, float, 128, 64, 64)
FLASH_KERNEL(flash_f64_p64, double, 64, 32, 32)
FLASH_KERNEL(flash_f64_p128, double, 128, 32, 32)
