# Seed files for fuzz_h5_open, in the layout the HDF5 store reads and writes (h5py's): argv[1] = output dir.
import sys

import h5py
import numpy as np

out = sys.argv[1]

with h5py.File(f"{out}/seed_all.h5", "w") as f:
    f["obs"] = np.arange(12, dtype=np.float32).reshape(4, 3)
    f["idx"] = np.array([1, -1, 2**40, 3], dtype=np.int64)
    f["flag"] = np.array([True, False, True, True])
    f["half"] = np.array([1.5, 65504], dtype=np.float16)
    f["c"] = np.array([1 + 2j, 3 - 4j], dtype=np.complex64)
    f["s"] = "a string!"
    for k, v in [("oi", 3), ("of", 2.5), ("ob", True), ("ol", [1, 2, 3]), ("ou", ["a", "bc"])]:
        a = np.array(v)
        f[k] = a.astype(h5py.opaque_dtype(a.dtype))
    g = f.create_group("sub")
    g["x"] = np.arange(4, dtype=np.int32)
    g.create_group("deeper")["y"] = np.zeros((4, 2), dtype=np.uint8)

with h5py.File(f"{out}/seed_chunked.h5", "w") as f:
    f.create_dataset("z", data=np.arange(64, dtype=np.int16).reshape(16, 4), chunks=(4, 4), compression="gzip", shuffle=True)
    f.create_dataset("empty", shape=(0, 3), dtype=np.float64)
    f["scalar"] = np.float64(7.25)

with h5py.File(f"{out}/seed_latest.h5", "w", libver="latest") as f:
    f["a"] = np.arange(5, dtype=np.int8)
    f.create_group("g")["b"] = np.array([False, True])
