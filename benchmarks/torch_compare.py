#!/usr/bin/python3
"""Question: is zeroshard's training step (GPT, LLaMA) faster than PyTorch's on the same model and batch?

Runs benchmarks/train_bench (zeroshard) and the same GPT in PyTorch (Debian's python3-torch: an
optional benchmark dependency, `bash scripts/install-deps.sh --bench`; never needed by `make test`),
fp32 and bf16, in one process or in two (--procs 2: `mpirun -np 2 train_bench` against two PyTorch
processes in a DDP gloo group, the same global batch split over them), and prints a markdown table
of tokens/s with the ratio.

  /usr/bin/python3 benchmarks/torch_compare.py [--bench build/release/benchmarks/train_bench]
      [--cases small,large] [--precisions fp32,bf16] [--procs 1,2] [--reps 5] [--steps 5] [--warmup 2]
      [--threads N] [--torch-bf16 autocast|params] [--omp-wait passive|default]
      [--json out.json] [--markdown out.md]

The same GPT: GPT-2 pre-LN blocks (LayerNorm eps 1e-5, causal attention, tanh GELU, 4x MLP), learned
position embeddings, tied output head, byte vocabulary 256; init normal(0, 0.02), the residual
projections 0.02 / sqrt(2 n_layer), biases 0, LayerNorm weights 1 (nn/gpt.h). AdamW lr 1e-3, no
weight decay, no clipping, as train_bench's engine config. Cases (the issue's table; the micro batch
is the global one: with --procs N each process takes micro batch / N sequences and threads / N threads):
  small  n_layer 4, d_model 256, n_head 4, seq 128, micro batch 8
  large  n_layer 6, d_model 512, n_head 8, seq 256, micro batch 8
  llama  LLaMA (nn/llama.h): n_layer 12, d_model 768, n_head 12 (n_kv_head 12), d_ff 2048, vocab 32000,
         seq 1024, micro batch 2 (one sequence per process at --procs 2): llama2.c's 110M shape with an
         untied head, 134,105,856 parameters; not in the default --cases (a step takes tens of seconds).
         PyTorch runs tests/nn/torch_reference.py's plain-torch LLaMA (Hugging Face's LlamaForCausalLM
         equations and names: eager attention with the T x T scores, as PyTorch 1.13 has no fused
         attention), its weights normal(0, 0.02) and RMSNorm weights near one; zeroshard trains on the
         built-in byte corpus (token ids < 256 of the 32000), PyTorch on random ids: the same work.
Precision bf16: zeroshard keeps bf16 parameters and gradients with fp32 master weights; PyTorch runs
either autocast(cpu, bf16) over fp32 parameters (default: PyTorch's mixed-precision recipe) or bf16
parameters and AdamW on them (--torch-bf16 params).

MFU: zeroshard's is train_bench's (the kernels' FLOPs, causal attention panels only, over the probed
peak of the run's compute dtype); PyTorch's credits it the same FLOPs per token over the same peak, so
the two MFUs stand in the ratio of the tokens/s.

Method (a shared, noisy machine): every repetition runs each (case, precision) for both frameworks
back to back in a fresh process, alternating which goes first; a run reports its median step time
over --steps after --warmup steps. The table shows medians over --reps repetitions and the ratio of
medians (zeroshard / PyTorch tokens/s; > 1: zeroshard faster). Both use the same thread count
(--threads, default all cores). PyTorch's OpenMP threads spin after each parallel region by default,
which on a loaded machine takes cores from everyone; OMP_WAIT_POLICY=PASSIVE (the default here,
--omp-wait default to keep PyTorch's) measured 2.5x faster for PyTorch under load (issue 17).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = {
    "small": dict(model="gpt", n_layer=4, d_model=256, n_head=4, seq_len=128, micro_batch=8, vocab=256),
    "large": dict(model="gpt", n_layer=6, d_model=512, n_head=8, seq_len=256, micro_batch=8, vocab=256),
    # memory_mb: train_bench's arena per rank (parameters, fp32 gradients and Adam states: 16 bytes each,
    # 2.1 GB, plus activations).
    "llama": dict(model="llama", n_layer=12, d_model=768, n_head=12, n_kv_head=12, d_ff=2048, seq_len=1024,
                  micro_batch=2, vocab=32000, memory_mb=6144),
}
TESTS_NN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "nn")


def torch_llama(case, seed):
    """tests/nn/torch_reference.py's LLaMA as a module (DDP needs one): its parameters under Hugging
    Face's names, init_std 0.02 (the reference draws 0.2 for its gradient check)."""
    import torch
    import torch.nn as nn
    sys.path.insert(0, TESTS_NN)
    import torch_reference as ref  # noqa: E402  (sets one thread at import; torch_run sets its own after)
    cfg = dict(vocab_size=case["vocab"], d_model=case["d_model"], n_layer=case["n_layer"], n_head=case["n_head"],
               n_kv_head=case["n_kv_head"], d_ff=case["d_ff"], max_seq_len=case["seq_len"])
    params = ref.llama_params(cfg, torch.Generator().manual_seed(seed))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.names = list(params)
            self.weights = nn.ParameterList(nn.Parameter(t.detach() if t.dim() == 1 else t.detach() * 0.1)
                                            for t in params.values())

        def forward(self, idx, targets):
            return ref.llama_loss(dict(zip(self.names, self.weights)), cfg, idx, targets)

    return Llama()


