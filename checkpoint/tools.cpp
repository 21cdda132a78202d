#include "checkpoint/tools.h"

#include <boost/json.hpp>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "core/errors.h"
#include "checkpoint/h5.h"
#include "checkpoint/reader.h"

namespace zs::checkpoint {

namespace fs = std::filesystem;
namespace json = boost::json;

CheckpointReader open_checkpoint(const fs::path& path) {
  if (fs::exists(path / kMetadataFile)) return CheckpointReader::open_dir(path);
  return CheckpointReader(path);
}

namespace {

CheckpointReader open_any(const fs::path& path) { return open_checkpoint(path); }

std::string scalar_text(const Scalar& s) {
  return std::visit([](const auto& v) { return fmt::format("{}", v); }, s);
}

std::string shape_text(const std::vector<uint64_t>& shape) { return fmt::format("({})", fmt::join(shape, ", ")); }

void flatten(const json::value& v, const std::string& path, std::map<std::string, json::value>& out) {
  if (v.is_object() && !v.as_object().empty()) {
    for (const auto& [k, child] : v.as_object()) flatten(child, path.empty() ? std::string(k) : path + "." + std::string(k), out);
  } else {
    out[path.empty() ? "(root)" : path] = v;
  }
}

// A config value as people write it: 1 and 0.001, not Boost's 1E0 and 1E-3.
std::string value_text(const json::value& v) {
  if (v.is_double()) return fmt::format("{}", v.get_double());
  if (v.is_array()) {
    std::vector<std::string> items;
    for (const json::value& x : v.as_array()) items.push_back(value_text(x));
    return fmt::format("[{}]", fmt::join(items, ","));
  }
  return printable(json::serialize(v));
}

// Numbers compare as numbers (1.0 and 1 are one value, as the config parser reads them), in arrays
// too; everything else by its JSON text.
bool same_value(const json::value& a, const json::value& b) {
  if (a.is_number() && b.is_number()) return a.to_number<double>() == b.to_number<double>();
  if (a.is_array() && b.is_array()) {
    const json::array &x = a.as_array(), &y = b.as_array();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!same_value(x[i], y[i])) return false;
    }
    return true;
  }
  return json::serialize(a) == json::serialize(b);
}

std::map<std::string, json::value> flat_config(const std::string& text, const std::string& what) {
  std::map<std::string, json::value> out;
  if (text.empty()) return out;
  try {
    flatten(json::parse(text), "", out);
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("{} is not JSON: {}", what, e.what()));
  }
  return out;
}

// Note [compare: state and layout]. `compare` answers "do these two checkpoints hold the same
// training state?", which a load at any world size, stage or offload target relies on: the model and
// optimizer tensors by name and the training scalars. How the state was laid out when it was saved
// (the world size, the tp degree, the ZeRO stage, the offload targets, a one-bit optimizer's per-rank tensors and
// padded flat size) is not state: a load re-slices it. So such differences are reported as
// information (a "layout:" line) and leave the verdict alone, and a 2-rank stage-0 checkpoint equals
// a 1-rank stage-3 one of the same run.
bool is_layout_scalar(const std::string& name) {
  return name == "world_size" || name == "tensor_parallel_size" || name == "zero.stage" || name == "offload_optimizer" || name == "offload_param" ||
         name == "compressed.flat_elements";
}

// A one-bit optimizer's per-rank tensor ("error_feedback.worker.rank1"): one per rank of the saving run.
bool is_rank_local_tensor(const std::string& name) {
  const size_t at = name.rfind(".rank");
  return at != std::string::npos && at + 5 < name.size() &&
         name.find_first_not_of("0123456789", at + 5) == std::string::npos;
}

}  // namespace

