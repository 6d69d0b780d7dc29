// Helpers shared by the project's CUDA kernels (src/numerics/cuda/*.cu), which NVRTC compiles as
// one source: this file first, then each kernel file (src/numerics/cuda/mod.rs).

template <typename T> struct Vec4;
// 16-byte loads and stores (own aligned structs: no dependence on NVRTC's vector-type headers).
struct __align__(16) F4 { float x, y, z, w; };
struct __align__(16) D2 { double x, y; };
template <> struct Vec4<float> {
    float x, y, z, w;
    __device__ __forceinline__ static Vec4 load(const float* p) {
        F4 a = *reinterpret_cast<const F4*>(p);
        return Vec4{a.x, a.y, a.z, a.w};
    }
    __device__ __forceinline__ void store(float* p) const {
        *reinterpret_cast<F4*>(p) = F4{x, y, z, w};
    }
};
template <> struct Vec4<double> {
    double x, y, z, w;
    __device__ __forceinline__ static Vec4 load(const double* p) {
        D2 a = reinterpret_cast<const D2*>(p)[0];
        D2 b = reinterpret_cast<const D2*>(p)[1];
        return Vec4{a.x, a.y, b.x, b.y};
    }
    __device__ __forceinline__ void store(double* p) const {
        reinterpret_cast<D2*>(p)[0] = D2{x, y};
        reinterpret_cast<D2*>(p)[1] = D2{z, w};
    }
};

__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }
__device__ __forceinline__ float log_t(float x) { return logf(x); }
__device__ __forceinline__ double log_t(double x) { return log(x); }
__device__ __forceinline__ float neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double neg_inf(double) { return __longlong_as_double(0xfff0000000000000ULL); }
// max that propagates NaN (fmax drops it): a row that meets a NaN logit comes out NaN, as on the
// host, and is counted as non-finite downstream instead of hidden.
__device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ double max_nan(double a, double b) { return (a > b || a != a) ? a : b; }