def torch_run(case, precision, steps, warmup, threads, bf16_mode, rank=0, world=1, port=0, seed=7):
    """Trains the GPT in this process (rank `rank` of a DDP gloo group of `world` when world > 1, each
    rank micro_batch / world samples); returns tokens/s over all ranks of the median step."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    L, C, H, T, B = case["n_layer"], case["d_model"], case["n_head"], case["seq_len"], case["micro_batch"] // world
    VOCAB = case["vocab"]
    llama = torch_llama(case, seed) if case["model"] == "llama" else None
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    std, proj_std = 0.02, 0.02 / math.sqrt(2 * L)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C, eps=1e-5), nn.LayerNorm(C, eps=1e-5)
            self.qkv, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            for lin, s in ((self.qkv, std), (self.attn_proj, proj_std), (self.fc, std), (self.mlp_proj, proj_std)):
                nn.init.normal_(lin.weight, 0.0, s)
                nn.init.zeros_(lin.bias)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, H, C // H).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, C)
            x = x + self.attn_proj(y)
            return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, C), nn.Embedding(T, C)
            nn.init.normal_(self.wte.weight, 0.0, std)
            nn.init.normal_(self.wpe.weight, 0.0, std)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C, eps=1e-5)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
            return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))

    model = llama or Gpt()
    if precision == "bf16" and bf16_mode == "params":
        model = model.to(torch.bfloat16)
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)  # gradients averaged over the ranks in backward
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed + rank)
    autocast = precision == "bf16" and bf16_mode == "autocast"
    times = []
    for i in range(warmup + steps):
        data = torch.randint(0, VOCAB, (B, T + 1), generator=gen)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if world > 1:
        # A step's time is the slowest rank's (as train_bench's): DDP's allreduce keeps them in step.
        import torch.distributed as dist
        t = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.destroy_process_group()
        return B * world * T / t.item()
    return B * T / statistics.median(times)


def zs_run(bench, case, precision, steps, warmup, procs):
    """train_bench's result (tokens_per_s of all ranks, mfu, ...); procs > 1: under mpirun, micro_batch /
    procs samples per rank."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        mpi = []
        if procs > 1:
            mpi = ["mpirun", "--oversubscribe", "-np", str(procs)]
            if os.geteuid() == 0:
                mpi += ["--allow-run-as-root"]
        cmd = mpi + [bench, "--n-layer", str(case["n_layer"]), "--d-model", str(case["d_model"]), "--n-head",
                     str(case["n_head"]), "--seq-len", str(case["seq_len"]),
                     "--micro-batch", str(case["micro_batch"] // procs),
                     "--vocab", str(case["vocab"]), "--steps", str(steps), "--warmup", str(warmup),
                     "--precision", precision, "--no-ceiling", "--json", out.name]
        if case["model"] == "llama":
            cmd += ["--model", "llama", "--n-kv-head", str(case["n_kv_head"]), "--d-ff", str(case["d_ff"])]
        if "memory_mb" in case:
            cmd += ["--memory-mb", str(case["memory_mb"])]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.load(open(out.name))["results"][0]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_subprocess(args, case_name, precision, env, procs):
    """PyTorch in fresh processes: one, or `procs` DDP ranks of threads / procs threads each (as mpirun
    gives each zeroshard rank cores / ranks threads)."""
    port = free_port()
    cmds = [[sys.executable, os.path.abspath(__file__), "--torch-worker", case_name, precision, "--steps",
             str(args.steps), "--warmup", str(args.warmup), "--threads", str(max(1, args.threads // procs)),
             "--torch-bf16", args.torch_bf16, "--torch-rank", str(r), str(procs), str(port)] for r in range(procs)]
    workers = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, text=True) for c in cmds]
    outs = [w.communicate()[0] for w in workers]
    for w, c in zip(workers, cmds):
        if w.returncode != 0:
            raise subprocess.CalledProcessError(w.returncode, c)
    return float(outs[0].strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", default="build/release/benchmarks/train_bench")
    p.add_argument("--cases", default="small,large")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--procs", default="1", help="process counts, e.g. 1,2 (2: mpirun -np 2 against DDP gloo)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--torch-bf16", choices=["autocast", "params"], default="autocast")
    p.add_argument("--omp-wait", choices=["passive", "default"], default="passive")
    p.add_argument("--json")
    p.add_argument("--markdown")
    p.add_argument("--torch-worker", nargs=2, metavar=("CASE", "PRECISION"), help=argparse.SUPPRESS)
    p.add_argument("--torch-rank", nargs=3, type=int, default=[0, 1, 0], help=argparse.SUPPRESS)  # rank world port
    args = p.parse_args()
    if args.torch_worker:
        rank, world, port = args.torch_rank
        print(torch_run(CASES[args.torch_worker[0]], args.torch_worker[1], args.steps, args.warmup, args.threads,
                        args.torch_bf16, rank, world, port))
        return
    try:
        import torch  # noqa: F401  (fail early, with the fix)
    except ImportError:
        sys.exit("torch_compare: PyTorch is missing: install Debian's python3-torch (bash scripts/install-deps.sh "
                 "--bench) and run this script with /usr/bin/python3")
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"torch_compare: {args.bench} is not built: cmake --build --preset release --target train_bench")
    env = dict(os.environ)
    if args.omp_wait == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    cases = [c for c in args.cases.split(",") if c]
    precisions = [x for x in args.precisions.split(",") if x]
    procs_list = [int(x) for x in args.procs.split(",") if x]
    for n in procs_list:
        if n < 1 or any(CASES[c]["micro_batch"] % n for c in cases):
            batches = ", ".join(f"{c} {CASES[c]['micro_batch']}" for c in cases)
            sys.exit(f"torch_compare: --procs {n}: each case's micro batch ({batches}) must split evenly over the processes")
    keys = [(c, pr, n) for c in cases for pr in precisions for n in procs_list]
    samples = {k: {"zeroshard": [], "pytorch": [], "zeroshard_mfu": [], "mfu_per_token_s": [], "load": []}
               for k in keys}
    for rep in range(args.reps):
        for c, pr, n in keys:
            order = ["zeroshard", "pytorch"] if rep % 2 == 0 else ["pytorch", "zeroshard"]
            s = samples[(c, pr, n)]
            for who in order:
                load = os.getloadavg()[0]  # the machine is shared: each figure with the load it ran under
                if who == "zeroshard":
                    r = zs_run(args.bench, CASES[c], pr, args.steps, args.warmup, n)
                    v = r["tokens_per_s"]
                    s["zeroshard_mfu"].append(r["mfu"])
                    s["mfu_per_token_s"].append(r["mfu"] / v)  # the same FLOPs and peak credited to PyTorch
                else:
                    v = torch_subprocess(args, c, pr, env, n)
                s[who].append(v)
                s["load"].append(load)
                print(f"rep {rep + 1}/{args.reps} {c} {pr} np {n} {who}: {v:.0f} tokens/s (load {load:.2f})",
                      file=sys.stderr, flush=True)
    rows = []
    for (c, pr, n), s in samples.items():
        zs, pt = statistics.median(s["zeroshard"]), statistics.median(s["pytorch"])
        mfu_per_token_s = statistics.median(s["mfu_per_token_s"])
        rows.append({"case": c, **CASES[c], "precision": pr, "processes": n, "zeroshard_tokens_per_s": zs,
                     "pytorch_tokens_per_s": pt, "ratio": zs / pt, "zeroshard_mfu": statistics.median(s["zeroshard_mfu"]),
                     "pytorch_mfu": pt * mfu_per_token_s, "load_min": min(s["load"]), "load_max": max(s["load"]),
                     "zeroshard_samples": s["zeroshard"], "pytorch_samples": s["pytorch"],
                     "zeroshard_mfu_samples": s["zeroshard_mfu"], "load_samples": s["load"]})
    lines = [f"| case (median of {args.reps} interleaved runs, {args.threads} threads) | zeroshard tokens/s (MFU) | "
             f"PyTorch {torch.__version__} tokens/s (MFU) | ratio | load |", "|---|---|---|---|---|"]
    for r in rows:
        shape = f"{r['n_layer']}L d{r['d_model']} seq{r['seq_len']} mb{r['micro_batch']}"
        if r["model"] == "llama":
            shape += f" d_ff{r['d_ff']} vocab{r['vocab']}"
        torch_mode = f" ({args.torch_bf16})" if r["precision"] == "bf16" else ""
        procs = "1 process" if r["processes"] == 1 else f"{r['processes']} processes (mpirun / DDP gloo)"
        lines.append(f"| {r['precision']}{torch_mode}, {procs}, {r['case']} ({shape}) | "
                     f"{r['zeroshard_tokens_per_s']:,.0f} ({100 * r['zeroshard_mfu']:.1f}%) | "
                     f"{r['pytorch_tokens_per_s']:,.0f} ({100 * r['pytorch_mfu']:.1f}%) | {r['ratio']:.2f}x | "
                     f"{r['load_min']:.1f}-{r['load_max']:.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.json:
        report = {"benchmark": "torch_compare",
                  "config": {"reps": args.reps, "procs": procs_list, "steps": args.steps,
                             "warmup": args.warmup, "threads": args.threads,
                             "torch_version": torch.__version__, "torch_bf16": args.torch_bf16,
                             "omp_wait_policy": args.omp_wait},
                  "baseline": {"what": "PyTorch, same model, batch and threads, in the same run"},
                  "results": rows}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
