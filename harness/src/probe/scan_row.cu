// The probe's row of one tensor in one launch (harness/src/probe/row.rs):
// out[0..5] = [sum of x^2 over finite x, NaN count, +-Inf count,
//              max |x| over finite x, sum of x over every x].
//
// Each block reduces a strided share of the values in double; the last
// block to finish (a counter after a memory fence) adds the blocks' rows
// in block order. Every sum is taken in a fixed order for a given launch
// shape, so the same tensor gives the same bits on the same GPU.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define THREADS 256

struct Row {
    double ssq, nan, inf, max_abs, sum;
};

__device__ __forceinline__ double widen(float v) { return (double)v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ double widen(__half v) { return (double)__half2float(v); }
__device__ __forceinline__ double widen(__nv_bfloat16 v) { return (double)__bfloat162float(v); }

__device__ __forceinline__ void take(Row &r, double x) {
    r.sum += x;
    if (isnan(x)) {
        r.nan += 1.0;
    } else if (isinf(x)) {
        r.inf += 1.0;
    } else {
        r.ssq += x * x;
        r.max_abs = fmax(r.max_abs, fabs(x));
    }
}

__device__ __forceinline__ void merge(Row &a, const Row &b) {
    a.ssq += b.ssq;
    a.nan += b.nan;
    a.inf += b.inf;
    a.max_abs = fmax(a.max_abs, b.max_abs);
    a.sum += b.sum;
}

// Tree reduction of the block's rows into shared[0], in a fixed order.
__device__ void reduce_block(Row *shared) {
    for (int half = THREADS / 2; half > 0; half /= 2) {
        __syncthreads();
        if (threadIdx.x < half) {
            merge(shared[threadIdx.x], shared[threadIdx.x + half]);
        }
    }
    __syncthreads();
}

template <typename T>
__device__ void scan_row(const T *x, size_t n, double *partials, unsigned int *done,
                         double *out) {
    __shared__ Row shared[THREADS];
    __shared__ bool last;
    Row r = {0.0, 0.0, 0.0, 0.0, 0.0};
    size_t stride = (size_t)gridDim.x * THREADS;
    for (size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += stride) {
        take(r, widen(x[i]));
    }
    shared[threadIdx.x] = r;
    reduce_block(shared);
    if (threadIdx.x == 0) {
        double *p = partials + 5 * (size_t)blockIdx.x;
        p[0] = shared[0].ssq;
        p[1] = shared[0].nan;
        p[2] = shared[0].inf;
        p[3] = shared[0].max_abs;
        p[4] = shared[0].sum;
        __threadfence();
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) {
        return;
    }
    // The last block: every other block's row is visible (their fences
    // came before their tickets).
    Row t = {0.0, 0.0, 0.0, 0.0, 0.0};
    for (unsigned int b = threadIdx.x; b < gridDim.x; b += THREADS) {
        volatile double *p = partials + 5 * (size_t)b;
        Row q = {p[0], p[1], p[2], p[3], p[4]};
        merge(t, q);
    }
    shared[threadIdx.x] = t;
    reduce_block(shared);
    if (threadIdx.x == 0) {
        out[0] = shared[0].ssq;
        out[1] = shared[0].nan;
        out[2] = shared[0].inf;
        out[3] = shared[0].max_abs;
        out[4] = shared[0].sum;
    }
}

#define SCAN_ROW(NAME, T)                                                               \
    extern "C" __global__ void NAME(const T *x, size_t n, double *partials,            \
                                    unsigned int *done, double *out) {                  \
        scan_row<T>(x, n, partials, done, out);                                         \
    }

SCAN_ROW(scan_row_f32, float)
SCAN_ROW(scan_row_f64, double)
SCAN_ROW(scan_row_f16, __half)
SCAN_ROW(scan_row_bf16, __nv_bfloat16)
