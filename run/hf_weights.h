// Hugging Face weights in and out: the built-in models' parameter names in Hugging Face's files, a
// model initialised from safetensors, and a checkpoint exported as safetensors (docs/checkpoints.md,
// "Hugging Face weights").
//
//   zeroshard train --config llama.json --init-from hf/TinyLlama     (init_from_safetensors)
//   zeroshard checkpoint export ckpt/ out/ --format safetensors      (export_safetensors)
//
// Names (Note [Hugging Face names] in hf_weights.cpp): model.type "gpt2" maps to GPT2LMHeadModel's
// names (transformer.h.{i}.attn.c_attn.weight, ...; Conv1D weights are stored (in, out), so they are
// transposed both ways), "llama" to LlamaForCausalLM's (model.layers.{i}.self_attn.q_proj.weight,
// ...; the same (out, in) layout), and every other model (the byte-level "gpt", the GPT-MoE) keeps
// zeroshard's own names and layouts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "memory/dtype.h"
#include "nn/module.h"

namespace zs::run {

struct RunConfig;

enum class WeightNaming { kZeroshard, kGpt2, kLlama };

// kGpt2 for model.type "gpt2", kLlama for "llama", else kZeroshard.
WeightNaming weight_naming(const RunConfig& cfg);
WeightNaming weight_naming(std::string_view model_type);

struct HfName {
  std::string name;
  bool transposed = false;  // stored as the transpose of our (out, in) weight (GPT-2's Conv1D)
};

// The file name of our parameter `ours` (a full name such as "blocks.3.attn.qkv.weight"); nullopt when
// the family has no such tensor (e.g. a GPT-MoE expert under kGpt2).
std::optional<HfName> hf_name(WeightNaming naming, std::string_view ours);

// Makes every parameter of `model` take its initial values from the safetensors model at `path` (a
// file, an index or a directory; checkpoint/safetensors.h) instead of its initialiser: the engine
// then initialises each rank's shard by reading just those elements (nn::ValueSource). Checks first,
// on every rank, that each parameter's tensor is present with its shape (transposed where the layout
// says) and a float dtype, and that the files hold nothing else (buffers Hugging Face saves beside
// the weights, and GPT-2's tied lm_head.weight, excepted): CheckpointError naming the file and the
// tensor. Returns a one-line description for the log.
std::string init_from_safetensors(nn::Module& model, WeightNaming naming, const std::filesystem::path& path);
// Drops the value sources again (after the engine has initialised: releases the mappings).
void clear_value_sources(nn::Module& model);

// Writes the parameters of the checkpoint at `checkpoint` (a root or a tag directory) under `out` as
// safetensors with the names of the model.type its saved config names, whole tensors in `dtype`, in
// pieces of at most `piece_bytes` whatever the tensor's size, split into files of at most
// max_shard_bytes with Hugging Face's index; for gpt2 and llama also a config.json with Hugging
// Face's keys. The values are the fp32 master where the checkpoint has one, else the parameters.
// Returns a one-line description.
std::string export_safetensors(const std::filesystem::path& checkpoint, const std::filesystem::path& out,
                               memory::DType dtype, uint64_t max_shard_bytes, uint64_t piece_bytes = uint64_t{64} << 20);

}  // namespace zs::run
