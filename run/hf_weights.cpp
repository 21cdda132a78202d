#include "run/hf_weights.h"

#include <boost/json.hpp>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/tools.h"
#include "core/errors.h"
#include "core/json.h"
#include "run/run_config.h"

namespace zs::run {

namespace fs = std::filesystem;
namespace json = boost::json;
using memory::DType;

// Note [Hugging Face names]
// GPT-2 (GPT2LMHeadModel) and LLaMA (LlamaForCausalLM) as Hugging Face's transformers saves them;
// ours are nn::GptModel's and nn::LlamaModel's (written down in docs/models.md).
//   - GPT-2's attention and MLP weights are Conv1D modules, weight (in, out); ours are (out, in) like
//     nn.Linear's: transposed both ways (c_attn's 3C columns are [q | k | v], head-major, the order of
//     our qkv rows). The head is tied to wte: a file may carry lm_head.weight (then it is skipped) or
//     not. Files saved from GPT2Model (the Hub's own gpt2 checkpoint) lack the "transformer." prefix:
//     both spellings load. attn.bias and attn.masked_bias are causal-mask buffers older versions
//     saved: skipped.
//   - LLaMA's projections are nn.Linear, the same (out, in) layout: no transposes. Rotary embedding:
//     zeroshard rotates dimension j of a head with j + head_size/2 (Hugging Face's rotate_half), and
//     Hugging Face's files already carry the q/k row permutation its conversion script
//     (convert_llama_weights_to_hf.py, `permute`) applied to Meta's interleaved-pair checkpoints, so
//     q_proj and k_proj rows load as they are. A checkpoint in Meta's own layout (consolidated.00.pth,
//     wq/wk) would need that permutation; it is not read here. rotary_emb.inv_freq (older files) is a
//     buffer: skipped. The head is untied.
// Every other model keeps zeroshard's own names and layouts, so any model exports and imports itself.

namespace {

struct Rule {
  std::string_view ours, hf;
  bool transposed = false;
};

constexpr Rule kGpt2Top[] = {{"wte", "transformer.wte.weight"},       {"wpe", "transformer.wpe.weight"},
                             {"ln_f.weight", "transformer.ln_f.weight"}, {"ln_f.bias", "transformer.ln_f.bias"},
                             {"lm_head.weight", "lm_head.weight"}};
constexpr Rule kGpt2Block[] = {
    {"ln1.weight", "ln_1.weight"},           {"ln1.bias", "ln_1.bias"},
    {"attn.qkv.weight", "attn.c_attn.weight", true}, {"attn.qkv.bias", "attn.c_attn.bias"},
    {"attn.proj.weight", "attn.c_proj.weight", true}, {"attn.proj.bias", "attn.c_proj.bias"},
    {"ln2.weight", "ln_2.weight"},           {"ln2.bias", "ln_2.bias"},
    {"mlp.fc.weight", "mlp.c_fc.weight", true},       {"mlp.fc.bias", "mlp.c_fc.bias"},
    {"mlp.proj.weight", "mlp.c_proj.weight", true},   {"mlp.proj.bias", "mlp.c_proj.bias"}};
constexpr Rule kLlamaTop[] = {{"wte", "model.embed_tokens.weight"}, {"ln_f.weight", "model.norm.weight"},
                              {"lm_head.weight", "lm_head.weight"}};
constexpr Rule kLlamaBlock[] = {{"ln1.weight", "input_layernorm.weight"},
                                {"attn.q.weight", "self_attn.q_proj.weight"},
                                {"attn.k.weight", "self_attn.k_proj.weight"},
                                {"attn.v.weight", "self_attn.v_proj.weight"},
                                {"attn.proj.weight", "self_attn.o_proj.weight"},
                                {"ln2.weight", "post_attention_layernorm.weight"},
                                {"mlp.gate.weight", "mlp.gate_proj.weight"},
                                {"mlp.up.weight", "mlp.up_proj.weight"},
                                {"mlp.proj.weight", "mlp.down_proj.weight"}};

// Buffers Hugging Face files may carry beside the weights.
bool is_buffer(WeightNaming naming, std::string_view hf) {
  if (naming == WeightNaming::kGpt2) return hf.ends_with(".attn.bias") || hf.ends_with(".attn.masked_bias");
  if (naming == WeightNaming::kLlama) return hf.ends_with(".rotary_emb.inv_freq");
  return false;
}

// A values source over a safetensors model: the tensor of each parameter, transposed or not.
class SafetensorsSource final : public nn::ValueSource {
 public:
  struct Entry {
    std::string hf;
    bool transposed = false;
    int64_t rows = 0, cols = 0;  // our (out, in) shape, for a transposed weight
  };
  SafetensorsSource(std::shared_ptr<const checkpoint::SafetensorsReader> reader, std::map<std::string, Entry> entries)
      : reader_(std::move(reader)), entries_(std::move(entries)) {}

