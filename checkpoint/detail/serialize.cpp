#include "checkpoint/detail/serialize.h"

#include <boost/json.hpp>
#include <fmt/format.h>

#include "core/errors.h"

namespace zs::checkpoint::detail {

namespace json = boost::json;

std::string layout_to_json(const Layout& layout) {
  json::object root;
  root["world_size"] = layout.world_size;
  json::array tensors;
  for (const TensorInfo& t : layout.tensors) {
    json::array shape;
    for (uint64_t d : t.shape) shape.push_back(d);
    tensors.push_back(json::object{{"name", t.name}, {"shape", shape}, {"dtype", memory::dtype_name(t.dtype)}});
  }
  root["tensors"] = std::move(tensors);
  json::array buffers;
  for (const BufferLayout& b : layout.buffers) {
    json::array ranks;
    for (const auto& segments : b.ranks) {
      json::array segs;
      for (const Segment& s : segments) segs.push_back(json::array{s.tensor, s.begin, s.count});
      ranks.push_back(std::move(segs));
    }
    buffers.push_back(json::object{{"name", b.name}, {"dtype", memory::dtype_name(b.dtype)}, {"ranks", ranks}});
  }
  root["buffers"] = std::move(buffers);
  return json::serialize(root);
}

Layout layout_from_json(std::string_view text, const std::filesystem::path& file) {
  try {
    json::value v = json::parse(text);
    const json::object& root = v.as_object();
    Layout layout;
    layout.world_size = json::value_to<int>(root.at("world_size"));
    for (const json::value& tv : root.at("tensors").as_array()) {
      const json::object& t = tv.as_object();
      TensorInfo info;
      info.name = json::value_to<std::string>(t.at("name"));
      for (const json::value& d : t.at("shape").as_array()) info.shape.push_back(json::value_to<uint64_t>(d));
      info.dtype = dtype_from_name(json::value_to<std::string>(t.at("dtype")), file);
      layout.tensors.push_back(std::move(info));
    }
    for (const json::value& bv : root.at("buffers").as_array()) {
      const json::object& b = bv.as_object();
      BufferLayout buffer;
      buffer.name = json::value_to<std::string>(b.at("name"));
      buffer.dtype = dtype_from_name(json::value_to<std::string>(b.at("dtype")), file);
      for (const json::value& rv : b.at("ranks").as_array()) {
        std::vector<Segment> segs;
        for (const json::value& sv : rv.as_array()) {
          const json::array& s = sv.as_array();
          segs.push_back(Segment{json::value_to<uint32_t>(s.at(0)), json::value_to<uint64_t>(s.at(1)),
                                 json::value_to<uint64_t>(s.at(2))});
        }
        buffer.ranks.push_back(std::move(segs));
      }
      layout.buffers.push_back(std::move(buffer));
    }
    layout.validate();
    return layout;
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("checkpoint file '{}': layout_json is not a valid layout: {}", file.string(),
                                      e.what()));
  }
}

hid_t h5_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return H5T_NATIVE_FLOAT;
    case DType::kI32: return H5T_NATIVE_INT32;
    case DType::kBF16:
    case DType::kF16: return H5T_NATIVE_UINT16;
  }
  return H5T_NATIVE_FLOAT;
}

DType dtype_from_name(std::string_view name, const std::filesystem::path& file) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    if (memory::dtype_name(t) == name) return t;
  }
  throw CheckpointError(fmt::format("checkpoint file '{}': unknown dtype '{}'", file.string(), name));
}

}  // namespace zs::checkpoint::detail
