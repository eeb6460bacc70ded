"""Peak multiply-add throughput of this CPU's AVX-512 instructions, one core and all cores.

What bounds a verification of k tokens once the weights are in cache is how many multiply-adds a
second the CPU can do. This times back-to-back independent `vfmadd` (float32, 16 a vector
instruction), `vdpbf16ps` (bf16 pairs, 32) and `vpdpbusd` (uint8 x int8 quads, 64), and sets
them against the multiply-adds of SmolLM2's block products and LM head for k rows.

    python benchmarks/mac_throughput.py --out benchmarks/results/mac_throughput.md
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from specdecode.models.native.plan import c_compiler
from record import publish

SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#define ACC 8  /* independent accumulators a thread (16 measured no faster) */
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
    const long N = 40000000;
    double best[3] = {0, 0, 0};
#pragma omp parallel
    {
        __m512 f[ACC]; __m512i s[ACC];
        __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x3f803f81);
        __m512i ua = _mm512_set1_epi8(3), sb = _mm512_set1_epi8(-2);
        __m512 fa = _mm512_set1_ps(1.0001f), fb = _mm512_set1_ps(0.9999f);
        for (int i = 0; i < ACC; i++) { f[i] = _mm512_setzero_ps(); s[i] = _mm512_setzero_si512(); }
        double t[4];
#pragma omp barrier
        t[0] = now();
        for (long n = 0; n < N; n++) for (int i = 0; i < ACC; i++) { f[i] = _mm512_fmadd_ps(f[i], fa, fb); __asm__ volatile("" : "+v"(f[i])); }
        t[1] = now();
        for (long n = 0; n < N; n++) for (int i = 0; i < ACC; i++) { f[i] = _mm512_dpbf16_ps(f[i], a, b); __asm__ volatile("" : "+v"(f[i])); }
        t[2] = now();
        for (long n = 0; n < N; n++) for (int i = 0; i < ACC; i++) { s[i] = _mm512_dpbusd_epi32(s[i], ua, sb); __asm__ volatile("" : "+v"(s[i])); }
        t[3] = now();
        volatile float sink = _mm512_reduce_add_ps(f[0]) + (float)_mm512_reduce_add_epi32(s[0]);
        (void)sink;
#pragma omp critical
        for (int k = 0; k < 3; k++) best[k] += (double)ACC * N / (t[k + 1] - t[k]);  /* instructions a second, summed over threads */
    }
    printf("%g %g %g\n", best[0], best[1], best[2]);
    return 0;
}
"""

WIDTH = {"vfmadd231ps (float32)": 16, "vdpbf16ps (bf16 pairs)": 32, "vpdpbusd (uint8 x int8 quads)": 64}
# SmolLM2-135M: 30 layers of q|k|v (576 -> 960), o (576 -> 576), gate|up (576 -> 3072), down (1536 -> 576)
BLOCK_MACS = 30 * (576 * 960 + 576 * 576 + 576 * 3072 + 1536 * 576)
HEAD_MACS = 49152 * 576


def measure(binary: Path, threads: int) -> list[float]:
    out = subprocess.run([str(binary)], env={**os.environ, "OMP_NUM_THREADS": str(threads)}, capture_output=True,
                         text=True, check=True).stdout
    return [float(v) for v in out.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    compiler = c_compiler()
    if compiler is None:
        sys.exit("no C compiler found (set CC)")
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "mac.c", Path(tmp) / "mac"
        source.write_text(SOURCE)
        built = subprocess.run([compiler, "-O2", "-march=native", "-fopenmp", str(source), "-o", str(binary)],
                               capture_output=True, text=True)
        if built.returncode:
            sys.exit(f"this CPU or compiler lacks AVX512-BF16 / AVX512-VNNI:\n{built.stderr[-500:]}")
        cores = os.cpu_count() or 1
        rates = {1: measure(binary, 1), cores: measure(binary, cores)}

    lines = [f"# {__doc__.splitlines()[0]}", "", "```", "python " + " ".join(sys.argv), "```", "",
             f"Machine: {platform.platform()}, {cores} cores; 8 independent accumulators a thread, "
             "40M iterations each.", "",
             f"| instruction | multiply-adds each | 1 core: G instr/s | GMAC/s | {cores} cores: GMAC/s | "
             + " | ".join(f"k = {k}: floor" for k in args.rows) + " |",
             "|---|---|---|---|---|" + "---|" * len(args.rows)]
    for i, (name, width) in enumerate(WIDTH.items()):
        one, all_cores = rates[1][i], rates[cores][i]
        floor = [f"{(BLOCK_MACS + HEAD_MACS) * k / (all_cores * width) * 1e3:.1f} ms" for k in args.rows]
        lines.append(f"| {name} | {width} | {one / 1e9:.2f} | {one * width / 1e9:.0f} | "
                     f"{all_cores * width / 1e9:.0f} | " + " | ".join(floor) + " |")
    lines += ["", f"The floors: the least time the {BLOCK_MACS / 1e6:.0f}M + {HEAD_MACS / 1e6:.0f}M "
              "multiply-adds of SmolLM2's block products and LM head take for k rows at that rate on all cores "
              "(no unpacking, no memory traffic, nothing else of the step)."]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
