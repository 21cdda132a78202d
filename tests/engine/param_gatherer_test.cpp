// ParamGatherer (ZeRO stage 3) driven by hand: fetch and release around every module of a small tree,
// the way the engine's hooks call them, over a CpuBackend arena and a simulated group (one rank: the
// gather is a real copy; several: the sizes and accounting of the real thing, no data).
//
//   - Order: a later pass that meets modules in another order than the recorded first pass, or ends
//     early, or runs past the recorded order, is a ModelError naming the module expected and met.
//   - The live bound: live_peak_bytes() <= live_bound_bytes(); the prefetch window and
//     stage3_max_live_parameters limit what is gathered ahead.
//   - Persistence: small modules stay gathered after release; invalidate() drops everything.
//   - Reuse distance: forward releases whose backward use is near are kept, within the window.
#include "engine/detail/param_gatherer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/errors.h"
#include "engine/flat_layout.h"
#include "engine/partition.h"
#include "memory/allocator.h"
#include "memory/cpu_backend.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace zs::engine {
namespace {

constexpr int64_t kWidth = 8;
constexpr size_t kArenaBytes = 1 << 20;
constexpr size_t kElem = sizeof(float);

// A module with parameters of its own and a child: while the child runs, both are gathered.
class Block final : public nn::Module {
 public:
  Block(int64_t own, int64_t width) {
    declare_param("scale", {own}, nn::Init::ones());
    add_child<nn::Linear>("inner", width, width);
  }
  std::string_view type_name() const override { return "Block"; }

 protected:
  memory::Tensor forward(nn::Context&, const memory::Tensor& x) override { return x; }
  memory::Tensor backward(nn::Context&, const memory::Tensor& dy) override { return dy; }
};

// "0" Linear (own range 72 elements), "1" Block (100, persistent never) with "1.inner" Linear (72),
// "2" Linear (72), "3" LayerNorm (40: weight, padding, bias), "4" Linear (72).
class Tree {
 public:
  static constexpr size_t kLinearRange = kWidth * kWidth + kWidth;
  static constexpr size_t kBlockOwn = 100;
  static constexpr size_t kNormRange = FlatLayout::kAlignElements + kWidth;
  static constexpr size_t kChain = kBlockOwn + kLinearRange;  // Block running with its child

  Tree() {
    root_.append<nn::Linear>(kWidth, kWidth);
    root_.append<Block>(static_cast<int64_t>(kBlockOwn), kWidth);
    root_.append<nn::Linear>(kWidth, kWidth);
    root_.append<nn::LayerNorm>(kWidth);
    root_.append<nn::Linear>(kWidth, kWidth);
    nn::assign_names(root_);
    modules_ = root_.named_modules();
    layout_ = std::make_unique<FlatLayout>(root_.all_params());
  }
  nn::Module& root() { return root_; }
  nn::Module& child(int i) const { return *root_.children()[static_cast<size_t>(i)]; }
  const std::vector<nn::Module*>& modules() const { return modules_; }
  const FlatLayout& layout() const { return *layout_; }
  // Elements from a module's first own parameter to the end of its last (what one gather moves).
  size_t own_range(const nn::Module& m) const {
    auto params = m.params();
    if (params.empty()) return 0;
    const ParamSlot* first = nullptr;
    const ParamSlot* last = nullptr;
    for (const ParamSlot& s : layout_->slots()) {
      if (s.param == params.front()) first = &s;
      if (s.param == params.back()) last = &s;
    }
    return last->offset + last->numel - first->offset;
  }

