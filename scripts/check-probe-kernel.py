#!/usr/bin/env python3
"""Runs the probe's CUDA kernel (harness/src/probe/scan_row.cu) on the CPU.

A machine without a GPU cannot launch the kernel, but its logic is plain
C++: this script compiles the .cu file as C++20 with g++ under a small
emulation of the CUDA execution model (a block's threads are OS threads
meeting at a barrier for __syncthreads, blocks run one after another,
atomics are std::atomic_ref), runs it over tensors of every dtype, with
NaN, ±Inf, an f32 overflow of Σx², lengths around the block size and 1, 3
and 240 blocks, and checks each row against the sums computed here:
counts and max |x| exactly, Σx² and Σx to 1e-12 relative, and the same
bits for the same launch twice. What it cannot check is nvcc's
compilation and the GPU's memory model (scripts/build-cuda.sh compiles
it; scripts/gpu-smoke.sh runs it).

  python3 scripts/check-probe-kernel.py             # exit 0: every row right
  python3 scripts/check-probe-kernel.py --kernel F  # another .cu file (a changed copy)
"""
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL = os.path.join(ROOT, "harness", "src", "probe", "scan_row.cu")
if sys.argv[1:2] == ["--kernel"] and len(sys.argv) == 3:
    KERNEL = os.path.abspath(sys.argv[2])

EMULATION = r"""
// The CUDA names scan_row.cu uses, for a CPU.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>
using std::fabs; using std::fmax; using std::isinf; using std::isnan;
struct dim3 { unsigned int x = 0, y = 0, z = 0; };
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 gridDim;
inline std::barrier<> *block_barrier = nullptr;
#define __global__
#define __device__
#define __forceinline__ inline
// Blocks run one at a time, so a block's shared memory can be static.
#define __shared__ static
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned int atomicAdd(unsigned int *p, unsigned int v) {
    return std::atomic_ref<unsigned int>(*p).fetch_add(v);
}
struct __half { uint16_t bits; };
struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = uint32_t(h.bits) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
inline float __half2float(__half h) {
    uint32_t s = (h.bits >> 15) & 1, e = (h.bits >> 10) & 31, m = h.bits & 1023;
    float v;
    if (e == 0) v = std::ldexp(float(m), -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = std::ldexp(float(m | 1024), int(e) - 25);
    return s ? -v : v;
}
// Runs kernel(args) on `grid` blocks of `threads` threads: one team of
// threads takes the blocks in turn, meeting at the barrier between them.
inline void launch(unsigned int grid, unsigned int threads, const std::function<void()> &kernel) {
    gridDim.x = grid;
    std::barrier<> bar(threads);
    block_barrier = &bar;
    std::vector<std::thread> team;
    for (unsigned int t = 0; t < threads; ++t)
        team.emplace_back([&, t] {
            threadIdx.x = t;
            for (unsigned int b = 0; b < grid; ++b) {
                blockIdx.x = b;
                kernel();
                bar.arrive_and_wait();
            }
        });
    for (auto &th : team) th.join();
}
"""

DRIVER = r"""
#include "scan_row.cu"
#include <cstdio>
#include <iostream>
// stdin: dtype (f32 f64 f16 bf16), blocks, n, then n raw values (their bits
// in hex). stdout: the row as hex bits, one line.
template <typename T, typename Bits>
void run(unsigned int blocks, size_t n, void (*k)(const T *, size_t, double *, unsigned int *, double *)) {
    std::vector<T> x(n);
    for (size_t i = 0; i < n; ++i) { unsigned long long b; std::cin >> std::hex >> b; Bits v = Bits(b); std::memcpy(&x[i], &v, sizeof(T)); }
    std::vector<double> partials(5 * blocks, 12345.0), out(5, -1.0);
    unsigned int done = 0;
    launch(blocks, THREADS, [&] { k(x.data(), n, partials.data(), &done, out.data()); });
    for (double v : out) { unsigned long long b; std::memcpy(&b, &v, 8); std::printf("%016llx ", b); }
    std::printf("\n");
}
int main() {
    std::string dtype; unsigned int blocks; size_t n;
    std::cin >> dtype >> blocks >> n;
    if (dtype == "f32") run<float, uint32_t>(blocks, n, scan_row_f32);
    else if (dtype == "f64") run<double, uint64_t>(blocks, n, scan_row_f64);
    else if (dtype == "f16") run<__half, uint16_t>(blocks, n, scan_row_f16);
    else run<__nv_bfloat16, uint16_t>(blocks, n, scan_row_bf16);
}
"""


