#!/usr/bin/env python3
"""`zeroshard tokenize` against SentencePiece's own command-line encoder, then training on its shards.

Trains a tiny BPE SentencePiece model here (spm_train, Debian's `sentencepiece`) on the built-in
corpus, tokenizes part of it line by line with `zeroshard tokenize`, and checks the shard, read with
struct as llm.c's format says, holds exactly BOS + spm_encode's ids for each non-blank line. Sharded
output concatenates to the same tokens. The shards train (`data.format: "llmc"`, model.vocab_size =
the SentencePiece vocabulary), and a model whose vocabulary is too small is refused naming the file.
Exit 77 (skipped) without spm_train / spm_encode.

usage: tokenize_check.py ZEROSHARD CORPUS WORKDIR
"""
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys

VOCAB = 400


def read_shard(path):
    data = open(path, "rb").read()
    header = struct.unpack("<256i", data[:1024])
    assert header[0] == 20240520 and header[1] == 1, header[:3]
    n = header[2]
    assert len(data) == 1024 + 2 * n, (len(data), n)
    return list(struct.unpack("<%dH" % n, data[1024:]))


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    return p.returncode, p.stdout + p.stderr


def main():
    zeroshard, corpus, work = sys.argv[1:4]
    if not shutil.which("spm_train") or not shutil.which("spm_encode"):
        print("spm_train / spm_encode not found (Debian package sentencepiece): skipped")
        sys.exit(77)
    os.makedirs(work, exist_ok=True)
    w = lambda n: os.path.join(work, n)
    rc, out = run(["spm_train", "--input=" + corpus, "--model_prefix=" + w("tok"), "--vocab_size=%d" % VOCAB,
                   "--model_type=bpe", "--input_sentence_size=20000", "--max_sentence_length=20000",
                   "--minloglevel=2"])
    if rc != 0:
        sys.exit("spm_train failed:\n" + out)
    text = open(corpus, "rb").read()[:30000].decode("utf-8", "ignore")
    with open(w("part.txt"), "w") as f:
        f.write(text)

    rc, out = run([zeroshard, "tokenize", "--model", w("tok.model"), "--out", w("part.bin"), "--split", "line",
                   w("part.txt")])
    if rc != 0:
        sys.exit("tokenize failed:\n" + out)
    print(out.strip())
    got = read_shard(w("part.bin"))

    rc, out = run(["spm_encode", "--model=" + w("tok.model"), "--output_format=id"], input=None,
                  stdin=open(w("part.txt")))
    if rc != 0:
        sys.exit("spm_encode failed:\n" + out)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    encoded = out.split("\n")
    want = []
    for line, ids in zip(lines, encoded):
        if line.strip(" \t\r") == "":
            continue
        want.append(1)  # BOS, id 1 in SentencePiece's defaults
        want.extend(int(t) for t in ids.split())
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        sys.exit("shard differs from spm_encode at token %d of %d/%d: %s vs %s" %
                 (first, len(got), len(want), got[first:first + 8], want[first:first + 8]))
    print("shard = BOS + spm_encode ids for every non-blank line: %d tokens" % len(got))

    rc, out = run([zeroshard, "tokenize", "--model", w("tok.model"), "--out", w("sh.bin"), "--split", "line",
                   "--shard-tokens", "3000", w("part.txt")])
    shards = sorted(glob.glob(w("sh_*.bin")))
    joined = [t for s in shards for t in read_shard(s)]
    if rc != 0 or joined != got or len(shards) != (len(got) + 2999) // 3000:
        sys.exit("sharded output: %d shards, %d tokens\n%s" % (len(shards), len(joined), out))
    print("--shard-tokens 3000: %d shards, the same tokens" % len(shards))

    def train(name, vocab):
        cfg = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
               "model": {"n_layer": 1, "d_model": 32, "n_head": 2, "seq_len": 32, "vocab_size": vocab},
               "data": {"format": "llmc", "path": w("sh_*.bin")}, "train_steps": 3, "steps_per_print": 1}
        with open(w(name + ".json"), "w") as f:
            json.dump(cfg, f)
        return run([zeroshard, "train", "--config", w(name + ".json")])

    rc, out = train("fit", VOCAB)
    losses = re.findall(r"step \d+/3 \| loss ([0-9.]+)", out)
    if rc != 0 or len(losses) != 3:
        sys.exit("training on the shards failed:\n" + out)
    print("trained on the shards: losses " + " ".join(losses))
    rc, out = train("small", 300)
    if rc == 0 or "outside [0, model.vocab_size = 300)" not in out or "sh_00000" not in out:
        sys.exit("a vocabulary too small was not refused by name:\n" + out)
    print("model.vocab_size 300 refused naming the shard")


if __name__ == "__main__":
    main()
