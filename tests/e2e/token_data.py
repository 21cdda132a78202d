#!/usr/bin/env python3
"""`zeroshard train` on pre-tokenized data written here with struct, following each format's spec.

A text's bytes are its tokens (vocabulary 256), so the same bytes written as an llm.c shard (uint16
and uint32 forms) and as a Megatron indexed dataset of one document (uint16, int32) are one segment
of the same tokens: training on each must print exactly the losses of training on the text. Then a
Megatron dataset of many documents trains, and a corrupt shard is refused naming it.

usage: token_data.py ZEROSHARD CORPUS WORKDIR [MPIRUN NP]
"""
import json
import os
import re
import struct
import subprocess
import sys


def write_llmc(path, tokens, magic, version, fmt):
    with open(path, "wb") as f:
        header = [0] * 256
        header[0], header[1], header[2] = magic, version, len(tokens)
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%d%s" % (len(tokens), fmt), *tokens))


def write_megatron(prefix, docs, code, fmt):
    """docs: list of documents, each a list of sequences (lists of tokens)."""
    size = struct.calcsize(fmt)
    lengths, pointers, doc_idx, at = [], [], [0], 0
    with open(prefix + ".bin", "wb") as f:
        for doc in docs:
            for seq in doc:
                f.write(struct.pack("<%d%s" % (len(seq), fmt), *seq))
                lengths.append(len(seq))
                pointers.append(at)
                at += len(seq) * size
            doc_idx.append(len(lengths))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(struct.pack("<%di" % len(lengths), *lengths))
        f.write(struct.pack("<%dq" % len(pointers), *pointers))
        f.write(struct.pack("<%dq" % len(doc_idx), *doc_idx))


def train(cmd, workdir, name, data, expect_ok=True):
    cfg = {
        "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2},
        "model": {"n_layer": 1, "d_model": 32, "n_head": 2, "seq_len": 16},
        "data": data, "train_steps": 3, "steps_per_print": 1,
    }
    path = os.path.join(workdir, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    p = subprocess.run(cmd + ["train", "--config", path], capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    if (p.returncode == 0) != expect_ok:
        sys.exit("%s: exit %d\n%s" % (name, p.returncode, out))
    return out, re.findall(r"step \d+/3 \| loss ([0-9.]+)", out)


def main():
    zeroshard, corpus, workdir = sys.argv[1:4]
    cmd = [zeroshard]
    if len(sys.argv) > 5:
        cmd = [sys.argv[4], "-np", sys.argv[5], "--oversubscribe"] + cmd
    os.makedirs(workdir, exist_ok=True)
    text = open(corpus, "rb").read()[:20000]
    tokens = list(text)
    with open(os.path.join(workdir, "corpus.txt"), "wb") as f:
        f.write(text)
    w = lambda n: os.path.join(workdir, n)
    write_llmc(w("u16.bin"), tokens, 20240520, 1, "H")
    write_llmc(w("u32.bin"), tokens, 20240801, 7, "I")
    # One document of three sequences: its tokens are one run.
    write_megatron(w("meg16"), [[tokens[:5000], tokens[5000:12000], tokens[12000:]]], 8, "H")
    write_megatron(w("meg32"), [[tokens]], 4, "i")

    _, base = train(cmd, workdir, "text", {"path": w("corpus.txt")})
    if len(base) != 3:
        sys.exit("text run printed %d losses" % len(base))
    for name, data in [("llmc16", {"format": "llmc", "path": w("u16.bin")}),
                       ("llmc32", {"format": "llmc", "path": w("u32.bin")}),
                       ("megatron16", {"format": "megatron", "path": w("meg16")}),
                       ("megatron32", {"format": "megatron", "path": w("meg32") + ".idx"})]:
        out, losses = train(cmd, workdir, name, data)
        if losses != base:
            sys.exit("%s: losses %s, the text gives %s\n%s" % (name, losses, base, out))
        print("%s: losses %s equal the text's" % (name, " ".join(losses)))

    # Many documents (split at newlines), some too short for a window.
    docs, start = [], 0
    for i, b in enumerate(tokens):
        if b == 10:
            docs.append([tokens[start:i + 1]])
            start = i + 1
    write_megatron(w("docs"), docs, 8, "H")
    out, losses = train(cmd, workdir, "docs", {"format": "megatron", "path": w("docs")})
    if len(losses) != 3 or "document(s)" not in out:
        sys.exit("docs: %s" % out)
    print("megatron, %d documents: losses %s" % (len(docs), " ".join(losses)))

    # A truncated shard, and a vocabulary too small for the tokens.
    with open(w("cut.bin"), "wb") as f:
        f.write(open(w("u16.bin"), "rb").read()[:-7])
    out, _ = train(cmd, workdir, "cut", {"format": "llmc", "path": w("cut.bin")}, expect_ok=False)
    if "data file '%s'" % w("cut.bin") not in out or "(truncated)" not in out:
        sys.exit("cut: %s" % out)
    print("truncated shard refused by name")


if __name__ == "__main__":
    main()
