// standalone_mlp: wrap your own C++ model in the zeroshard Engine.
//
//   build/release/examples/standalone_mlp examples/configs/mlp.json [STEPS]
//   mpirun -np 4 build/release/examples/standalone_mlp examples/configs/mlp.json
//   build/release/examples/standalone_mlp examples/configs/mlp.json --estimate 4   # memory on 4 ranks
//
// The model and its data (examples/mlp_model.h): a two-layer MLP trained by mean squared error to
// imitate a fixed "teacher" function on synthetic inputs.
//
// What a program does, in order (each step is marked "Step N"; 1 and 2 are in mlp_model.h):
//   1. Declare the model: nn::Module subclasses that declare parameters and children in their
//      constructor, and an nn::Model at the root that turns a batch into a loss.
//   2. Provide the data: an engine::BatchSource that fills micro-batches by global sample index.
//   3. Read the config: DeepSpeed keys (and the run's data and log sections) through
//      run::parse_run_config; the program's own settings (here the `mlp` section) read strictly with
//      zs::ObjectReader and removed before parse_run_config, which rejects keys it does not know.
//   4. Start the world (mpirun, or a world of one), build the Engine, call train_batch per step.
//   Or, before renting the machines: predict the memory per rank of this model under this config at
//   every ZeRO stage (engine::estimate_input_for_model; the same report as `zeroshard estimate`).
//
// Errors follow the zeroshard tool's edge conventions (tools/train_command.cpp): a bad config is
// reported once, by rank 0, and every rank exits 1; any later error ends the whole job through
// comm::World::abort, so no rank is left waiting in a collective.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "comm/world.h"
#include "core/errors.h"
#include "core/json.h"
#include "core/log.h"
#include "core/rng.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "launch/launch.h"
#include "estimate/estimate.h"
#include "examples/mlp_model.h"
#include "nn/nn.h"
#include "run/run_config.h"

namespace {

using zs::examples::MlpConfig;
using zs::examples::Regressor;
using zs::examples::TeacherData;

// ---- Step 3: the config --------------------------------------------------------------------------

// Reads the file, takes out the program's own `mlp` section (checked key by key: an unknown key is a
// ConfigError with a did-you-mean, like every engine section), and validates the rest as the engine's
// DeepSpeed-style config.
zs::run::RunConfig load_config(const std::string& path, int world_size, MlpConfig& mlp) {
  boost::json::value doc = zs::parse_json_file(path);
  if (!doc.is_object()) throw zs::ConfigError(path + ": the config must be a JSON object");
  zs::ObjectReader root(doc, "");
  root.read_object("mlp", [&](zs::ObjectReader& r) {
    r.read("d_in", mlp.d_in, zs::IntRange{1, 4096});
    r.read("hidden", mlp.hidden, zs::IntRange{1, 65536});
    r.read("d_out", mlp.d_out, zs::IntRange{1, 4096});
  });
  doc.as_object().erase("mlp");
  zs::run::RunConfig cfg = zs::run::parse_run_config(doc, world_size);
  if (cfg.model) throw zs::ConfigError("model: this program brings its own model; remove the `model` section");
  return cfg;
}

}  // namespace

// ---- Step 4: run ---------------------------------------------------------------------------------