def bits_of(dtype, v):
    """(the value as the dtype holds it, its bits)."""
    if dtype == "f64":
        return v, struct.unpack("<Q", struct.pack("<d", v))[0]
    if dtype == "f32":
        b = struct.unpack("<I", struct.pack("<f", v))[0]
        return struct.unpack("<f", struct.pack("<I", b))[0], b
    if dtype == "f16":
        try:
            b = struct.unpack("<H", struct.pack("<e", v))[0]
        except OverflowError:
            b = 0x7C00 if v > 0 else 0xFC00
        return struct.unpack("<e", struct.pack("<H", b))[0], b
    # bf16: f32's top half (truncated: any bf16 value is exact here).
    b = struct.unpack("<I", struct.pack("<f", v))[0] >> 16
    return struct.unpack("<f", struct.pack("<I", b << 16))[0], b


def expected(values):
    finite = [v for v in values if math.isfinite(v)]
    nan = sum(1 for v in values if math.isnan(v))
    infs = {v for v in values if math.isinf(v)}
    if nan or len(infs) == 2:
        total = math.nan
    elif infs:
        total = infs.pop()
    else:
        total = math.fsum(values)
    inf = sum(1 for v in values if math.isinf(v))
    return [math.fsum(v * v for v in finite), nan, inf, max([abs(v) for v in finite], default=0.0), total]


def close(got, want):
    if math.isnan(want):
        return math.isnan(got)
    if math.isinf(want):
        return got == want
    return abs(got - want) <= 1e-12 * max(1.0, abs(want))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(KERNEL) as f:
            kernel = f.read()
        for name, text in [("cuda_emulation.h", EMULATION), ("driver.cpp", DRIVER),
                           ("scan_row.cu", kernel)]:
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        for stub in ["cuda_fp16.h", "cuda_bf16.h"]:
            with open(os.path.join(tmp, stub), "w") as f:
                f.write('#include "cuda_emulation.h"\n')
        exe = os.path.join(tmp, "scan_row")
        subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-I", tmp, "-o", exe, os.path.join(tmp, "driver.cpp")],
                       check=True)
        rng = random.Random(7)
        failures, rows = 0, 0
        for dtype in ["f32", "f64", "f16", "bf16"]:
            for n in [0, 1, 257, 4099, 20000]:
                for poison in ["none", "nan", "inf", "both", "huge"]:
                    raw = [rng.gauss(0, 3) for _ in range(n)]
                    if n and poison in ("nan", "both"):
                        raw[rng.randrange(n)] = math.nan
                    if n and poison in ("inf", "both"):
                        raw[rng.randrange(n)] = -math.inf
                    if n and poison == "huge":
                        raw[rng.randrange(n)] = 3e30 if dtype in ("f32", "f64", "bf16") else 6e4
                    held = [bits_of(dtype, v) for v in raw]
                    values = [v for v, _ in held]
                    for blocks in [1, 3, 240]:
                        feed = f"{dtype} {blocks} {n} " + " ".join(f"{b:x}" for _, b in held)
                        outs = [subprocess.run([exe], input=feed, capture_output=True, text=True,
                                               check=True).stdout.split() for _ in range(2)]
                        got = [struct.unpack("<d", bytes.fromhex(h)[::-1])[0] for h in outs[0]]
                        want = expected(values)
                        ok = (outs[0] == outs[1] and got[1] == want[1] and got[2] == want[2]
                              and got[3] == want[3] and close(got[0], want[0]) and close(got[4], want[4]))
                        rows += 1
                        if not ok:
                            failures += 1
                            print(f"FAIL {dtype} n={n} {poison} blocks={blocks}: {got} vs {want}"
                                  f"{'' if outs[0] == outs[1] else ' (bits differ between launches)'}")
        print(f"{rows - failures} of {rows} rows right (dtypes f32 f64 f16 bf16; 1, 3 and 240 blocks)")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
