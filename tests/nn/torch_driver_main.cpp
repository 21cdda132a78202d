// The zeroshard side of tests/nn/torch_reference.py: builds the model a run config names (model.type
// "gpt2" or "llama"), loads the weights the script wrote under our parameter names, and writes the
// loss and every gradient on the script's tokens.
//
//   nn_torch_driver DIR
//     DIR/case.json     {"config": {...a run config...}, "batch": B, "seq": T}
//     DIR/params.json   [[name, [shape...]], ...]: our canonical order, which the model must have
//     DIR/weights.bin   fp32 values in that order
//     DIR/tokens.bin    int32 inputs (B*T) then targets (B*T)
//   writes DIR/zs_loss.txt (the mean loss) and DIR/zs_grads.bin (fp32 gradients in params.json's order)
#include <boost/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/json.h"
#include "nn/gpt.h"
#include "nn/host_context.h"
#include "nn/llama.h"
#include "run/run_config.h"

namespace {

using zs::memory::DType;
using zs::memory::Tensor;

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

int run(const std::string& dir) {
  const boost::json::value doc = zs::parse_json_file(dir + "/case.json");
  const zs::run::RunConfig cfg = zs::run::parse_run_config(doc.at("config"), 1);
  std::unique_ptr<zs::nn::Model> model;
  if (cfg.model_llama) {
    model = std::make_unique<zs::nn::LlamaModel>(*cfg.model_llama);
  } else {
    model = std::make_unique<zs::nn::GptModel>(*cfg.model);
  }
  zs::nn::materialize(*model, 0);
  const boost::json::value listed = zs::parse_json_file(dir + "/params.json");
  const boost::json::array& names = listed.as_array();
  const std::vector<zs::nn::Parameter*> params = model->all_params();
  if (names.size() != params.size()) {
    std::fprintf(stderr, "params.json lists %zu tensors, the model has %zu\n", names.size(), params.size());
    return 1;
  }
  const std::vector<char> weights = read_all(dir + "/weights.bin");
  size_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    zs::nn::Parameter& p = *params[i];
    const std::string name(names[i].as_array()[0].as_string());
    std::vector<int64_t> shape;
    for (const auto& d : names[i].as_array()[1].as_array()) shape.push_back(d.as_int64());
    if (name != p.full_name() || zs::memory::Shape(shape) != p.shape()) {
      std::fprintf(stderr, "tensor %zu: the script wrote %s %s, the model's is %s %s\n", i, name.c_str(),
                   zs::memory::shape_string(zs::memory::Shape(shape)).c_str(), p.full_name().c_str(),
                   zs::memory::shape_string(p.shape()).c_str());
      return 1;
    }
    const size_t bytes = static_cast<size_t>(p.numel()) * sizeof(float);
    if (offset + bytes > weights.size()) {
      std::fprintf(stderr, "weights.bin ends inside %s\n", name.c_str());
      return 1;
    }
    std::memcpy(p.data().raw(), weights.data() + offset, bytes);
    offset += bytes;
  }
  if (offset != weights.size()) {
    std::fprintf(stderr, "weights.bin has %zu bytes past the last tensor\n", weights.size() - offset);
    return 1;
  }
  const int64_t B = doc.at("batch").as_int64(), T = doc.at("seq").as_int64();
  const std::vector<char> tokens = read_all(dir + "/tokens.bin");
  if (tokens.size() != static_cast<size_t>(2 * B * T) * sizeof(int32_t)) {
    std::fprintf(stderr, "tokens.bin has %zu bytes, expected %lld\n", tokens.size(), static_cast<long long>(8 * B * T));
    return 1;
  }
  zs::nn::Batch batch{Tensor::empty({B, T}, DType::kI32), Tensor::empty({B, T}, DType::kI32)};
  std::memcpy(batch.inputs.raw(), tokens.data(), static_cast<size_t>(B * T) * sizeof(int32_t));
  std::memcpy(batch.targets.raw(), tokens.data() + B * T * sizeof(int32_t), static_cast<size_t>(B * T) * sizeof(int32_t));
  zs::nn::HostContext ctx;
  const float loss = ctx.forward_loss(*model, batch);
  ctx.backward_loss(*model, 1.0f);
  std::ofstream(dir + "/zs_loss.txt") << fmt::format("{:.9g}\n", loss);
  std::ofstream grads(dir + "/zs_grads.bin", std::ios::binary);
  for (zs::nn::Parameter* p : params) {
    grads.write(static_cast<const char*>(p->grad().raw()), static_cast<std::streamsize>(p->numel() * sizeof(float)));
  }
  return grads ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: nn_torch_driver DIR (see tests/nn/torch_reference.py)\n");
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nn_torch_driver: %s\n", e.what());
    return 1;
  }
}