std::string inspect(const fs::path& path, const std::optional<std::string>& config_json) {
  std::ostringstream out;
  std::vector<TagInfo> tags;
  std::string latest;
  bool single = fs::exists(path / kMetadataFile);
  if (!single) {
    tags = list_tags(path);
    if (fs::exists(path / kLatestFile)) latest = read_latest(path);
    out << fmt::format("checkpoint root {}: {} tag(s), latest: {}\n", path.string(), tags.size(),
                       latest.empty() ? "(none)" : printable(latest));
    for (const TagInfo& t : tags) {
      CheckpointReader r = CheckpointReader::open_dir(path / t.tag);
      auto step = r.metadata().scalars.find("global_step");
      out << fmt::format("  {}{}  step {}  world_size {}  {} bytes\n", t.tag, t.tag == latest ? " (latest)" : "",
                         step == r.metadata().scalars.end() ? "-" : scalar_text(step->second),
                         r.metadata().layout.world_size, r.stored_bytes());
    }
  }
  CheckpointReader r = single ? CheckpointReader::open_dir(path) : CheckpointReader(path);
  const Metadata& m = r.metadata();
  // Tensors are whole whatever tp degree wrote them (Note [Checkpoint layout]); the degree is information.
  auto tp = m.scalars.find("tensor_parallel_size");
  out << fmt::format("tag {}: format version {}, run id {}, world size {}{}, {} bytes\n", m.tag, m.version, m.run_id,
                     m.layout.world_size, tp == m.scalars.end() ? "" : fmt::format(" (tp {})", scalar_text(tp->second)),
                     r.stored_bytes());
  for (const BufferLayout& b : m.layout.buffers) {
    uint64_t n = 0;
    for (int rank = 0; rank < m.layout.world_size; ++rank) n += b.rank_elements(rank);
    out << fmt::format("  buffer {}: {}, {} elements, {} bytes\n", b.name, memory::dtype_name(b.dtype), n,
                       n * memory::dtype_size(b.dtype));
  }
  uint64_t total = 0;
  for (const TensorInfo& t : m.layout.tensors) {
    out << fmt::format("  tensor {} {} {}\n", t.name, shape_text(t.shape), memory::dtype_name(t.dtype));
    total += t.numel();
  }
  out << fmt::format("  {} tensors, {} elements\n", m.layout.tensors.size(), total);
  for (const auto& [k, v] : m.scalars) out << fmt::format("  scalar {} = {}\n", k, scalar_text(v));
  if (config_json) {
    auto saved = flat_config(m.config_json, "the saved config");
    auto given = flat_config(*config_json, "--config");
    size_t diffs = 0;
    for (const auto& [k, v] : saved) {
      auto it = given.find(k);
      if (it == given.end()) {
        out << fmt::format("  config - {}: {} (only in the checkpoint)\n", printable(k), value_text(v));
        ++diffs;
      } else if (!same_value(v, it->second)) {
        out << fmt::format("  config ~ {}: {} -> {}\n", printable(k), value_text(v), value_text(it->second));
        ++diffs;
      }
    }
    for (const auto& [k, v] : given) {
      if (!saved.contains(k)) {
        out << fmt::format("  config + {}: {} (only in --config)\n", printable(k), value_text(v));
        ++diffs;
      }
    }
    out << fmt::format("  config: {} difference(s)\n", diffs);
  }
  return out.str();
}