 private:
  nn::Sequential root_;
  std::vector<nn::Module*> modules_;
  std::unique_ptr<FlatLayout> layout_;
};

// The gatherer over a shard whose element i holds the value of flat element (mine.offset + i).
class Rig {
 public:
  Rig(Tree& tree, const comm::Group& group, ParamGatherer::Options options)
      : tree_(tree),
        options_(options),
        backend_(kArenaBytes),
        device_(backend_, kArenaBytes),
        access_(backend_),
        partition_(tree.layout().total(), group.size(), group.rank()) {
    shard_ = device_.allocate(std::max<size_t>(1, partition_.mine.size) * kElem, memory::Category::kParams,
                              memory::Lifetime::kPersistent);
    auto* values = static_cast<float*>(shard_.data());
    for (size_t i = 0; i < partition_.mine.size; ++i) values[i] = static_cast<float>(partition_.mine.offset + i);
    gatherer_ = std::make_unique<ParamGatherer>(options, tree.layout(), partition_, group, device_,
                                                memory::DType::kF32, shard_.data(), tree.modules());
  }
  ~Rig() {
    gatherer_.reset();
    for (const ParamSlot& s : tree_.layout().slots()) s.param->set_data(memory::Tensor());
  }

  ParamGatherer& gatherer() { return *gatherer_; }
  memory::PoolStats gathered() const { return device_.stats().transient; }
  bool persistent(const nn::Module& m) const { return tree_.own_range(m) < options_.persistence_threshold; }

  // One pass over the root's children (forward: in order; backward: reversed), fetching each module
  // before it runs and releasing it after, children inside their parent. After every fetch: the live
  // bound and the prefetch window hold, and the module's parameters are gathered.
  void pass(ParamGatherer::Pass pass) {
    gatherer_->begin_pass(pass);
    const int n = static_cast<int>(tree_.root().children().size());
    for (int k = 0; k < n; ++k) visit(tree_.child(pass == ParamGatherer::Pass::kForward ? k : n - 1 - k), pass);
    gatherer_->end_pass();
    EXPECT_EQ(running_elements_, 0u);
  }
  void step() {
    pass(ParamGatherer::Pass::kForward);
    pass(ParamGatherer::Pass::kBackward);
  }

  // live - running - persistent: what was gathered ahead (an upper bound of it).
  long long ahead_elements() const {
    return static_cast<long long>(gatherer_->live_bytes() / kElem) - static_cast<long long>(running_elements_) -
           static_cast<long long>(gatherer_->persistent_bytes() / kElem);
  }
  long long max_ahead_elements() const { return max_ahead_; }

 private:
  void visit(nn::Module& m, ParamGatherer::Pass pass) {
    gatherer_->fetch(m);
    const size_t own = persistent(m) ? 0 : tree_.own_range(m);
    running_elements_ += own;
    check_after_fetch(m);
    auto children = m.children();
    if (pass == ParamGatherer::Pass::kBackward) std::reverse(children.begin(), children.end());
    for (nn::Module* c : children) visit(*c, pass);
    gatherer_->release(m);
    running_elements_ -= own;
  }
  void check_after_fetch(nn::Module& m) {
    EXPECT_LE(gatherer_->live_bytes(), gatherer_->live_bound_bytes()) << "after fetching " << m.display_name();
    EXPECT_LE(ahead_elements(), static_cast<long long>(options_.prefetch_elements))
        << "prefetch window exceeded after fetching " << m.display_name();
    max_ahead_ = std::max(max_ahead_, ahead_elements());
    for (nn::Parameter* p : m.params()) {
      ASSERT_TRUE(p->data().defined()) << p->full_name() << " not gathered";
      EXPECT_EQ(p->data().numel(), p->numel());
    }
  }

