"""The token window index in plain NumPy, for bench/token_index.sh: the same
algorithm as stoker::TokenWindows::Build (documents permuted, their token
counts summed in that order, windows visited in a permuted order; a window's
first document found by binary search), as Megatron's GPTDataset helpers do
it (a numpy permutation of documents, a cumulative sum, searchsorted).
Prints one JSON line per N, on the same document lengths as the C++ side.

    /usr/bin/python3 bench/token_index_numpy.py 1000000 10000000
"""

import json
import sys
import time

import numpy as np


def lengths(n, max_len=2047):
    # The C++ side's LCG, vectorised: x_{i+1} = a x_i + c mod 2^64.
    a, c = np.uint64(6364136223846793005), np.uint64(1442695040888963407)
    out = np.empty(n, dtype=np.uint32)
    x = np.uint64(12345)
    # Blocks of a jump-ahead would be faster; a loop over 2^16 strides is enough here.
    stride = 1 << 16
    xs = np.empty(stride, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(stride):
            x = x * a + c
            xs[i] = x
        a_s, c_s = np.uint64(1), np.uint64(0)
        for _ in range(stride):
            a_s, c_s = a_s * a, c_s * a + c
        for start in range(0, n, stride):
            m = min(stride, n - start)
            out[start:start + m] = 1 + ((xs[:m] >> np.uint64(33)) % np.uint64(max_len))
            xs = xs * a_s + c_s
    return out


def build(lens, L, shuffle, seed):
    # 32-bit document numbers while they fit (Megatron's doc_idx is int32):
    # at 10^9 documents the int64 permutation alone would be 8 GB.
    rng = np.random.default_rng(seed)
    index_type = np.uint32 if len(lens) < (1 << 32) else np.uint64
    order = np.arange(len(lens), dtype=index_type)
    if shuffle:
        rng.shuffle(order)
    prefix = np.zeros(len(lens) + 1, dtype=np.uint64)
    np.cumsum(lens[order], dtype=np.uint64, out=prefix[1:])
    total = int(prefix[-1])
    windows = (total - 1) // L if total > L else 0
    window_order = None
    if shuffle:
        window_order = np.arange(windows, dtype=np.uint32 if windows < (1 << 32) else np.uint64)
        rng.shuffle(window_order)
    return order, prefix, windows, window_order


def main():
    for n in map(int, sys.argv[1:]):
        lens = lengths(n)
        for shuffle in (False, True):
            t0 = time.perf_counter()
            order, prefix, windows, window_order = build(lens, 4096, shuffle, 1)
            built = time.perf_counter() - t0
            ks = (np.arange(20000, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(windows)
            t0 = time.perf_counter()
            for k in ks:
                k = window_order[k] if shuffle else k
                # np.uint64 keys: a Python int would make searchsorted cast the array.
                j = int(np.searchsorted(prefix, np.uint64(k) * np.uint64(4096), side="right")) - 1
                _ = order[j]
            lookup = (time.perf_counter() - t0) / len(ks)
            print(json.dumps({"what": "numpy build", "documents": n, "shuffle": shuffle,
                              "windows": windows, "build_s": round(built, 3),
                              "lookup_us": round(lookup * 1e6, 3)}), flush=True)


if __name__ == "__main__":
    main()
