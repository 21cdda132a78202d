#!/usr/bin/python3
"""GPT-2 and LLaMA against an independent PyTorch implementation (issue 34).

Builds each model in plain torch with Hugging Face's parameter names and layouts (GPT2LMHeadModel's
Conv1D [in, out] weights, LlamaForCausalLM's q/k/v/o and gate/up/down projections, rotate_half rotary
embedding, repeat_kv grouped-query attention) - no transformers package, written from their
modelling code's equations - with random weights, and computes the loss and every gradient on fixed
tokens in fp32. The weights go to zeroshard under our names (the mapping of docs/models.md), and
tests/nn/torch_driver_main.cpp computes the same loss and gradients; they must agree: the loss within
1e-5 relative, each gradient within 1e-4 of its tensor's largest magnitude.

    torch_reference.py DRIVER WORKDIR      exit 0: agree; 1: disagree; 77: skipped (no torch)
"""
import json
import math
import os
import struct
import subprocess
import sys

try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed for this interpreter (Debian: apt-get install python3-torch); "
          "the GPT-2/LLaMA reference comparison needs it")
    sys.exit(77)

torch.set_num_threads(1)
LOSS_RTOL = 1e-5
GRAD_TOL = 1e-4


# ---- GPT-2 (Hugging Face's GPT2LMHeadModel) ----