  Tree& tree_;
  ParamGatherer::Options options_;
  memory::CpuBackend backend_;
  memory::DeviceAllocator device_;
  memory::DeviceAccess access_;
  Partition partition_;
  memory::DeviceBlock shard_;
  std::unique_ptr<ParamGatherer> gatherer_;
  size_t running_elements_ = 0;
  long long max_ahead_ = 0;
};

ParamGatherer::Options options(size_t prefetch, size_t persistence, size_t max_live = 1'000'000'000,
                              size_t max_reuse = 0) {
  ParamGatherer::Options o;
  o.prefetch_elements = prefetch;
  o.persistence_threshold = persistence;
  o.max_live_elements = max_live;
  o.max_reuse_distance = max_reuse;
  return o;
}

// ---------------------------------------------------------------------------------------------------
// Gathering.

TEST(ParamGatherer, AGroupOfOneGathersTheShardIntoTheParameters) {
  const comm::Group group = comm::Group::simulated(0, 1);
  Tree tree;
  Rig rig(tree, group, options(/*prefetch=*/150, /*persistence=*/50));
  for (int step = 0; step < 3; ++step) {
    rig.gatherer().begin_pass(ParamGatherer::Pass::kForward);
    for (int k = 0; k < 5; ++k) {
      nn::Module& m = tree.child(k);
      rig.gatherer().fetch(m);
      for (nn::Module* c : m.children()) rig.gatherer().fetch(*c);
      for (const ParamSlot& s : tree.layout().slots()) {
        if (!s.param->data().defined()) continue;
        auto v = s.param->data().f32();
        for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<float>(s.offset + i)) << s.param->full_name();
      }
      for (nn::Module* c : m.children()) rig.gatherer().release(*c);
      rig.gatherer().release(m);
    }
    rig.gatherer().end_pass();
    rig.gatherer().invalidate();
  }
}

// ---------------------------------------------------------------------------------------------------
// Order errors.