size_t consolidate(const fs::path& path, const fs::path& out, uint64_t piece_bytes) {
  CheckpointReader r = open_any(path);
  const Metadata& m = r.metadata();
  h5::Handle file = h5::file_create(out);
  h5::Handle lcpl = h5::plist_create(H5P_LINK_CREATE);
  ZS_H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1), out, "link create list");
  std::vector<float> piece(std::max<uint64_t>(1, piece_bytes / sizeof(float)));
  size_t written = 0;
  for (const TensorInfo& t : m.layout.tensors) {
    const char* buffer = r.holds("fp32", t.name) ? "fp32" : r.holds("params", t.name) ? "params" : nullptr;
    if (buffer == nullptr) continue;  // not a parameter (an optimizer-only tensor)
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    h5::Handle space = h5::dataspace_simple(dims);
    h5::Handle ds(ZS_H5_CHECK(H5Dcreate2(file.get(), t.name.c_str(), H5T_NATIVE_FLOAT, space.get(), lcpl.get(),
                                         H5P_DEFAULT, H5P_DEFAULT),
                              out, fmt::format("create of dataset '{}'", t.name)),
                  H5Dclose);
    h5::write_attr(ds.get(), "source_buffer", std::string_view(buffer), out);
    // Write through a flat view of the dataset: element e of the row-major flattening.
    const uint64_t numel = t.numel();
    hsize_t flat = numel;
    h5::Handle flat_space = h5::dataspace_simple({flat});
    for (uint64_t e = 0; e < numel; e += piece.size()) {
      hsize_t n = std::min<uint64_t>(piece.size(), numel - e);
      r.read(buffer, t.name, e, n, DType::kF32, piece.data());
      h5::Handle mem = h5::dataspace_simple({n});
      // Select elements [e, e+n) of the flattening in the N-d file space, point by row chunks.
      h5::Handle fspace(ZS_H5_CHECK(H5Dget_space(ds.get()), out, "dataspace"), H5Sclose);
      if (dims.size() <= 1) {
        hsize_t start = e;
        if (!dims.empty()) {
          ZS_H5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr), out,
                      "select");
        }
      } else {
        // Row-major rows of the last dimension: the piece covers whole rows except at its ends.
        const hsize_t row = dims.back();
        ZS_H5_CHECK(H5Sselect_none(fspace.get()), out, "select none");
        std::vector<hsize_t> start(dims.size()), count(dims.size(), 1);
        for (uint64_t x = e; x < e + n;) {
          uint64_t in_row = x % row, take = std::min<uint64_t>(row - in_row, e + n - x);
          uint64_t rest = x / row;
          for (size_t d = dims.size() - 1; d-- > 0;) {
            start[d] = rest % dims[d];
            rest /= dims[d];
          }
          start.back() = in_row;
          count.back() = take;
          ZS_H5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr),
                      out, "select");
          x += take;
        }
      }
      ZS_H5_CHECK(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, mem.get(), fspace.get(), H5P_DEFAULT, piece.data()), out,
                  fmt::format("write of '{}'", t.name));
    }
    ++written;
  }
  for (const auto& [k, v] : m.scalars) {
    std::visit([&](const auto& x) { h5::write_attr(file.get(), k.c_str(), x, out); }, v);
  }
  h5::write_attr(file.get(), "zeroshard_source_tag", std::string_view(m.tag), out);
  file.close(out, "file");
  return written;
}

