#!/usr/bin/python3
"""Hugging Face weights in and out of `zeroshard train` (issue 34), against PyTorch.

For GPT-2 and LLaMA (GQA), random weights under Hugging Face's names and layouts are written here as
safetensors by a small writer that follows the format's spec (struct + json; LLaMA as two shards with
model.safetensors.index.json, GPT-2 with the buffers and tied lm_head.weight old files carry). The
loss PyTorch computes on them (tests/nn/torch_reference.py's independent GPT-2 and LLaMA) must be
zeroshard's first-step loss from `--init-from` within 1e-5 relative, at np 1 stage 0, np 2 stage 3
and (GPT-2) np 2 at tensor-parallel size 2: every rank read only its shard. The data are an llm.c
shard of seq_len + 1 tokens, so every sample is the same sequence. A run with lr 0 saves a
checkpoint; `zeroshard checkpoint export --format safetensors` gives back exactly the tensors that
went in (read here with struct), and PyTorch's loss on them is the same. The byte-level GPT exports
under our own names and starts a run from them with the same loss. Mismatches are refused by name.

    hf_weights_check.py ZEROSHARD MPIRUN WORKDIR     exit 0 ok, 1 failed, 77 skipped (no torch)
"""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nn"))
try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed for this interpreter (Debian: apt-get install python3-torch)")
    sys.exit(77)
import torch_reference as ref  # noqa: E402

LOSS_RTOL = 1e-5


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, float32 torch tensor)."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors:
        n = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, t in tensors:
            f.write(t.detach().contiguous().numpy().astype("<f4").tobytes())


