"""What GPU users write by hand for a kNN graph: chunked x @ x.T + topk.

The peer that inst/bench/gpu.R compares knngpu with. Float32 throughout
(torch's default matmul, no TF32), so it is approximate: near-ties may come
out in another order than the exact float64 answer knngpu returns.

  python3 torch_knn.py make FILE N D SEED    writes N x D N(0,1) float64,
                                             row-major (R reads it as D x N)
  python3 torch_knn.py knn FILE N D K METRIC [NQ]
      prints one line: "torch total <s> gemm <s> chunk <rows>".
      total: host float64 array in -> n x k indices and distances back on
      the host (the median of 5 runs when the first takes under 1 s,
      of 21 under 0.1 s); gemm: the same chunked float32 products alone
      (the bare GEMM). NQ > 0: the last NQ rows of FILE are queries
      against the others.
"""
import statistics
import sys
import time

import numpy as np
import torch


def make(path, n, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, d, generator=g, device="cuda", dtype=torch.float32)
    x.double().cpu().numpy().tofile(path)


def prepare(x, metric):
    if metric == "pearson":
        x = x - x.mean(dim=1, keepdim=True)
    if metric in ("pearson", "cosine"):
        x = x / x.norm(dim=1, keepdim=True)
    return x


def knn(host, k, metric, nq, chunk, gemm_only=False):
    x = prepare(torch.from_numpy(host).cuda().float(), metric)
    ref, query = (x, x) if nq == 0 else (x[:-nq], x[-nq:])
    sq = (ref * ref).sum(dim=1)
    out_i, out_d = [], []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for s in range(0, query.shape[0], chunk):
        q = query[s:s + chunk]
        prod = q @ ref.T
        if gemm_only:
            continue
        if metric == "euclidean":
            score = (q * q).sum(dim=1, keepdim=True) + sq[None, :] - 2 * prod
        else:
            score = -prod
        if nq == 0:
            rows = torch.arange(q.shape[0], device="cuda")
            score[rows, s + rows] = float("inf")
        d, i = torch.topk(score, k, dim=1, largest=False)
        out_i.append(i)
        out_d.append(d)
    torch.cuda.synchronize()
    if gemm_only:
        return time.perf_counter() - t0
    return torch.cat(out_i).cpu().numpy(), torch.cat(out_d).cpu().numpy()


def repeats(runs):
    """Runs to take the median of: 1 from a second up, 5 from 0.1 s, else
    21 (the same rule as inst/bench/gpu.R)."""
    if not runs:
        return 1
    return 1 if runs[0] >= 1.0 else 5 if runs[0] >= 0.1 else 21


def main():
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    path, n, d, k, metric = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
        int(sys.argv[5]), sys.argv[6]
    nq = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    host = np.fromfile(path, dtype=np.float64).reshape(n, d)
    cols = n - nq
    # One chunk of scores is chunk x cols floats: about 2 GB.
    chunk = max(1, min(n, (1 << 29) // cols))
    knn(host[:min(n, 4096)], min(k, 10), metric, 0, 1024)  # warm-up
    runs = []
    while len(runs) < repeats(runs):
        t0 = time.perf_counter()
        knn(host, k, metric, nq, chunk)
        runs.append(time.perf_counter() - t0)
    total = statistics.median(runs)
    gemm = knn(host, k, metric, nq, chunk, gemm_only=True)
    print(f"torch total {total:.6f} gemm {gemm:.6f} chunk {chunk}",
          flush=True)


if __name__ == "__main__":
    main()
