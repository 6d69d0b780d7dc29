// Informer's sparsity measure from sampled keys (docs/reference.md §2.6) without gathering them: for
// each query row r of the flattened [B·n, p] queries, M̄_r = max_s q_r·k_{idx[r,s]} − (1/n)·Σ_s
// q_r·k_{idx[r,s]} over its U sampled key rows (flat row indices into k [B·n, p]). The gathered
// [B, n, U, p] block the candle path writes and reads back (3.5 GB at n = 4096, U = 279, 12 heads)
// is never formed: K's rows are read where they lie (a head's K is 1 MB, in L2).
//
// Four rows per block of 128 threads, one warp per row; lane l takes samples l, l + 32, ..., each a
// whole dot product (q_r from shared memory, k's row in 16-byte loads); one warp reduction at the
// end. The logits are in T, their sum in double. Requires p % 4 == 0.
template <typename T>
__device__ void sampled_sparsity(const T* __restrict__ q, const T* __restrict__ k,
                                 const unsigned* __restrict__ idx, T* __restrict__ out,
                                 long long rows, int n, int p, int u) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* qs = reinterpret_cast<T*>(smem_raw);  // [4][p]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long first = (long long)blockIdx.x * 4;
    for (int t = threadIdx.x; t < 4 * p; t += 128) {
        const long long r = first + t / p;
        qs[t] = r < rows ? q[r * p + t % p] : T(0);
    }
    __syncthreads();
    const long long row = first + warp;
    if (row >= rows) return;
    const T* qr = qs + warp * p;
    T mx = neg_inf(T(0));
    double sum = 0.0;
    for (int s = lane; s < u; s += 32) {
        const T* kr = k + (long long)idx[row * u + s] * p;
        T dot = 0;
        for (int c = 0; c < p; c += 4) {
            const Vec4<T> a = Vec4<T>::load(qr + c), b = Vec4<T>::load(kr + c);
            dot = fma(a.x, b.x, dot);
            dot = fma(a.y, b.y, dot);
            dot = fma(a.z, b.z, dot);
            dot = fma(a.w, b.w, dot);
        }
        mx = max_nan(mx, dot);
        sum += (double)dot;
    }
    for (int off = 16; off > 0; off /= 2) {
        mx = max_nan(mx, __shfl_xor_sync(0xffffffff, mx, off));
        sum += __shfl_xor_sync(0xffffffff, sum, off);
    }
    if (lane == 0) out[row] = (T)((double)mx - sum / n);
}

extern "C" __global__ void __launch_bounds__(128)
sampled_sparsity_f32(const float* q, const float* k, const unsigned* idx, float* out, long long rows, int n, int p, int u) {
    sampled_sparsity<float>(q, k, idx, out, rows, n, p, u);
}
extern "C" __global__ void __launch_bounds__(128)
sampled_sparsity_f64(const double* q, const double* k, const unsigned* idx, double* out, long long rows, int n, int p, int u) {
    sampled_sparsity<double>(q, k, idx, out, rows, n, p, u);
}