def read_safetensors_dir(d):
    """name -> (dtype, shape, list of floats) for model.safetensors or the index's shards."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for fn in files:
        data = open(os.path.join(d, fn), "rb").read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        base = 8 + n
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, end = e["data_offsets"]
            assert e["dtype"] == "F32", e
            out[name] = (e["shape"], torch.tensor(struct.unpack("<%df" % ((end - b) // 4), data[base + b:base + end])))
    return out


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if (p.returncode == 0) != expect_ok:
        print("FAIL: %s exited %d\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
        sys.exit(1)
    return p.stdout + p.stderr


def first_loss(zeroshard, mpirun, work, name, model, data, np=1, stage=0, extra=(), lr=1e-3):
    cfg = {"train_batch_size": 2 * np, "train_micro_batch_size_per_gpu": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}},
           "zero_optimization": {"stage": stage}, "model": model,
           "data": {"format": "llmc", "path": data}, "train_steps": 1}
    if model.get("tensor_parallel_size", 1) > 1:
        cfg["train_batch_size"] = 2 * np // model["tensor_parallel_size"]
    path = os.path.join(work, name + ".json")
    json.dump(cfg, open(path, "w"))
    summary = os.path.join(work, name + ".summary.json")
    cmd = [zeroshard, "train", "--config", path, "--summary", summary] + list(extra)
    if np > 1:
        cmd = [mpirun, "--oversubscribe", "-np", str(np)] + cmd
    run(cmd)
    return json.load(open(summary))["loss_history"][0]


def write_llmc(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, len(tokens)] + [0] * 253)))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def main():
    zeroshard, mpirun, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    ok = True
    cases = [
        ("gpt2", {"type": "gpt2", "n_layer": 2, "d_model": 32, "n_head": 4, "max_seq_len": 16, "vocab_size": 300}),
        ("llama", {"type": "llama", "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2, "d_ff": 56,
                   "max_seq_len": 16, "vocab_size": 300, "norm_eps": 1e-6}),
    ]
    for name, section in cases:
        gen = torch.Generator().manual_seed(7)
        cfg = {k: v for k, v in section.items() if k != "type"}
        params = (ref.gpt2_params if name == "gpt2" else ref.llama_params)(cfg, gen)
        T = cfg["max_seq_len"]
        tokens = torch.randint(0, cfg["vocab_size"], (T + 1,), generator=gen)
        inputs, targets = tokens[:T].view(1, T), tokens[1:].view(1, T)
        loss_fn = ref.gpt2_loss if name == "gpt2" else ref.llama_loss
        with torch.no_grad():
            want = loss_fn(params, cfg, inputs, targets).item()
        data = os.path.join(work, name + "_tokens.bin")
        write_llmc(data, tokens.tolist())
        d = os.path.join(work, name + "_hf")
        os.makedirs(d, exist_ok=True)
        items = sorted(params.items())
        if name == "gpt2":  # the buffers and the tied head older GPT-2 files carry
            extra = [("transformer.h.0.attn.bias", torch.ones(1, 1, T, T)), ("lm_head.weight", params["transformer.wte.weight"])]
            write_safetensors(os.path.join(d, "model.safetensors"), items + extra, {"format": "pt"})
        else:  # two shards and the index
            half = len(items) // 2
            wm = {}
            for k, part in enumerate([items[:half], items[half:]]):
                fn = "model-%05d-of-00002.safetensors" % (k + 1)
                write_safetensors(os.path.join(d, fn), part)
                wm.update({n: fn for n, _ in part})
            json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
        runs = [("np1_stage0", dict(section), 1, 0), ("np2_stage3", dict(section), 2, 3)]
        if name == "gpt2":
            runs.append(("np2_tp2", dict(section, tensor_parallel_size=2), 2, 1))
        for tag, model, np, stage in runs:
            got = first_loss(zeroshard, mpirun, work, f"{name}_{tag}", model, data, np, stage, ["--init-from", d])
            rel = abs(got - want) / abs(want)
            print(f"{name} {tag}: --init-from loss {got:.9g}, PyTorch {want:.9g} (relative {rel:.1e})")
            ok &= rel <= LOSS_RTOL

        # lr 0: the saved weights are the ones that went in; export them and compare exactly.
        ck, out = os.path.join(work, name + "_ckpt"), os.path.join(work, name + "_export")
        first_loss(zeroshard, mpirun, work, f"{name}_save", dict(section), data, 2, 3, ["--init-from", d, "--save", ck], lr=0.0)
        print(run([zeroshard, "checkpoint", "export", ck, out, "--format", "safetensors", "--max-shard-bytes", "20000"]).strip())
        back = read_safetensors_dir(out)
        if sorted(back) != sorted(params):
            print(f"FAIL: {name}: exported names {sorted(set(back) ^ set(params))} differ from the input's")
            ok = False
        exported = {}
        for n, t in params.items():
            shape, values = back[n]
            exported[n] = values.view(shape)
            if list(t.shape) != shape or not torch.equal(values.view(shape), t.detach()):
                print(f"FAIL: {name}: exported {n} differs from the tensor that went in")
                ok = False
        hf_config = json.load(open(os.path.join(out, "config.json")))
        with torch.no_grad():
            again = loss_fn(exported, cfg, inputs, targets).item()
        print(f"{name}: export has {len(back)} tensors equal to the input (config.json model_type "
              f"{hf_config['model_type']}); PyTorch's loss on them {again:.9g}")
        ok &= again == want and hf_config["model_type"] == name

    # A mismatch is refused by name: GPT-2's weights for a model one layer deeper.
    out = run([zeroshard, "train", "--config", os.path.join(work, "gpt2_np1_stage0.json"), "--init-from",
               os.path.join(work, "llama_hf")], expect_ok=False)
    if "tensor 'transformer.wte.weight' (zeroshard's wte [300, 32]) is missing" not in out:
        print("FAIL: LLaMA weights for a GPT-2 model were not refused by name:\n" + out)
        ok = False

    # The byte-level GPT: our own names out and in.
    gpt = {"n_layer": 1, "d_model": 32, "n_head": 2, "seq_len": 16}
    text = os.path.join(work, "bytes.bin")
    write_llmc(text, list(range(40, 57)))
    ck, out = os.path.join(work, "gpt_ckpt"), os.path.join(work, "gpt_export")
    a = first_loss(zeroshard, mpirun, work, "gpt_save", gpt, text, 1, 0, ["--save", ck], lr=0.0)
    run([zeroshard, "checkpoint", "export", ck, out, "--format", "safetensors"])
    b = first_loss(zeroshard, mpirun, work, "gpt_import", dict(gpt, init_std=0.5), text, 2, 3, ["--init-from", out])
    print(f"byte-level GPT: loss {a:.9g}, from its export (zeroshard names, another init_std, np 2 stage 3) {b:.9g}")
    ok &= abs(a - b) <= LOSS_RTOL * abs(a)
    print("hf weights: " + ("all agree" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
