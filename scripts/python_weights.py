#!/usr/bin/env python3
"""Weights between Python tensordict and tensordict-cpp (issue 36), run with the peer (shared/peer/README.md).

  python_weights.py write DIR   writes what tests/data/python_weights holds: TensorDict.from_module of
                                nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)) (seed 0) memmapped to
                                DIR/params, an input and the model's output to DIR/io
  python_weights.py check DIR   loads DIR/params (written by C++: engine.module/weights_for_python writes
                                build/test-tmp/cpp_weights) into the same Python model with to_module and checks
                                its output on DIR/io's input against DIR/io's output
"""
import sys

import torch
from torch import nn
from tensordict import TensorDict


def model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def main():
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "write":
        torch.manual_seed(0)
        m = model()
        TensorDict.from_module(m).memmap(out + "/params")
        x = torch.randn(3, 4)
        with torch.no_grad():
            TensorDict({"x": x, "y": m(x)}, batch_size=[3]).memmap(out + "/io")
        print("written", out)
        return 0
    m = model()
    params = TensorDict.load_memmap(out + "/params")
    assert sorted(params.keys()) == ["0", "2"], list(params.keys())
    # inplace: on the peer (torch 1.13) a swap wraps each MemoryMappedTensor in an nn.Parameter, which that torch
    # refuses for Python's own saves too ("detach() returns an instance of the same type")
    params.to_module(m, inplace=True)
    io = TensorDict.load_memmap(out + "/io")
    with torch.no_grad():
        ok = torch.allclose(m(io["x"]), io["y"], atol=1e-6)
    print("python loads the C++ weights:", "same output" if ok else "DIFFERENT output")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
