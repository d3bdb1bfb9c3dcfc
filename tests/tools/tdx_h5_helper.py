"""HDF5 files for tests/tools/run_tdx_tests.cmake, written with h5py (Debian python3-h5py).

  tdx_h5_helper.py escape FILE            a dataset whose name holds an ANSI escape ("\\x1b[31mred") and "ok"
  tdx_h5_helper.py huge FILE              a chunked float32 dataset declaring 16 TiB, nothing written (sparse)
  tdx_h5_helper.py hold FILE READY STOP   opens FILE "r+" (HDF5's writer lock), writes obs[0] = 7, creates READY,
                                          waits (at most 60 s) until STOP exists, closes
  tdx_h5_helper.py row FILE KEY           prints FILE[KEY][0] as a list
  tdx_h5_helper.py one132 FILE            one float32 dataset "x" of shape [1, 3, 2] holding 0..5 (batch [1, 3, 2])
"""
import os
import sys
import time

import h5py
import numpy as np


def main(argv):
    cmd, path = argv[1], argv[2]
    if cmd == "escape":
        with h5py.File(path, "w") as f:
            f.create_dataset("\x1b[31mred", data=np.arange(3, dtype=np.float32))
            f.create_dataset("ok", data=np.arange(3, dtype=np.int64))
    elif cmd == "huge":
        with h5py.File(path, "w") as f:
            f.create_dataset("x", shape=(2**32, 1024), dtype="f4", chunks=(1, 1024))
    elif cmd == "hold":
        ready, stop = argv[3], argv[4]
        f = h5py.File(path, "r+")
        f["obs"][0] = np.full(f["obs"].shape[1:], 7, dtype=f["obs"].dtype)
        f.flush()
        open(ready, "w").close()
        for _ in range(600):
            if os.path.exists(stop):
                break
            time.sleep(0.1)
        f.close()
    elif cmd == "one132":
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=np.arange(6, dtype=np.float32).reshape(1, 3, 2))
    elif cmd == "row":
        with h5py.File(path, "r") as f:
            print(f[argv[3]][0].tolist())
    else:
        raise SystemExit("unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)