def gpt2_params(cfg, gen):
    C, V, T, L = cfg["d_model"], cfg["vocab_size"], cfg["max_seq_len"], cfg["n_layer"]
    F = cfg.get("d_ff", 4 * C)
    shapes = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (T, C)}
    for i in range(L):
        h = f"transformer.h.{i}."
        shapes.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,),
                       h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
                       h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                       h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
                       h + "mlp.c_fc.weight": (C, F), h + "mlp.c_fc.bias": (F,),
                       h + "mlp.c_proj.weight": (F, C), h + "mlp.c_proj.bias": (C,)})
    shapes.update({"transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)})
    return random_params(shapes, gen)


def gpt2_loss(p, cfg, inputs, targets):
    C, H, L = cfg["d_model"], cfg["n_head"], cfg["n_layer"]
    eps = cfg.get("norm_eps", 1e-5)
    B, T = inputs.shape
    hs = C // H

    def conv1d(x, name):  # transformers.pytorch_utils.Conv1D: x @ weight + bias, weight (in, out)
        return x @ p[name + ".weight"] + p[name + ".bias"]

    def ln(x, name):
        return torch.nn.functional.layer_norm(x, (C,), p[name + ".weight"], p[name + ".bias"], eps)

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    x = p["transformer.wte.weight"][inputs] + p["transformer.wpe.weight"][torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        h = f"transformer.h.{i}."
        q, k, v = conv1d(ln(x, h + "ln_1"), h + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, H, hs).transpose(1, 2) for t in (q, k, v))
        w = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        w = torch.where(mask, w, torch.finfo(w.dtype).min).softmax(dim=-1)
        a = (w @ v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(a, h + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc")), h + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    logits = x @ p["transformer.wte.weight"].T  # the tied lm_head
    return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


def gpt2_to_ours(cfg):
    """(our name, Hugging Face name, transpose) in our canonical order (docs/models.md)."""
    out = [("wte", "transformer.wte.weight", False), ("wpe", "transformer.wpe.weight", False)]
    for i in range(cfg["n_layer"]):
        h, o = f"transformer.h.{i}.", f"blocks.{i}."
        for ours, hf in (("ln1", "ln_1"),):
            out += [(o + ours + ".weight", h + hf + ".weight", False), (o + ours + ".bias", h + hf + ".bias", False)]
        for ours, hf in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj")):
            out += [(o + ours + ".weight", h + hf + ".weight", True), (o + ours + ".bias", h + hf + ".bias", False)]
        out += [(o + "ln2.weight", h + "ln_2.weight", False), (o + "ln2.bias", h + "ln_2.bias", False)]
        for ours, hf in (("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
            out += [(o + ours + ".weight", h + hf + ".weight", True), (o + ours + ".bias", h + hf + ".bias", False)]
    out += [("ln_f.weight", "transformer.ln_f.weight", False), ("ln_f.bias", "transformer.ln_f.bias", False)]
    return out


# ---- LLaMA (Hugging Face's LlamaForCausalLM) ----

def llama_params(cfg, gen):
    C, V, L, H = cfg["d_model"], cfg["vocab_size"], cfg["n_layer"], cfg["n_head"]
    K, F = cfg.get("n_kv_head", H), cfg["d_ff"]
    hs = C // H
    shapes = {"model.embed_tokens.weight": (V, C)}
    for i in range(L):
        h = f"model.layers.{i}."
        shapes.update({h + "input_layernorm.weight": (C,),
                       h + "self_attn.q_proj.weight": (H * hs, C), h + "self_attn.k_proj.weight": (K * hs, C),
                       h + "self_attn.v_proj.weight": (K * hs, C), h + "self_attn.o_proj.weight": (C, H * hs),
                       h + "post_attention_layernorm.weight": (C,),
                       h + "mlp.gate_proj.weight": (F, C), h + "mlp.up_proj.weight": (F, C),
                       h + "mlp.down_proj.weight": (C, F)})
    shapes.update({"model.norm.weight": (C,), "lm_head.weight": (V, C)})
    return random_params(shapes, gen)


def llama_loss(p, cfg, inputs, targets):
    C, H, L = cfg["d_model"], cfg["n_head"], cfg["n_layer"]
    K = cfg.get("n_kv_head", H)
    eps, theta = cfg.get("norm_eps", 1e-6), cfg.get("rope_theta", 10000.0)
    B, T = inputs.shape
    hs = C // H

    def rms(x, name):  # LlamaRMSNorm
        variance = x.pow(2).mean(-1, keepdim=True)
        return p[name] * (x * torch.rsqrt(variance + eps))

    def linear(x, name):
        return x @ p[name].T

    # LlamaRotaryEmbedding (default rope type) and apply_rotary_pos_emb
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    freqs = torch.arange(T).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def repeat_kv(x, n_rep):
        b, kv, t, d = x.shape
        return x[:, :, None, :, :].expand(b, kv, n_rep, t, d).reshape(b, kv * n_rep, t, d)

    x = p["model.embed_tokens.weight"][inputs]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        h = f"model.layers.{i}."
        a_in = rms(x, h + "input_layernorm.weight")
        q = linear(a_in, h + "self_attn.q_proj.weight").view(B, T, H, hs).transpose(1, 2)
        k = linear(a_in, h + "self_attn.k_proj.weight").view(B, T, K, hs).transpose(1, 2)
        v = linear(a_in, h + "self_attn.v_proj.weight").view(B, T, K, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // K), repeat_kv(v, H // K)
        w = (q @ k.transpose(2, 3)) / math.sqrt(hs)
        w = torch.where(mask, w, torch.finfo(w.dtype).min).softmax(dim=-1, dtype=torch.float32)
        a = (w @ v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(a, h + "self_attn.o_proj.weight")
        m_in = rms(x, h + "post_attention_layernorm.weight")
        g = linear(m_in, h + "mlp.gate_proj.weight")
        x = x + linear(torch.nn.functional.silu(g) * linear(m_in, h + "mlp.up_proj.weight"), h + "mlp.down_proj.weight")
    x = rms(x, "model.norm.weight")
    logits = linear(x, "lm_head.weight")
    return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


def llama_to_ours(cfg):
    out = [("wte", "model.embed_tokens.weight", False)]
    for i in range(cfg["n_layer"]):
        h, o = f"model.layers.{i}.", f"blocks.{i}."
        out += [(o + "ln1.weight", h + "input_layernorm.weight", False),
                (o + "attn.q.weight", h + "self_attn.q_proj.weight", False),
                (o + "attn.k.weight", h + "self_attn.k_proj.weight", False),
                (o + "attn.v.weight", h + "self_attn.v_proj.weight", False),
                (o + "attn.proj.weight", h + "self_attn.o_proj.weight", False),
                (o + "ln2.weight", h + "post_attention_layernorm.weight", False),
                (o + "mlp.gate.weight", h + "mlp.gate_proj.weight", False),
                (o + "mlp.up.weight", h + "mlp.up_proj.weight", False),
                (o + "mlp.proj.weight", h + "mlp.down_proj.weight", False)]
    out += [("ln_f.weight", "model.norm.weight", False), ("lm_head.weight", "lm_head.weight", False)]
    return out


# ---- the comparison ----

def random_params(shapes, gen):
    p = {}
    for name, shape in shapes.items():
        if len(shape) == 1 and ("ln" in name or "norm" in name) and name.endswith(".weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)  # norm weights near one, not exactly one
        else:
            t = 0.2 * torch.randn(shape, generator=gen)
        p[name] = t.float().requires_grad_(True)
    return p


def run_case(name, model_section, driver, workdir, batch=2, seq=None):
    gen = torch.Generator().manual_seed(1234)
    cfg = dict(model_section)
    kind = cfg.pop("type")
    seq = seq or cfg["max_seq_len"]
    params = (gpt2_params if kind == "gpt2" else llama_params)(cfg, gen)
    V = cfg["vocab_size"]
    inputs = torch.randint(0, V, (batch, seq), generator=gen)
    targets = torch.randint(0, V, (batch, seq), generator=gen)
    loss = (gpt2_loss if kind == "gpt2" else llama_loss)(params, cfg, inputs, targets)
    loss.backward()
    mapping = (gpt2_to_ours if kind == "gpt2" else llama_to_ours)(cfg)
    assert sorted(hf for _, hf, _ in mapping) == sorted(params), "the mapping must cover every tensor once"

    d = os.path.join(workdir, name)
    os.makedirs(d, exist_ok=True)
    config = {"train_batch_size": batch, "model": model_section}
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump({"config": config, "batch": batch, "seq": seq}, f)
    ours = []
    with open(os.path.join(d, "weights.bin"), "wb") as f:
        for our_name, hf, transpose in mapping:
            t = params[hf].detach()
            t = t.T.contiguous() if transpose else t.contiguous()
            ours.append([our_name, list(t.shape)])
            f.write(t.numpy().astype("<f4").tobytes())
    with open(os.path.join(d, "params.json"), "w") as f:
        json.dump(ours, f)
    with open(os.path.join(d, "tokens.bin"), "wb") as f:
        f.write(inputs.to(torch.int32).numpy().astype("<i4").tobytes())
        f.write(targets.to(torch.int32).numpy().astype("<i4").tobytes())
    r = subprocess.run([driver, d], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{name}: the driver failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        return False
    with open(os.path.join(d, "zs_loss.txt")) as f:
        zs_loss = float(f.read())
    with open(os.path.join(d, "zs_grads.bin"), "rb") as f:
        raw = f.read()
    ok = True
    rel = abs(zs_loss - loss.item()) / abs(loss.item())
    print(f"{name}: loss torch {loss.item():.9g} zeroshard {zs_loss:.9g} (relative difference {rel:.2e})")
    if rel > LOSS_RTOL:
        print(f"{name}: FAIL: loss differs by {rel:.2e} > {LOSS_RTOL:g} relative")
        ok = False
    offset, worst = 0, (0.0, "")
    for our_name, hf, transpose in mapping:
        g = params[hf].grad
        g = g.T.contiguous() if transpose else g
        n = g.numel()
        zs = torch.tensor(struct.unpack_from(f"<{n}f", raw, offset)).view(g.shape)
        offset += 4 * n
        scale = g.abs().max().item()
        err = (zs - g).abs().max().item() / max(scale, 1e-30)
        worst = max(worst, (err, our_name))
        if err > GRAD_TOL:
            print(f"{name}: FAIL: gradient of {our_name} ({hf}) differs by {err:.2e} of its largest magnitude {scale:.3g}")
            ok = False
    assert offset == len(raw), "zs_grads.bin has bytes past the last tensor"
    print(f"{name}: {len(mapping)} gradients, largest difference {worst[0]:.2e} of the tensor's magnitude ({worst[1]})")
    return ok


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    driver, workdir = sys.argv[1], sys.argv[2]
    cases = [
        ("gpt2", {"type": "gpt2", "n_layer": 2, "d_model": 32, "n_head": 4, "max_seq_len": 16, "vocab_size": 300}),
        ("gpt2_d_ff", {"type": "gpt2", "n_layer": 1, "d_model": 24, "n_head": 3, "d_ff": 40, "norm_eps": 1e-6,
                       "max_seq_len": 12, "vocab_size": 260}),
        ("llama_gqa", {"type": "llama", "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2, "d_ff": 56,
                       "max_seq_len": 16, "vocab_size": 300, "norm_eps": 1e-6}),
        ("llama_mha", {"type": "llama", "n_layer": 1, "d_model": 48, "n_head": 3, "d_ff": 64, "rope_theta": 500000.0,
                       "norm_eps": 1e-5, "max_seq_len": 20, "vocab_size": 256}),
        ("llama_mqa", {"type": "llama", "n_layer": 1, "d_model": 64, "n_head": 4, "n_kv_head": 1, "d_ff": 80,
                       "max_seq_len": 40, "vocab_size": 256}),
    ]
    results = [run_case(name, section, driver, workdir, seq=13 if name == "llama_mqa" else None)
               for name, section in cases]
    print("torch reference: " + ("all agree" if all(results) else "DISAGREEMENT"))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
