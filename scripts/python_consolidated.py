"""Consolidated files between Python tensordict and tensordict-cpp (run with the peer: shared/peer/setup_peer.sh).

  python_consolidated.py write FILE   writes tests/data/python_consolidated.bin's TensorDict with consolidate(filename=)
  python_consolidated.py check FILE   reads a file tensordict-cpp wrote (engine.consolidate's cpp_consolidated.bin)
                                      with TensorDict.from_consolidated and checks its values
"""
import sys

import torch
from tensordict import TensorDict


def sample():
    return TensorDict({"a": torch.arange(3, dtype=torch.float32), "label": "hello",
                       "c": torch.arange(6, dtype=torch.float32).reshape(3, 2),
                       "nested": {"h": torch.arange(3, dtype=torch.float16),
                                  "i": torch.arange(3, dtype=torch.int64).reshape(3, 1),
                                  "b": torch.tensor([True, False, True])}}, batch_size=[3])


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "write":
        sample().consolidate(filename=path)
        print("wrote", path)
        return
    td = TensorDict.from_consolidated(path)
    want = sample()
    for key in want.keys(include_nested=True, leaves_only=True):
        assert (td[key] == want[key]).all(), key
    assert td["label"] == "hello", td["label"]
    assert td.batch_size == torch.Size([3])
    print("python read", path, "OK:", sorted(td.keys(include_nested=True, leaves_only=True), key=str))


if __name__ == "__main__":
    main()
