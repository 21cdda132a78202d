#include "comm/world.h"

#include <cstdio>
#include <cstdlib>

#include "comm/detail/runtime.h"
#include "comm/mpi_check.h"
#include "comm/topology.h"

namespace zs::comm {

namespace {

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

}  // namespace

World World::create(const CommConfig& config) { return World(launched_by_mpi() ? Launch::kMpi : Launch::kLocal, config); }

World::World(Launch launch, const CommConfig& config) {
  if (!(config.timeout_s > 0)) {
    throw ConfigError(fmt::format("comm.timeout_s: expected a positive number of seconds, got {}", config.timeout_s));
  }
  if (config.shared_memory_node_ranks < 0) {
    throw ConfigError(fmt::format("comm.shared_memory_node_ranks: expected 0 (the node as MPI finds it) or a positive "
                                  "number of ranks, got {}", config.shared_memory_node_ranks));
  }
  runtime_ = std::make_shared<detail::Runtime>(launch == Launch::kMpi);
  auto state = std::make_shared<detail::GroupState>();
  state->runtime = runtime_;
  state->name = "world";
  state->config = config;
  if (runtime_->uses_mpi()) {
    state->comm = MPI_COMM_WORLD;  // not owned: MPI_Finalize releases it
    state->rank = runtime_->world_rank();
    state->size = runtime_->world_size();
    runtime_->init_hosts(config);  // Note [Bytes across hosts] in comm/config.h
    runtime_->init_shm(config);  // the node window first: init_handshake_comm sets up the group's view of it
    state->init_handshake_comm();
  }
  state->transport = detail::make_transport(*state);  // Note [Transports]: local, or by the window's layout
  group_ = std::make_unique<Group>(std::move(state));
}

World::~World() {
  if (runtime_) runtime_->flush();
}

int World::rank() const { return group_->rank(); }
int World::size() const { return group_->size(); }
bool World::is_mpi() const { return runtime_->uses_mpi(); }

ExpertGroups World::split_groups(int expert_parallel_size) const {
  Topology topology(*group_, {.expert_parallel_size = expert_parallel_size});  // the layout's one definition
  return ExpertGroups{topology.take_data_parallel(), topology.take_expert_parallel(), topology.take_expert_data_parallel()};
}

CommCounters World::counters() const { return runtime_->counters(); }
void World::reset_counters() { runtime_->reset_counters(); }
void World::flush() const { runtime_->flush(); }

void World::abort(const std::string& message, int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool mpi = initialized && !finalized;
  int rank = 0;
  if (mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "zeroshard: rank %d: fatal: %s\n", rank, message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (mpi) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace zs::comm
