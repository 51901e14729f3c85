"""FAISS flat (brute-force) search, the peer of inst/bench/shapes.R.

FAISS is what GPU and CPU users pick for brute-force kNN: IndexFlatL2 for
Euclidean, IndexFlatIP on rows scaled to unit length for cosine (centred
first for Pearson), in float32, so it is approximate near ties.

  python3 faiss_knn.py FILE N D K METRIC DEVICE OUT [NQ [REPS]]
      FILE: N (+ NQ) x D float64, row-major (its first N + NQ rows are
      read);
      METRIC: euclidean | cosine | pearson;
      DEVICE: cpu | gpu (GpuIndexFlat on GPU 0);
      NQ: 0 (default), a self search of the N rows: each row asks for
      K + 1 neighbours and drops itself (or, where it is not among them,
      the last one); else the NQ rows after them search the N;
      REPS: runs timed (default 1); with more, one run first warms up and
      the median is printed.
      Writes OUT as (N or NQ) x K int32 0-based indices, row-major, and
      prints "faiss total <s> search <s>": total from the float64 host
      arrays to the indices on the host (conversion, index build, search),
      search alone. The GPU resources (StandardGpuResources) are made once,
      before the timing, as a session would keep them.
"""
import sys
import time

import faiss
import numpy as np


def prepare(x, metric):
    x = x.astype(np.float32)
    if metric == "pearson":
        x -= x.mean(axis=1, keepdims=True)
    if metric in ("pearson", "cosine"):
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x)


def make_index(d, metric, resources):
    flat = faiss.IndexFlatL2(d) if metric == "euclidean" else \
        faiss.IndexFlatIP(d)
    if resources is not None:
        return faiss.index_cpu_to_gpu(resources, 0, flat)
    return flat


def drop_self(index, k):
    n = index.shape[0]
    own = index == np.arange(n)[:, None]
    drop = np.where(own.any(axis=1), own.argmax(axis=1), k)
    keep = np.ones(index.shape, dtype=bool)
    keep[np.arange(n), drop] = False
    return index[keep].reshape(n, k)


def run(x, queries, k, metric, resources):
    """One timed search: returns (indices, total s, search s)."""
    start = time.perf_counter()
    xf = prepare(x, metric)
    qf = xf if queries is None else prepare(queries, metric)
    index = make_index(x.shape[1], metric, resources)
    index.add(xf)
    searched = time.perf_counter()
    _, found = index.search(qf, k + 1 if queries is None else k)
    end = time.perf_counter()
    if queries is None:
        found = drop_self(found, k)
    return found, end - start, end - searched


def main():
    path, n, d, k, metric, device, out = sys.argv[1:8]
    nq = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    reps = int(sys.argv[9]) if len(sys.argv) > 9 else 1
    n, d, k = int(n), int(d), int(k)
    x = np.fromfile(path, dtype=np.float64, count=(n + nq) * d)
    x = x.reshape(n + nq, d)
    refs, queries = x[:n], (x[n:] if nq > 0 else None)
    resources = faiss.StandardGpuResources() if device == "gpu" else None
    if reps > 1:
        run(refs, queries, k, metric, resources)
    runs = [run(refs, queries, k, metric, resources) for _ in range(reps)]
    found = runs[-1][0]
    total = float(np.median([r[1] for r in runs]))
    search = float(np.median([r[2] for r in runs]))
    found.astype(np.int32).tofile(out)
    print(f"faiss total {total:.4f} search {search:.4f}")


if __name__ == "__main__":
    main()