namespace {

// The memory this model needs per rank on `ranks` ranks, at every ZeRO stage: the engine's own code
// run over a measuring backend (no memory committed, no arithmetic), in one process.
int estimate(const std::string& path, const std::string& ranks_text) {
  char* end = nullptr;
  const long ranks = std::strtol(ranks_text.c_str(), &end, 10);
  if (*end != '\0' || ranks < 1 || ranks > 1 << 20) {
    std::fprintf(stderr, "standalone_mlp: --estimate RANKS must be an integer >= 1, got '%s'\n", ranks_text.c_str());
    return 2;
  }
  try {
    MlpConfig mlp;
    const zs::run::RunConfig cfg = load_config(path, static_cast<int>(ranks), mlp);
    Regressor model(mlp);
    TeacherData data(mlp, cfg.data.seed.value_or(cfg.seed), cfg.batch.train_batch_size);
    const std::string what = fmt::format("MLP {} -> {} -> {}", mlp.d_in, mlp.hidden, mlp.d_out);
    auto in = zs::engine::estimate_input_for_model(model, data, cfg, static_cast<int>(ranks), what);
    std::fputs(zs::engine::format_estimate(zs::engine::estimate_memory(in, {0, 1, 2, 3})).c_str(), stdout);
    return 0;
  } catch (const zs::Error& e) {
    std::fprintf(stderr, "standalone_mlp: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  zs::launch::select_blas_kernels(argv);  // first: may re-exec with faster OpenBLAS kernels
  const char* usage = "usage: %s CONFIG.json [STEPS]\n       %s CONFIG.json --estimate RANKS\n";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(usage, argv[0], argv[0]);
      return 0;
    }
    const bool option = arg.size() > 1 && arg[0] == '-' && (arg[1] == '-' || std::isalpha(static_cast<unsigned char>(arg[1])));
    if (option && arg != "--estimate") {  // not a config path: say so, not "cannot open JSON file '--x'"
      std::fprintf(stderr, "standalone_mlp: unknown option '%s'\n", arg.c_str());
      std::fprintf(stderr, usage, argv[0], argv[0]);
      return 2;
    }
  }
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, usage, argv[0], argv[0]);
    return 2;
  }
  if (argc >= 3 && std::string(argv[2]) == "--estimate") return estimate(argv[1], argc == 4 ? argv[3] : "1");
  if (argc == 4) {
    std::fprintf(stderr, "usage: %s CONFIG.json [STEPS]\n", argv[0]);
    return 2;
  }
  std::optional<int64_t> steps;
  if (argc == 3) {
    char* end = nullptr;
    long long n = std::strtoll(argv[2], &end, 10);
    if (*end != '\0' || n < 1) {
      std::fprintf(stderr, "standalone_mlp: STEPS must be an integer >= 1, got '%s'\n", argv[2]);
      return 2;
    }
    steps = n;
  }

  std::optional<zs::comm::World> world;
  try {
    world.emplace(zs::comm::World::create());  // under mpirun: MPI; otherwise a world of one
  } catch (const std::exception& e) {
    std::fprintf(stderr, "standalone_mlp: error: %s\n", e.what());
    return 1;
  }
  zs::init_logging({world->rank(), world->size()});
  zs::launch::set_blas_threads(zs::launch::local_rank_count());  // share the cores between local ranks

  // Every rank reads the same file and reaches the same verdict, so rank 0 alone reports it.
  MlpConfig mlp;
  zs::run::RunConfig cfg;
  try {
    cfg = load_config(argv[1], world->size(), mlp);
  } catch (const zs::Error& e) {
    if (world->rank() == 0) std::fprintf(stderr, "standalone_mlp: error: %s\n", e.what());
    return 1;
  }
  zs::init_logging({world->rank(), world->size()}, cfg.log);
  if (steps) cfg.train_steps = *steps;

  try {
    // The data-parallel group, with the config's collective timeout.
    zs::comm::Group dp = world->group().dup("dp", zs::comm::CommConfig{.timeout_s = cfg.comm.timeout_s, .shared_memory = cfg.comm.shared_memory});
    Regressor model(mlp);                     // declares parameters; allocates nothing
    zs::engine::Engine engine(model, cfg, dp);  // places and initialises the parameters (cfg.seed)
    TeacherData data(mlp, cfg.data.seed.value_or(cfg.seed), cfg.batch.train_batch_size);

    ZS_LOG_INFO("model: MLP {} -> {} -> {} ({} parameters); batch {} = {} per rank x {} accumulation x {} rank(s)",
                mlp.d_in, mlp.hidden, mlp.d_out, engine.param_count(), cfg.batch.train_batch_size,
                cfg.batch.micro_batch_per_rank, cfg.batch.gradient_accumulation_steps, world->size());
    double first = 0.0, last = 0.0;
    for (int64_t i = 0; i < cfg.train_steps; ++i) {
      const zs::engine::StepReport& r = engine.train_batch(data);  // accumulation + one optimizer step
      if (i == 0) first = r.loss;
      last = r.loss;
      if (r.step == 1 || r.step % cfg.steps_per_print == 0 || r.step == cfg.train_steps) {
        ZS_LOG_INFO("step {}/{} | loss {:.5f} | lr {:.3e} | grad norm {:.4f}{}", r.step, cfg.train_steps, r.loss,
                    r.lr, r.grad_norm, r.skipped ? " | fp16 overflow: step skipped" : "");
      }
    }
    // The example checks itself: the loss must at least halve. The loss is the global mean, identical
    // on every rank, so every rank returns the same code.
    const bool fell = last < 0.5 * first;
    if (world->rank() == 0) {
      std::printf("%s from %.5f to %.5f in %lld steps on %d rank(s)\n",
                  fell ? "loss fell" : "loss did NOT halve: it went", first, last,
                  static_cast<long long>(cfg.train_steps), world->size());
      std::fflush(stdout);
    }
    return fell ? 0 : 1;
  } catch (const std::exception& e) {
    zs::comm::World::abort(e.what(), 1);  // ends every rank: others may be blocked in a collective
  }
}
