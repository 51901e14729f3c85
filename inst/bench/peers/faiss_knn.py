"""FAISS flat (brute-force) search, the peer of inst/bench/shapes.R.

FAISS is what GPU and CPU users pick for brute-force kNN: IndexFlatL2 for
Euclidean, IndexFlatIP on rows scaled to unit length for cosine (centred
first for Pearson), in float32, so it is approximate near ties.

  python3 faiss_knn.py FILE N D K METRIC DEVICE OUT
      FILE: N x D float64, row-major (its first N rows are read);
      METRIC: euclidean | cosine | pearson;
      DEVICE: cpu | gpu (GpuIndexFlat on GPU 0). A self search: each row
      asks for K + 1 neighbours and drops itself (or, where it is not among
      them, the last one). Writes OUT as N x K int32 0-based indices,
      row-major, and prints "faiss total <s> search <s>": total from the
      float64 host array to the indices on the host (conversion, index
      build, search), search alone.
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


def make_index(d, metric, device):
    flat = faiss.IndexFlatL2(d) if metric == "euclidean" else \
        faiss.IndexFlatIP(d)
    if device == "gpu":
        return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, flat)
    return flat


def drop_self(index, k):
    n = index.shape[0]
    own = index == np.arange(n)[:, None]
    drop = np.where(own.any(axis=1), own.argmax(axis=1), k)
    keep = np.ones(index.shape, dtype=bool)
    keep[np.arange(n), drop] = False
    return index[keep].reshape(n, k)


def main():
    path, n, d, k, metric, device, out = sys.argv[1:8]
    n, d, k = int(n), int(d), int(k)
    x = np.fromfile(path, dtype=np.float64, count=n * d).reshape(n, d)
    start = time.perf_counter()
    xf = prepare(x, metric)
    index = make_index(d, metric, device)
    index.add(xf)
    searched = time.perf_counter()
    _, found = index.search(xf, k + 1)
    end = time.perf_counter()
    drop_self(found, k).astype(np.int32).tofile(out)
    print(f"faiss total {end - start:.4f} search {end - searched:.4f}")


if __name__ == "__main__":
    main()