CompareResult compare(const fs::path& a, const fs::path& b, double rtol, double atol) {
  CheckpointReader ra = open_any(a), rb = open_any(b);
  const Layout &la = ra.metadata().layout, &lb = rb.metadata().layout;
  CompareResult res;
  std::ostringstream out;
  auto differ = [&](const std::string& line) {
    res.equal = false;
    out << line << '\n';
  };
  // Note [compare: state and layout]: reported, not a difference.
  size_t layout_notes = 0;
  auto layout = [&](const std::string& line) {
    out << "layout: " << line << '\n';
    ++layout_notes;
  };
  const bool same_world = la.world_size == lb.world_size;
  size_t compared = 0;
  std::vector<float> va, vb;
  std::vector<int32_t> ia, ib;
  const uint64_t piece = 1u << 20;
  for (const TensorInfo& t : la.tensors) {
    int j = lb.find_tensor(t.name);
    if (j < 0) {
      if (!same_world && is_rank_local_tensor(t.name)) layout(fmt::format("tensor {}: only in A (per rank)", t.name));
      else differ(fmt::format("tensor {}: only in A", t.name));
      continue;
    }
    const TensorInfo& u = lb.tensors[static_cast<size_t>(j)];
    if (t.shape != u.shape) {
      differ(fmt::format("tensor {}: shape {} in A, {} in B", t.name, shape_text(t.shape), shape_text(u.shape)));
      continue;
    }
    for (const BufferLayout& buf : la.buffers) {
      bool in_a = ra.holds(buf.name, t.name), in_b = rb.holds(buf.name, t.name);
      if (!in_a && !in_b) continue;
      if (in_a != in_b) {
        differ(fmt::format("{}[{}]: only in {}", buf.name, t.name, in_a ? "A" : "B"));
        continue;
      }
      double max_abs = 0;
      uint64_t bad = 0, first_bad = 0;
      double first_a = 0, first_b = 0;
      // Integer buffers (CAdam's quantised momentum) compare exactly, as integers: they have no fp32
      // reading, and a tolerance means nothing for them.
      const bool integer = buf.dtype == DType::kI32;
      for (uint64_t e = 0; e < t.numel(); e += piece) {
        uint64_t n = std::min(piece, t.numel() - e);
        if (integer) {
          ia.resize(n);
          ib.resize(n);
          ra.read(buf.name, t.name, e, n, DType::kI32, ia.data());
          rb.read(buf.name, t.name, e, n, DType::kI32, ib.data());
        } else {
          va.resize(n);
          vb.resize(n);
          ra.read(buf.name, t.name, e, n, DType::kF32, va.data());
          rb.read(buf.name, t.name, e, n, DType::kF32, vb.data());
        }
        for (uint64_t i = 0; i < n; ++i) {
          const double x = integer ? ia[i] : va[i], y = integer ? ib[i] : vb[i];
          const double d = std::fabs(x - y);
          const bool same = integer ? ia[i] == ib[i] : d <= atol + rtol * std::fabs(y) || (std::isnan(x) && std::isnan(y));
          if (!same && bad++ == 0) {
            first_bad = e + i;
            first_a = x;
            first_b = y;
          }
          if (!std::isnan(d)) max_abs = std::max(max_abs, d);
        }
      }
      ++compared;
      if (bad > 0) {
        differ(fmt::format("{}[{}]: {} of {} elements differ (first at {}: {:g} in A, {:g} in B), max |a-b| {:g}",
                           buf.name, t.name, bad, t.numel(), first_bad, first_a, first_b, max_abs));
      }
    }
  }
  for (const TensorInfo& u : lb.tensors) {
    if (la.find_tensor(u.name) >= 0) continue;
    if (!same_world && is_rank_local_tensor(u.name)) layout(fmt::format("tensor {}: only in B (per rank)", u.name));
    else differ(fmt::format("tensor {}: only in B", u.name));
  }
  const auto &sa = ra.metadata().scalars, &sb = rb.metadata().scalars;
  for (const auto& [k, v] : sa) {
    auto it = sb.find(k);
    const auto report = [&](const std::string& line) { is_layout_scalar(k) ? layout(line) : differ(line); };
    if (it == sb.end()) {
      report(fmt::format("scalar {}: only in A", k));
    } else if (scalar_text(it->second) != scalar_text(v)) {
      report(fmt::format("scalar {}: {} in A, {} in B", k, printable(scalar_text(v)), printable(scalar_text(it->second))));
    }
  }
  for (const auto& [k, v] : sb) {
    if (sa.contains(k)) continue;
    if (is_layout_scalar(k)) layout(fmt::format("scalar {}: only in B", k));
    else differ(fmt::format("scalar {}: only in B", k));
  }
  out << fmt::format("{}: {} tensor buffers compared (rtol {:g}, atol {:g}){}\n", res.equal ? "equal" : "DIFFERENT",
                     compared, rtol, atol,
                     layout_notes == 0 ? "" : fmt::format("; {} layout difference(s), not state", layout_notes));
  res.report = out.str();
  return res;
}

}  // namespace zs::checkpoint
