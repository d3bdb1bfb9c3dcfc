"""A Python rank for api.distributed's interop test: plain torch.distributed (Debian's python3-torch, gloo), no
tensordict package. It speaks upstream tensordict v0.14.0's protocol by hand:
  - send / recv: tensor leaves in sorted key order, depth first, leaf i with tag init_tag + i, or the
    pseudo_rand chain of tensordict.utils.int_generator (numpy's default_rng);
  - init_remote / from_remote_init: the consolidated metadata dict by send_object_list (a pickle), then the
    uint8 storage (tag 0), leaves in insertion order, each padded with zeros to 8 bytes.

When the real tensordict package imports (by hand, with the peer: PYTHONPATH from shared/peer/setup_peer.sh), the
leaf-by-leaf exchanges go through upstream's own TensorDict.recv / TensorDict.send instead (init_remote needs
torch 2's send_object_list, so those steps stay by hand); the last line says which ran.

usage: dist_python_rank.py PORT       (rank 1 of 2; the C++ rank 0 serves the TCPStore on 127.0.0.1:PORT)
Exits 0 when every exchange matched; prints what differed otherwise.
"""
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

try:
    from tensordict import TensorDict
    import tensordict as _td

    UPSTREAM = str(getattr(_td, "__version__", None) or "(source tree)")
except Exception:  # Debian's python3-torch alone (CI)
    TensorDict = None
    UPSTREAM = None


def int_generator(seed):
    # tensordict.utils.int_generator (v0.14.0)
    rng = np.random.default_rng(seed)
    return int.from_bytes(rng.bytes(8), "big") % 10_000


def sample(v):
    """The C++ test's sample(v) as nested dicts, insertion order kept (non-tensor 'label' left out)."""
    return {
        "b": torch.full((3, 4), v, dtype=torch.float32),
        "a": torch.full((3,), v, dtype=torch.float64),
        "inner": {
            "z": torch.full((3, 2), v, dtype=torch.int64),
            "h": torch.full((3,), v, dtype=torch.float16),
            "bf": torch.full((3, 1), v, dtype=torch.bfloat16),
            "i8": torch.full((3,), v, dtype=torch.int8),
            "u8": torch.full((3,), v, dtype=torch.uint8),
            "i16": torch.full((3,), v, dtype=torch.int16),
            "i32": torch.full((3, 5), v, dtype=torch.int32),
            "flag": torch.full((3,), int(v) % 2 == 1, dtype=torch.bool),
            "c64": torch.full((3,), v, dtype=torch.complex64),
            "deeper": {"x": torch.full((3, 2, 2), v, dtype=torch.float32)},
        },
        "_under": torch.full((3,), v, dtype=torch.float32),
    }


def sorted_leaves(d, prefix=""):
    for k in sorted(d):
        if isinstance(d[k], dict):
            yield from sorted_leaves(d[k], prefix + k + ".")
        else:
            yield prefix + k, d[k]


