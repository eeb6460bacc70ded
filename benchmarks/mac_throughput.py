"""Peak multiply-add throughput of this CPU's vector instructions, one core and all cores.

What bounds a verification of k tokens once the weights are in cache is how many multiply-adds a
second the CPU can do. On AVX-512 this times back-to-back independent `vfmadd` (float32, 16 a
vector instruction), `vdpbf16ps` (bf16 pairs, 32) and `vpdpbusd` (uint8 x int8 quads, 64). On AVX2
it times `vfmadd` (8) and the 8-bit products' least pair, `vpmaddubsw` then `vpaddw` into an int16
sum (32 multiply-adds for two instructions: what every chunk of the q4q8 kernels does for each row,
before any unpacking). Both are set against the multiply-adds of a model's block products and LM
head for k rows (`--model`: SmolLM2-135M's shapes or SmolLM2-1.7B's).

    python benchmarks/mac_throughput.py --out benchmarks/results/mac_throughput.md
    python benchmarks/mac_throughput.py --model 1.7B --out benchmarks/results/mac_throughput_avx2.md
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from specdecode.models.native.plan import c_compiler, cpu_flags
from record import cpu_model, publish

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

# Each block of four instructions a loop iteration, AT&T syntax (GCC and clang): 10 independent
# vfmadd chains, then 8 independent int16 sums each fed by its own vpmaddubsw.
SOURCE_AVX2 = r"""
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define FMA(i) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #i "\n"
#define PAIR(t, a) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #t "\n vpaddw %%ymm" #t ", %%ymm" #a ", %%ymm" #a "\n"
int main(void) {
    const long N = 40000000;
    double best[2] = {0, 0};
#pragma omp parallel
    {
        double t[3];
        long n = N;
#pragma omp barrier
        t[0] = now();
        __asm__ volatile("vxorps %%ymm14, %%ymm14, %%ymm14\n vxorps %%ymm15, %%ymm15, %%ymm15\n"
                         "1:\n" FMA(0) FMA(1) FMA(2) FMA(3) FMA(4) FMA(5) FMA(6) FMA(7) FMA(8) FMA(9)
                         "dec %0\n jnz 1b\n" : "+r"(n) :: "memory");
        t[1] = now();
        n = N;
        __asm__ volatile("vpcmpeqb %%ymm14, %%ymm14, %%ymm14\n vpcmpeqb %%ymm15, %%ymm15, %%ymm15\n"
                         "1:\n" PAIR(0, 4) PAIR(1, 5) PAIR(2, 6) PAIR(3, 7) PAIR(0, 8) PAIR(1, 9) PAIR(2, 10) PAIR(3, 11)
                         "dec %0\n jnz 1b\n" : "+r"(n) :: "memory");
        t[2] = now();
#pragma omp critical
        {
            best[0] += 10.0 * N / (t[1] - t[0]);  /* instructions a second, summed over threads */
            best[1] += 8.0 * N / (t[2] - t[1]);
        }
    }
    printf("%g %g\n", best[0], best[1]);
    return 0;
}
"""

WIDTH = {"vfmadd231ps (float32)": 16, "vdpbf16ps (bf16 pairs)": 32, "vpdpbusd (uint8 x int8 quads)": 64}
WIDTH_AVX2 = {"vfmadd231ps ymm (float32)": 8, "vpmaddubsw + vpaddw ymm (uint8 x int8 pairs, int16 sums)": 32}
# (layers, dim, q|k|v outputs, ffn, vocab): SmolLM2-135M and SmolLM2-1.7B
MODELS = {"135M": (30, 576, 960, 1536, 49152), "1.7B": (24, 2048, 6144, 8192, 49152)}


def model_macs(name: str) -> tuple[int, int]:
    """The multiply-adds a row of the model's block products (q|k|v, o, gate|up, down) and of its LM head."""
    layers, dim, qkv, ffn, vocab = MODELS[name]
    return layers * (dim * qkv + dim * dim + dim * 2 * ffn + ffn * dim), vocab * dim


def measure(binary: Path, threads: int) -> list[float]:
    out = subprocess.run([str(binary)], env={**os.environ, "OMP_NUM_THREADS": str(threads)}, capture_output=True,
                         text=True, check=True).stdout
    return [float(v) for v in out.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--model", choices=sorted(MODELS), default="135M", help="whose multiply-adds set the floors")
    parser.add_argument("--isa", choices=["avx512", "avx2"], default=None,
                        help="which instructions to time (default: AVX-512 where the CPU has AVX512-VNNI, else AVX2)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    compiler = c_compiler()
    if compiler is None:
        sys.exit("no C compiler found (set CC)")
    isa = args.isa or ("avx512" if "avx512_vnni" in cpu_flags() else "avx2")
    if isa == "avx2" and "avx2" not in cpu_flags():
        sys.exit("this CPU has no AVX2: nothing here to time")
    widths = WIDTH if isa == "avx512" else WIDTH_AVX2
    block_macs, head_macs = model_macs(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "mac.c", Path(tmp) / "mac"
        source.write_text(SOURCE if isa == "avx512" else SOURCE_AVX2)
        built = subprocess.run([compiler, "-O2", "-march=native", "-fopenmp", str(source), "-o", str(binary)],
                               capture_output=True, text=True)
        if built.returncode:
            sys.exit(f"this CPU or compiler lacks the {isa} instructions timed:\n{built.stderr[-500:]}")
        cores = os.cpu_count() or 1
        rates = {1: measure(binary, 1), cores: measure(binary, cores)}

    lines = [f"# {__doc__.splitlines()[0]}", "", "```", "python " + " ".join(sys.argv), "```", "",
             f"Machine: {cpu_model()}, {platform.platform()}, {cores} cores; {isa}; "
             f"{'8' if isa == 'avx512' else '10 (vfmadd) and 8 (vpaddw)'} independent accumulators a thread, "
             "40M iterations each.", "",
             f"| instruction | multiply-adds each | 1 core: G a second | GMAC/s | {cores} cores: GMAC/s | "
             + " | ".join(f"k = {k}: floor" for k in args.rows) + " |",
             "|---|---|---|---|---|" + "---|" * len(args.rows)]
    for i, (name, width) in enumerate(widths.items()):
        one, all_cores = rates[1][i], rates[cores][i]
        floor = [f"{(block_macs + head_macs) * k / (all_cores * width) * 1e3:.1f} ms" for k in args.rows]
        lines.append(f"| {name} | {width} | {one / 1e9:.2f} | {one * width / 1e9:.0f} | "
                     f"{all_cores * width / 1e9:.0f} | " + " | ".join(floor) + " |")
    lines += ["", f"The floors: the least time the {block_macs / 1e6:.0f}M + {head_macs / 1e6:.0f}M "
              f"multiply-adds of SmolLM2-{args.model}'s block products and LM head take for k rows at that rate on "
              "all cores (no unpacking, no memory traffic, nothing else of the step)."]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
