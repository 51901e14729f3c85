"""GEMM rates of the GPU's candidate arithmetics, for the precision policy.

Times one cuBLAS GEMM (through PyTorch) of a 2048-row tile against 300000
nodes at p = 100 and 500 features in TF32, split TF32 (depth 3p, as
knngpu runs it: [hi | hi | lo] against [hi | lo | hi]), float32 and
float64, ten runs after three warm-ups, and prints ms per tile and
TFLOP/s. Behind inst/bench/RESULTS.md, "Would a float64 rung pay on the
GPU?".

Usage, on a machine with a CUDA GPU and PyTorch:
    python3 inst/bench/gemm_rates.py
"""
import time

import torch


def rate(dtype, m, n, depth, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(m, depth, device="cuda", dtype=dtype)
    b = torch.randn(depth, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.time()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    seconds = (time.time() - start) / 10
    return seconds, 2.0 * m * n * depth / seconds / 1e12


def main():
    m, n = 2048, 300000
    print(torch.cuda.get_device_name(0))
    for p in (100, 500):
        for name, dtype, tf32, depth in [
                ("tf32", torch.float32, True, p),
                ("tf32x3 (3p)", torch.float32, True, 3 * p),
                ("fp32", torch.float32, False, p),
                ("fp64", torch.float64, False, p)]:
            seconds, tflops = rate(dtype, m, n, depth, tf32)
            print(f"p={p} {name:12s} {seconds * 1000:8.2f} ms per "
                  f"{m}x{n} tile  {tflops:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