def insertion_leaves(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from insertion_leaves(v, prefix + k + ".")
        else:
            yield prefix + k, v


def tags(n, init_tag, pseudo_rand):
    tag = init_tag - 1
    for _ in range(n):
        tag = int_generator(tag + 1) if pseudo_rand else tag + 1
        yield tag


def send_object_list(objs, dst):
    # torch >= 2's dist.send_object_list (what upstream's init_remote calls), on torch 1.13's helpers: the sizes
    # (int64), then the concatenated pickles (uint8), both with tag 0
    from torch.distributed.distributed_c10d import _object_to_tensor
    tensors, sizes = zip(*[_object_to_tensor(o, torch.device("cpu")) for o in objs])
    dist.send(torch.cat(sizes), dst=dst)
    dist.send(torch.cat(tensors), dst=dst)


def recv_object_list(objs, src):
    from torch.distributed.distributed_c10d import _tensor_to_object
    sizes = torch.empty(len(objs), dtype=torch.long)
    dist.recv(sizes, src=src)
    body = torch.empty(int(sizes.sum().item()), dtype=torch.uint8)
    dist.recv(body, src=src)
    offset = 0
    for i, n in enumerate(sizes.tolist()):
        objs[i] = _tensor_to_object(body[offset:offset + n], n)
        offset += n


failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def recv_td(src, v_expected, init_tag, pseudo_rand):
    if UPSTREAM:
        td = TensorDict(dict(sample(0), label="py"), batch_size=[3])
        td.recv(src=src, init_tag=init_tag, pseudo_rand=pseudo_rand)
        for key, want in sorted_leaves(sample(v_expected)):
            got = td[tuple(key.split("."))]
            check(torch.equal(got, want), f"upstream recv: leaf {key} is {got.flatten()[:4]} not {v_expected}")
        return
    into = sample(0)
    leaves = list(sorted_leaves(into))
    for (key, t), tag in zip(leaves, tags(len(leaves), init_tag, pseudo_rand)):
        dist.recv(t, src=src, tag=tag)
        want = sample(v_expected)
        for k in key.split("."):
            want = want[k]
        check(torch.equal(t, want), f"recv: leaf {key} (tag {tag}) is {t.flatten()[:4]} not {v_expected}")


def send_td(dst, v, init_tag, pseudo_rand):
    if UPSTREAM:
        TensorDict(dict(sample(v), label="py"), batch_size=[3]).send(dst=dst, init_tag=init_tag, pseudo_rand=pseudo_rand)
        return
    leaves = list(sorted_leaves(sample(v)))
    for (key, t), tag in zip(leaves, tags(len(leaves), init_tag, pseudo_rand)):
        dist.send(t, dst=dst, tag=tag)


def consolidated(d, batch_size):
    """upstream's consolidate of a plain nested dict: (storage, metadata)."""
    chunks, offset = [], 0

    def record(level):
        nonlocal offset
        rec = {"cls": "TensorDict", "non_tensors": {}, "leaves": {},
               "cls_metadata": {"device": None, "names": [None] * len(batch_size),
                                "batch_size": list(batch_size), "is_locked": False}}
        for k, v in level.items():
            if isinstance(v, dict):
                rec[k] = record(v)
            elif isinstance(v, str):
                rec["non_tensors"][k] = (v, list(batch_size), None)
            else:
                raw = v.contiguous().reshape(-1).view(torch.uint8)
                n = raw.numel()
                pad = (8 - n % 8) % 8
                chunks.append(torch.cat([raw, torch.zeros(pad, dtype=torch.uint8)]))
                rec["leaves"][k] = (str(v.dtype), list(v.shape), offset, offset + n + pad, pad)
                offset += n + pad
        return rec

    md = record(d)
    return torch.cat(chunks), md


def leaf_of(storage, spec):
    dtype, shape, start, stop, pad = spec
    dt = getattr(torch, dtype.split(".")[1])
    t = storage[start:stop]
    if pad:
        t = t[: stop - start - pad]
    return t.view(dt).view(shape)


def main():
    port = int(sys.argv[1])
    store = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=1, world_size=2, timeout=timedelta(seconds=60))
    # 1. C++ send -> Python recv (init_tag 0), then pseudo_rand tags from init_tag 3
    recv_td(0, 1.0, 0, False)
    recv_td(0, 2.0, 3, True)
    # 2. Python send -> C++ recv, both tag schemes
    send_td(0, 5.0, 0, False)
    send_td(0, 6.0, 11, True)
    # 3. C++ init_remote (pickled metadata) -> Python from_remote_init by hand
    objs = [None]
    recv_object_list(objs, src=0)
    md = objs[0]
    total = md.pop("_total_bytes")
    md.pop("_storage_device", None)
    storage = torch.empty(total, dtype=torch.uint8)
    dist.recv(storage, src=0)
    ref_storage, ref_md = consolidated(dict(sample(7.0), label="hello"), [3])
    check(torch.equal(storage, ref_storage), "init_remote: the storage bytes differ from upstream's layout")
    check(md["non_tensors"].get("label", [None])[0] == "hello", f"init_remote: label is {md['non_tensors']}")
    want = sample(7.0)
    for key, _ in insertion_leaves(want):
        level, spec = md, None
        parts = key.split(".")
        for p in parts[:-1]:
            level = level[p]
        spec = level["leaves"][parts[-1]]
        w = want
        for p in parts:
            w = w[p]
        check(torch.equal(leaf_of(storage, spec), w), f"init_remote: leaf {key}")
    # 4. Python init_remote (send_object_list of the pickled record, then the storage) -> C++ from_remote_init
    st, md2 = consolidated(dict(sample(9.0), label="from python"), [3])
    md2["_total_bytes"] = st.numel()
    send_object_list([md2], dst=0)
    dist.send(st, dst=0)
    # 5. a consolidated send of new values into C++'s rebuilt TensorDict (one message, tag 0)
    st2, _ = consolidated(dict(sample(4.0), label="from python"), [3])
    dist.send(st2, dst=0)
    dist.barrier()
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    how = f"upstream tensordict {UPSTREAM}'s send / recv" if UPSTREAM else "torch.distributed by hand"
    print(f"python rank ({how}): every exchange matched")


if __name__ == "__main__":
    main()