std::string order_error(Rig& rig, ParamGatherer::Pass pass, const std::vector<nn::Module*>& fetches,
                        bool end) {
  rig.gatherer().begin_pass(pass);
  try {
    for (nn::Module* m : fetches) {
      rig.gatherer().fetch(*m);
      rig.gatherer().release(*m);
    }
    if (end) rig.gatherer().end_pass();
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

class ParamGathererOrder : public ::testing::TestWithParam<ParamGatherer::Pass> {};

TEST_P(ParamGathererOrder, AnotherOrderIsAModelErrorNamingTheModuleExpectedAndMet) {
  const comm::Group group = comm::Group::simulated(1, 3);
  Tree tree;
  Rig rig(tree, group, options(150, 0));
  rig.step();  // records both passes
  rig.step();  // follows them
  nn::Module& expected = GetParam() == ParamGatherer::Pass::kForward ? tree.child(1) : tree.child(3);
  nn::Module& met = tree.child(2);
  nn::Module& first = GetParam() == ParamGatherer::Pass::kForward ? tree.child(0) : tree.child(4);
  const std::string what = order_error(rig, GetParam(), {&first, &met}, true);
  ASSERT_FALSE(what.empty()) << "a different order was not detected";
  EXPECT_NE(what.find("expected module '" + expected.display_name() + "' at position 1"), std::string::npos) << what;
  EXPECT_NE(what.find("met '2'"), std::string::npos) << what;
  EXPECT_NE(what.find(GetParam() == ParamGatherer::Pass::kForward ? "forward" : "backward"), std::string::npos) << what;
  EXPECT_NE(what.find("same order every step"), std::string::npos) << "the message says the fix: " << what;
}

TEST_P(ParamGathererOrder, APassEndingEarlyIsAModelErrorNamingTheNextModule) {
  const comm::Group group = comm::Group::simulated(0, 2);
  Tree tree;
  Rig rig(tree, group, options(150, 0));
  rig.step();
  const bool fwd = GetParam() == ParamGatherer::Pass::kForward;
  if (!fwd) rig.pass(ParamGatherer::Pass::kForward);
  // Recorded forward: 0, 1, 1.inner, 2, 3, 4; backward: 4, 3, 2, 1, 1.inner, 0.
  std::vector<nn::Module*> some = fwd ? std::vector<nn::Module*>{&tree.child(0), &tree.child(1)}
                                      : std::vector<nn::Module*>{&tree.child(4), &tree.child(3)};
  const std::string what = order_error(rig, GetParam(), some, true);
  ASSERT_FALSE(what.empty()) << "a pass ending early was not detected";
  EXPECT_NE(what.find("fetched 2 modules' parameters, but the recorded order has 6"), std::string::npos) << what;
  EXPECT_NE(what.find(fwd ? "next expected: '1.inner'" : "next expected: '2'"), std::string::npos) << what;
  EXPECT_NE(what.find(fwd ? "forward" : "backward"), std::string::npos) << what;
}

TEST_P(ParamGathererOrder, APassRunningPastTheRecordedOrderIsAModelError) {
  const comm::Group group = comm::Group::simulated(0, 1);
  Tree tree;
  Rig rig(tree, group, options(150, 0));
  rig.step();
  const bool fwd = GetParam() == ParamGatherer::Pass::kForward;
  if (!fwd) rig.pass(ParamGatherer::Pass::kForward);
  std::vector<nn::Module*> order;
  for (int k = 0; k < 5; ++k) {
    nn::Module& m = tree.child(fwd ? k : 4 - k);
    order.push_back(&m);  // a parent is fetched before its children in both passes
    for (nn::Module* c : m.children()) order.push_back(c);
  }
  order.push_back(&tree.child(2));  // one more
  const std::string what = order_error(rig, GetParam(), order, false);
  EXPECT_NE(what.find("expected module '<end of pass>' at position 6, met '2'"), std::string::npos) << what;
}

INSTANTIATE_TEST_SUITE_P(Passes, ParamGathererOrder,
                         ::testing::Values(ParamGatherer::Pass::kForward, ParamGatherer::Pass::kBackward),
                         [](const ::testing::TestParamInfo<ParamGatherer::Pass>& info) {
                           return std::string(info.param == ParamGatherer::Pass::kForward ? "Forward" : "Backward");
                         });

// A first pass cut short by an exception (a layer's OutOfMemoryError in the first forward, caught by a
// caller that retries) must not leave its partial order behind: the next first pass records afresh.
TEST(ParamGathererRecording, AnInterruptedFirstPassIsRecordedAfresh) {
  const comm::Group group = comm::Group::simulated(0, 1);
  Tree tree;
  Rig rig(tree, group, options(150, 0));
  rig.gatherer().begin_pass(ParamGatherer::Pass::kForward);
  rig.gatherer().fetch(tree.child(0));  // ... and the module's forward throws
  rig.gatherer().release(tree.child(0));
  rig.step();  // records both passes afresh (a kept partial order would fail here, at module 1)
  rig.step();  // follows the new recording, prefetching from it
  EXPECT_GT(rig.max_ahead_elements(), 0) << "the second step prefetched nothing: no order was recorded";
  // The recording is the whole pass, not the interrupted one's single module: ending after module 0
  // is an error that counts the six recorded fetches.
  const std::string what = order_error(rig, ParamGatherer::Pass::kForward, {&tree.child(0)}, true);
  EXPECT_NE(what.find("fetched 1 modules' parameters, but the recorded order has 6"), std::string::npos) << what;
}

// ---------------------------------------------------------------------------------------------------
// The live bound.

TEST(ParamGathererLive, PeakStaysWithinTheBoundAndThePrefetchWindow) {
  // Persistence 50: the LayerNorm only; 80: every module but the Block's own; 101: all of them.
  for (size_t prefetch : {0u, 72u, 150u, 250u, 1000u}) {
    for (size_t persistence : {0u, 50u, 80u, 101u}) {
      const comm::Group group = comm::Group::simulated(1, 3);
      Tree tree;
      Rig rig(tree, group, options(prefetch, persistence));
      size_t persistent_elements = 0;
      for (nn::Module* m : tree.modules()) persistent_elements += rig.persistent(*m) ? tree.own_range(*m) : 0;
      nn::Module& block = tree.child(1);
      nn::Module& inner = *block.children().front();
      size_t chain = 0;
      for (nn::Module* m : {&tree.child(0), &tree.child(2), &tree.child(3), &tree.child(4)}) {
        chain = std::max(chain, rig.persistent(*m) ? 0 : tree.own_range(*m));
      }
      chain = std::max(chain, (rig.persistent(block) ? 0 : tree.own_range(block)) +
                                  (rig.persistent(inner) ? 0 : tree.own_range(inner)));
      EXPECT_EQ(rig.gatherer().persistent_bytes(), persistent_elements * kElem);
      EXPECT_EQ(rig.gatherer().live_bound_bytes(), (chain + prefetch + persistent_elements) * kElem);
      for (int step = 0; step < 3; ++step) {
        rig.step();
        EXPECT_EQ(rig.gatherer().live_bytes(), rig.gatherer().persistent_bytes()) << "after step " << step;
        rig.gatherer().invalidate();
        EXPECT_EQ(rig.gatherer().live_bytes(), 0u);
      }
      EXPECT_LE(rig.gatherer().live_peak_bytes(), rig.gatherer().live_bound_bytes())
          << "prefetch " << prefetch << ", persistence " << persistence;
      // Prefetch does work ahead when the window lets it (a Linear is 72 elements) and something is
      // not persistent.
      if (prefetch >= Tree::kLinearRange && persistence <= 50) {
        EXPECT_GT(rig.max_ahead_elements(), 0) << "prefetch " << prefetch;
      }
      if (prefetch == 0) {
        EXPECT_LE(rig.max_ahead_elements(), 0);
      }
    }
  }
}

TEST(ParamGathererLive, MaxLiveParametersLimitsPrefetch) {
  const comm::Group group = comm::Group::simulated(0, 2);
  // Without a live limit, a large window gathers far ahead.
  size_t unlimited_peak = 0;
  {
    Tree tree;
    Rig rig(tree, group, options(/*prefetch=*/1000, /*persistence=*/0));
    for (int step = 0; step < 3; ++step) {
      rig.step();
      rig.gatherer().invalidate();
    }
    unlimited_peak = rig.gatherer().live_peak_bytes();
  }
  constexpr size_t kMaxLive = 200;
  ASSERT_GT(unlimited_peak, kMaxLive * kElem);
  ASSERT_GE(kMaxLive, Tree::kChain);  // what runs fits: only prefetch is limited
  Tree tree;
  Rig rig(tree, group, options(/*prefetch=*/1000, /*persistence=*/0, kMaxLive));
  for (int step = 0; step < 3; ++step) {
    rig.step();
    rig.gatherer().invalidate();
  }
  EXPECT_LE(rig.gatherer().live_peak_bytes(), kMaxLive * kElem);
  EXPECT_GT(rig.max_ahead_elements(), 0) << "prefetch within the live limit still happens";
}

// ---------------------------------------------------------------------------------------------------
// Persistence and invalidation.

TEST(ParamGathererPersistence, PersistentModulesStayGatheredAfterRelease) {
  const comm::Group group = comm::Group::simulated(0, 1);
  Tree tree;
  Rig rig(tree, group, options(/*prefetch=*/0, /*persistence=*/50));
  nn::Module& norm = tree.child(3);    // 40 elements: persistent
  nn::Module& linear = tree.child(2);  // 72: not
  rig.gatherer().begin_pass(ParamGatherer::Pass::kForward);
  for (nn::Module* m : {&norm, &linear}) {
    rig.gatherer().fetch(*m);
    rig.gatherer().release(*m);
  }
  for (nn::Parameter* p : norm.params()) EXPECT_TRUE(p->data().defined()) << p->full_name();
  for (nn::Parameter* p : linear.params()) EXPECT_FALSE(p->data().defined()) << p->full_name();
  EXPECT_EQ(rig.gatherer().live_bytes(), Tree::kNormRange * kElem);
  EXPECT_EQ(rig.gatherer().persistent_bytes(), Tree::kNormRange * kElem);
  // Its copy is a persistent block of the arena (allocated with the gatherer), not a transient one.
  EXPECT_EQ(rig.gathered().live_blocks, 0u);
  const void* copy = norm.params().front()->data().raw();
  // A persistent module is gathered once per step, not once per use.
  const uint64_t gathers = rig.gatherer().gathers();
  rig.gatherer().fetch(norm);
  rig.gatherer().release(norm);
  EXPECT_EQ(rig.gatherer().gathers(), gathers);
  rig.gatherer().end_pass();

  // The step changed the shards: the stale copy goes, and the next use gathers it again.
  rig.gatherer().invalidate();
  for (nn::Parameter* p : norm.params()) EXPECT_FALSE(p->data().defined()) << p->full_name();
  EXPECT_EQ(rig.gatherer().live_bytes(), 0u);
  rig.gatherer().begin_pass(ParamGatherer::Pass::kForward);
  rig.gatherer().fetch(norm);
  EXPECT_EQ(rig.gatherer().gathers(), gathers + 1);
  EXPECT_EQ(norm.params().front()->data().raw(), copy) << "gathered again into the same persistent block";
  EXPECT_EQ(rig.gathered().alloc_count, 1u) << "only the Linear's gather allocated a transient block";
  const ParamSlot* slot = nullptr;
  for (const ParamSlot& s : tree.layout().slots()) {
    if (s.param == norm.params().front()) slot = &s;
  }
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(norm.params().front()->data().f32()[3], static_cast<float>(slot->offset + 3));
}

TEST(ParamGathererPersistence, InvalidateDropsEverythingEvenPrefetchesInFlight) {
  const comm::Group group = comm::Group::simulated(2, 3);
  Tree tree;
  Rig rig(tree, group, options(/*prefetch=*/1000, /*persistence=*/50));
  rig.step();
  // Mid-pass: module 0 running, the rest prefetched (collectives not completed: a simulated group's
  // complete only when waited for).
  rig.gatherer().begin_pass(ParamGatherer::Pass::kForward);
  rig.gatherer().fetch(tree.child(0));
  ASSERT_GT(rig.gathered().live_blocks, 2u);
  rig.gatherer().invalidate();
  EXPECT_EQ(rig.gatherer().live_bytes(), 0u);
  EXPECT_EQ(rig.gathered().live_blocks, 0u);
  for (const ParamSlot& s : tree.layout().slots()) EXPECT_FALSE(s.param->data().defined()) << s.param->full_name();
  // The prefetch accounting starts over: later steps still respect the window and the bound.
  for (int step = 0; step < 2; ++step) {
    rig.step();
    rig.gatherer().invalidate();
  }
  EXPECT_LE(rig.gatherer().live_peak_bytes(), rig.gatherer().live_bound_bytes());
}

// ---------------------------------------------------------------------------------------------------
// Reuse distance (Note [reuse distance]).

// Gathers of one step (forward and backward) after the orders are recorded.
uint64_t gathers_per_step(Rig& rig) {
  const uint64_t before = rig.gatherer().gathers();
  rig.step();
  rig.gatherer().invalidate();
  return rig.gatherer().gathers() - before;
}

TEST(ParamGathererReuse, ForwardReleasesWithinTheDistanceAreNotGatheredAgainInTheBackward) {
  // Six modules, none persistent: forward 0, 1, 1.inner, 2, 3, 4; backward 4, 3, 2, 1, 1.inner, 0.
  // Distance of a forward release = the forward's elements after it + the backward's before the
  // module's first backward fetch: 4 -> 0 + 0, 3 -> 72 + 72, 2 -> 112 + 112, the Block (released
  // after its child) -> 184 + 184, 1.inner -> 184 + 284 (the Block comes first in the backward),
  // 0 -> 356 + 356. Each distance reached keeps one more module: one gather less per step.
  const comm::Group group = comm::Group::simulated(0, 1);
  struct Case {
    size_t reuse;
    uint64_t gathers;
  };
  for (const Case c : {Case{0, 12}, Case{143, 11}, Case{144, 10}, Case{223, 10}, Case{224, 9}, Case{368, 8},
                       Case{467, 8}, Case{468, 7}, Case{711, 7}, Case{712, 6}, Case{1'000'000'000, 6}}) {
    Tree tree;
    Rig rig(tree, group, options(/*prefetch=*/1000, /*persistence=*/0, 1'000'000'000, c.reuse));
    rig.step();  // records both orders: nothing kept yet
    rig.gatherer().invalidate();
    EXPECT_EQ(rig.gatherer().reuse_keeps(), 0u);
    for (int step = 0; step < 2; ++step) {
      const uint64_t backward = rig.gatherer().backward_gathers();
      EXPECT_EQ(gathers_per_step(rig), c.gathers) << "max_reuse_distance " << c.reuse << ", step " << step;
      // The forward gathers its 6 modules; the backward those the forward did not keep.
      EXPECT_EQ(rig.gatherer().backward_gathers() - backward, c.gathers - 6) << "max_reuse_distance " << c.reuse;
    }
    EXPECT_EQ(rig.gatherer().reuse_keeps(), 2 * (12 - c.gathers));
    EXPECT_LE(rig.gatherer().live_peak_bytes(), rig.gatherer().live_bound_bytes());
  }
}

TEST(ParamGathererReuse, KeptModulesHoldTheirValuesAndTakeRoomInThePrefetchWindow) {
  const comm::Group group = comm::Group::simulated(0, 1);
  // Window 150: the forward's last two modules, the LayerNorm (40) and the last Linear (72), are kept
  // (112 elements); the earlier ones were not: each of their releases found the window holding the
  // modules prefetched after them.
  Tree tree;
  Rig rig(tree, group, options(/*prefetch=*/150, /*persistence=*/0, 1'000'000'000, 1'000'000'000));
  rig.step();
  rig.gatherer().invalidate();
  rig.gatherer().begin_pass(ParamGatherer::Pass::kForward);
  for (int k = 0; k < 5; ++k) {
    nn::Module& m = tree.child(k);
    rig.gatherer().fetch(m);
    for (nn::Module* c : m.children()) {
      rig.gatherer().fetch(*c);
      rig.gatherer().release(*c);
    }
    rig.gatherer().release(m);
  }
  rig.gatherer().end_pass();
  EXPECT_EQ(rig.gatherer().reuse_keeps(), 2u);
  for (int k : {3, 4}) {
    for (nn::Parameter* p : tree.child(k).params()) EXPECT_TRUE(p->data().defined()) << p->full_name();
  }
  for (int k : {0, 1, 2}) {
    for (nn::Parameter* p : tree.child(k).params()) EXPECT_FALSE(p->data().defined()) << p->full_name();
  }
  EXPECT_EQ(rig.gatherer().live_bytes(), (Tree::kLinearRange + Tree::kNormRange) * kElem);
  // The kept copy is the gathered one: element i of the flat parameters holds i.
  const nn::Parameter* weight = tree.child(4).params().front();
  const ParamSlot* slot = nullptr;
  for (const ParamSlot& s : tree.layout().slots()) {
    if (s.param == weight) slot = &s;
  }
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(weight->data().f32()[5], static_cast<float>(slot->offset + 5));
  // The backward finds them gathered: its first two fetches start no gather of their own.
  const uint64_t gathers = rig.gatherer().gathers();
  rig.gatherer().begin_pass(ParamGatherer::Pass::kBackward);
  rig.gatherer().fetch(tree.child(4));
  EXPECT_EQ(rig.gatherer().gathers(), gathers + 1) << "only the prefetch of module 2 (the window has room again)";
  // The optimizer step's invalidate drops kept copies too.
  rig.gatherer().invalidate();
  EXPECT_EQ(rig.gatherer().live_bytes(), 0u);
}

}  // namespace
}  // namespace zs::engine
