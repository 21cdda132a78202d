"""Stock h5py (Debian's python3-h5py) reads a zstd shard file, through our filter plugin
(HDF5_PLUGIN_PATH, set by ctest), and a consolidated file; with python3-hdf5plugin importable too,
the same holds after `import hdf5plugin` (which must not get in the way). The per-block XXH3
checksums beside the data are checked against python3-xxhash when it is installed. Exit 77 (ctest:
skipped) when h5py is missing.

usage: h5py_check.py ZEROSHARD FIXTURE WORKDIR
"""
import json
import os
import subprocess
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"skipped: {e} (apt-get install python3-h5py)")
    sys.exit(77)
try:
    import hdf5plugin  # noqa: F401  pip's bundles a Zstd filter (id 32015); Debian's uses system plugins
except ImportError:
    pass
try:
    import xxhash
except ImportError:
    xxhash = None

zeroshard, fixture, work = sys.argv[1:4]
root = os.path.join(work, "ckpt")
subprocess.run(["rm", "-rf", root], check=True)
subprocess.run([fixture, root], check=True)
out = os.path.join(work, "full.h5")
if os.path.exists(out):
    os.remove(out)
subprocess.run([zeroshard, "checkpoint", "consolidate", root, out], check=True)


def value(t, e, b):  # tests/checkpoint/synthetic.h, synthetic_value
    return np.float32(t) * 100 + (e % 4096).astype(np.float32) * np.float32(0.25) + np.float32(b * 0.125) - 50


tag = open(os.path.join(root, "latest")).read().strip()
with h5py.File(os.path.join(root, tag, "zs_metadata.h5"), "r") as meta:
    layout = json.loads(bytes(meta["layout_json"][()]).decode())
    assert meta.attrs["format_version"] in (1, 2)
    assert meta["scalars"].attrs["global_step"] == 5
names = [t["name"] for t in layout["tensors"]]

with h5py.File(os.path.join(root, tag, "zs_rank_00001.h5"), "r") as shard:
    data = shard["buffers/fp32/data"]
    assert list(data._filters) == ["32015"] and not data.fletcher32, data._filters  # zstd only
    values = data[...]
    # Note [Checksum blocks]: XXH3-64 of each block of the stored elements, beside the data.
    assert shard["buffers/fp32"].attrs["checksum"] == b"xxh3-64" or shard["buffers/fp32"].attrs["checksum"] == "xxh3-64"
    sums = shard["buffers/fp32/checksums"]
    block = int(sums.attrs["block_elements"])
    assert sums.shape == ((len(values) + block - 1) // block, 1), (sums.shape, block)
    if xxhash is not None:
        raw = values.astype("<f4").tobytes()
        for i, (s,) in enumerate(sums[...]):
            assert xxhash.xxh3_64_intdigest(raw[i * block * 4:(i + 1) * block * 4]) == int(s), i
    rows = shard["buffers/fp32/index"][...]
    checked = 0
    for tensor, begin, count, offset in rows:
        e = np.arange(begin, begin + count, dtype=np.int64)
        np.testing.assert_array_equal(values[offset:offset + count], value(int(tensor), e, 1))
        checked += count
    assert checked == len(values) > 0

with h5py.File(out, "r") as full:
    for t, spec in enumerate(layout["tensors"]):
        arr = full[spec["name"]][()]
        assert list(np.shape(arr)) == spec["shape"], (spec, np.shape(arr))
        flat = np.asarray(arr, dtype=np.float32).reshape(-1)
        np.testing.assert_array_equal(flat, value(t, np.arange(flat.size, dtype=np.int64), 1))
print(f"h5py read a zstd shard and the consolidated file: {len(names)} tensors ok")