  void read(const nn::Parameter& p, std::span<float> out, uint64_t first) const override {
    const Entry& e = entries_.at(p.full_name());
    if (!e.transposed) {
      reader_->read(e.hf, first, out.size(), DType::kF32, out.data());
      return;
    }
    // Ours (o, i) = file (i, o). The rows o the range touches, read as one block of file columns
    // [o0, o1] from each file row: cols reads, a block of about out.size() + 2 x cols elements.
    const auto R = static_cast<uint64_t>(e.rows), C = static_cast<uint64_t>(e.cols);
    const uint64_t o0 = first / C, o1 = (first + out.size() - 1) / C, width = o1 - o0 + 1;
    std::vector<float> block(C * width);
    for (uint64_t i = 0; i < C; ++i) reader_->read(e.hf, i * R + o0, width, DType::kF32, block.data() + i * width);
    for (uint64_t k = 0; k < out.size(); ++k) {
      const uint64_t o = (first + k) / C, i = (first + k) % C;
      out[k] = block[i * width + (o - o0)];
    }
  }

 private:
  std::shared_ptr<const checkpoint::SafetensorsReader> reader_;
  std::map<std::string, Entry> entries_;
};

std::string shape_text(const memory::Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

}  // namespace

WeightNaming weight_naming(std::string_view model_type) {
  if (model_type == "gpt2") return WeightNaming::kGpt2;
  if (model_type == "llama") return WeightNaming::kLlama;
  return WeightNaming::kZeroshard;
}

WeightNaming weight_naming(const RunConfig& cfg) { return weight_naming(cfg.model_type); }

std::optional<HfName> hf_name(WeightNaming naming, std::string_view ours) {
  if (naming == WeightNaming::kZeroshard) return HfName{std::string(ours), false};
  const bool gpt2 = naming == WeightNaming::kGpt2;
  for (const Rule& r : gpt2 ? std::span<const Rule>(kGpt2Top) : std::span<const Rule>(kLlamaTop)) {
    if (r.ours == ours) return HfName{std::string(r.hf), r.transposed};
  }
  // blocks.{i}.<suffix>
  constexpr std::string_view kBlocks = "blocks.";
  if (!ours.starts_with(kBlocks)) return std::nullopt;
  const std::string_view rest = ours.substr(kBlocks.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  int64_t layer = -1;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + dot, layer);
  if (ec != std::errc() || end != rest.data() + dot || layer < 0) return std::nullopt;
  const std::string_view suffix = rest.substr(dot + 1);
  for (const Rule& r : gpt2 ? std::span<const Rule>(kGpt2Block) : std::span<const Rule>(kLlamaBlock)) {
    if (r.ours == suffix) {
      return HfName{fmt::format("{}{}.{}", gpt2 ? "transformer.h." : "model.layers.", layer, r.hf), r.transposed};
    }
  }
  return std::nullopt;
}

std::string init_from_safetensors(nn::Module& model, WeightNaming naming, const fs::path& path) {
  auto reader = std::make_shared<const checkpoint::SafetensorsReader>(path);
  // GPT2Model's files (the Hub's gpt2) spell the names without "transformer.".
  const bool bare = naming == WeightNaming::kGpt2 && !reader->contains("transformer.wte.weight") &&
                    reader->contains("wte.weight");
  auto file_name = [&](const std::string& hf) {
    return bare && hf.starts_with("transformer.") ? hf.substr(std::string_view("transformer.").size()) : hf;
  };
  std::map<std::string, SafetensorsSource::Entry> entries;
  std::set<std::string> used;
  uint64_t elements = 0;
  const std::vector<nn::Parameter*> params = model.all_params();
  for (const nn::Parameter* p : params) {
    const std::optional<HfName> h = hf_name(naming, p->full_name());
    if (!h) {
      throw CheckpointError(fmt::format("--init-from '{}': parameter '{}' has no Hugging Face name for this model type; "
                                        "only zeroshard's own names (a model of type \"gpt\") carry it",
                                        path.string(), p->full_name()));
    }
    const std::string name = file_name(h->name);
    memory::Shape want = p->full_shape();
    if (h->transposed) std::reverse(want.begin(), want.end());
    if (!reader->contains(name)) {
      throw CheckpointError(fmt::format("safetensors model '{}': tensor '{}' (zeroshard's {} {}) is missing; is it a {} "
                                        "checkpoint of the config's model type and size?",
                                        path.string(), name, p->full_name(), shape_text(p->full_shape()),
                                        naming == WeightNaming::kGpt2    ? "GPT-2"
                                        : naming == WeightNaming::kLlama ? "LLaMA"
                                                                         : "zeroshard"));
    }
    reader->expect(name, want);
    const memory::Shape full = p->full_shape();
    entries.emplace(p->full_name(), SafetensorsSource::Entry{name, h->transposed, h->transposed ? full[0] : 0,
                                                             h->transposed ? full[1] : 0});
    used.insert(name);
    elements += static_cast<uint64_t>(p->full_numel());
  }
  const bool tied_head = naming == WeightNaming::kGpt2 && !used.contains("lm_head.weight");
  for (const std::string& name : reader->names()) {
    if (used.contains(name) || is_buffer(naming, name) || (tied_head && name == "lm_head.weight")) continue;
    throw CheckpointError(fmt::format("safetensors file '{}': tensor '{}' is not a parameter of this model (extra "
                                      "tensor); check the model section against the checkpoint's config.json",
                                      reader->file_of(name).path().string(), name));
  }
  auto source = std::make_shared<const SafetensorsSource>(reader, std::move(entries));
  for (nn::Parameter* p : params) p->set_value_source(source);
  return fmt::format("{} parameters ({} elements) from '{}'{}", params.size(), elements, path.string(),
                     naming == WeightNaming::kZeroshard ? " (zeroshard names)" : " (Hugging Face names)");
}

void clear_value_sources(nn::Module& model) {
  for (nn::Parameter* p : model.all_params()) p->set_value_source(nullptr);
}

namespace {

// Hugging Face's config.json for the exported model (keys of GPT2Config / LlamaConfig).
std::string hf_config(const RunConfig& cfg, WeightNaming naming) {
  json::object c;
  if (naming == WeightNaming::kGpt2) {
    const nn::GptConfig& m = *cfg.model;
    c = {{"architectures", json::array{"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", m.vocab_size},
         {"n_layer", m.n_layer}, {"n_embd", m.d_model}, {"n_head", m.n_head}, {"n_inner", nn::gpt_d_ff(m)},
         {"n_positions", m.seq_len}, {"n_ctx", m.seq_len}, {"layer_norm_epsilon", static_cast<double>(m.norm_eps)},
         {"activation_function", "gelu_new"}, {"tie_word_embeddings", m.tied_embeddings}};
  } else {
    const nn::LlamaConfig& m = *cfg.model_llama;
    c = {{"architectures", json::array{"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", m.vocab_size},
         {"num_hidden_layers", m.n_layer}, {"hidden_size", m.d_model}, {"num_attention_heads", m.n_head},
         {"num_key_value_heads", m.n_kv_head}, {"intermediate_size", nn::llama_d_ff(m)},
         {"max_position_embeddings", m.max_seq_len}, {"rope_theta", m.rope_theta},
         {"rms_norm_eps", static_cast<double>(m.norm_eps)}, {"hidden_act", "silu"}, {"tie_word_embeddings", false}};
  }
  return json::serialize(c) + "\n";
}

}  // namespace

std::string export_safetensors(const fs::path& checkpoint_path, const fs::path& out, DType dtype,
                               uint64_t max_shard_bytes, uint64_t piece_bytes) {
  checkpoint::CheckpointReader r = checkpoint::open_checkpoint(checkpoint_path);
  const checkpoint::Metadata& m = r.metadata();
  std::optional<RunConfig> cfg;
  WeightNaming naming = WeightNaming::kZeroshard;
  if (!m.config_json.empty()) {
    const json::value doc = parse_json_text(m.config_json, checkpoint_path.string() + " (saved config)");
    const json::value* model = doc.is_object() ? doc.as_object().if_contains("model") : nullptr;
    const json::value* type = model != nullptr && model->is_object() ? model->as_object().if_contains("type") : nullptr;
    if (type != nullptr && type->is_string()) naming = weight_naming(std::string_view(type->as_string()));
    if (naming != WeightNaming::kZeroshard) cfg = parse_run_config(doc, m.layout.world_size);
  }
  struct Item {
    const checkpoint::TensorInfo* info;
    const char* buffer;
    HfName hf;
  };
  std::vector<Item> items;
  std::vector<checkpoint::SafetensorsSpec> specs;
  for (const checkpoint::TensorInfo& t : m.layout.tensors) {
    const char* buffer = r.holds("fp32", t.name) ? "fp32" : r.holds("params", t.name) ? "params" : nullptr;
    if (buffer == nullptr) continue;  // an optimizer-only tensor
    std::optional<HfName> h = hf_name(naming, t.name);
    if (!h) {
      throw CheckpointError(fmt::format("checkpoint '{}': tensor '{}' has no Hugging Face name for its model type",
                                        checkpoint_path.string(), t.name));
    }
    std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
    if (h->transposed && shape.size() != 2) {
      throw CheckpointError(fmt::format("checkpoint '{}': tensor '{}' has shape {}, not a matrix", checkpoint_path.string(),
                                        t.name, shape_text(shape)));
    }
    if (h->transposed) std::swap(shape[0], shape[1]);
    specs.push_back({h->name, dtype, shape});
    items.push_back({&t, buffer, std::move(*h)});
  }
  std::map<std::string, const Item*> by_name;
  for (const Item& it : items) by_name.emplace(it.hf.name, &it);
  const uint64_t piece = std::max<uint64_t>(1, piece_bytes / sizeof(float));
  std::vector<float> buf;
  const auto files = checkpoint::write_safetensors_model(
      out, specs, {{"format", "pt"}}, max_shard_bytes,
      [&](const checkpoint::SafetensorsSpec& spec, checkpoint::SafetensorsWriter& w) {
        const Item& it = *by_name.at(spec.name);
        const std::string& name = it.info->name;
        const uint64_t numel = it.info->numel();
        if (!it.hf.transposed) {
          buf.resize(std::min(piece, std::max<uint64_t>(numel, 1)));
          for (uint64_t e = 0; e < numel; e += buf.size()) {
            const uint64_t n = std::min<uint64_t>(buf.size(), numel - e);
            r.read(it.buffer, name, e, n, DType::kF32, buf.data());
            w.append(buf.data(), DType::kF32, n);
          }
          return;
        }
        // Ours (R, C) row-major; the file's (C, R): columns [c0, c0 + B) of ours become the file's
        // rows c0.. in one block of R x B elements (at most a piece, or one column).
        const uint64_t R = it.info->shape[0], C = it.info->shape[1];
        const uint64_t B = std::max<uint64_t>(1, std::min(C, piece / std::max<uint64_t>(R, 1)));
        std::vector<float> block(R * B), row(R);
        for (uint64_t c0 = 0; c0 < C; c0 += B) {
          const uint64_t b = std::min(B, C - c0);
          for (uint64_t o = 0; o < R; ++o) r.read(it.buffer, name, o * C + c0, b, DType::kF32, block.data() + o * b);
          for (uint64_t i = 0; i < b; ++i) {
            for (uint64_t o = 0; o < R; ++o) row[o] = block[o * b + i];
            w.append(row.data(), DType::kF32, R);
          }
        }
      });
  if (cfg) {
    const fs::path p = out / "config.json";
    std::ofstream f(p);
    f << hf_config(*cfg, naming);
    if (!f) throw IoError(fmt::format("cannot write '{}'", p.string()));
  }
  return fmt::format("exported {} tensors ({}) of '{}' to '{}' as {} in {} file(s){}", items.size(),
                     memory::dtype_name(dtype), checkpoint_path.string(), out.string(),
                     naming == WeightNaming::kGpt2    ? "GPT-2 (Hugging Face names)"
                     : naming == WeightNaming::kLlama ? "LLaMA (Hugging Face names)"
                                                      : "zeroshard names",
                     files.size(), cfg ? " and config.json" : "");
}

}  // namespace zs::run
