// The kvmm Python module (_kvmm), part 1: kvmm::Error as kvmm.Error, the spec layer
// (layer groups, KVLayout, presets, the Hugging Face config reader), the package-owned
// int32 Buffer with the buffer protocol and DLPack, and the memory layer's Arena (host
// memory, or CUDA VMM where a driver is present). All one-off calls; exports are O(1) views.
#include "bindings.hpp"

#include "kvmm/checked.hpp"
#include "kvmm/distributed/page_descriptors.hpp"
#include "kvmm/error.hpp"
#include "kvmm/memory/arena_page_pool.hpp"
#include "kvmm/memory/chunk_pool.hpp"
#include "kvmm/memory/cuda_memory.hpp"
#include "kvmm/memory/host_memory.hpp"
#include "kvmm/memory/kv_arena.hpp"
#include "kvmm/spec/hf_config.hpp"
#include "kvmm/spec/presets.hpp"
#include "kvmm/version.hpp"

#include <pybind11/stl.h>

#include <optional>

#include <fmt/ranges.h>

#include <limits>
#include <memory>
#include <string>

namespace kvmm::py_bind {

namespace {

// DLPack v0.x ABI (the struct layout every consumer reads; dlpack.h is not a Debian
// package, so the few fields are declared here).
struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

// What one exported tensor owns: the shape it points at and a reference to its owner.
struct DLContext {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape;
  PyObject* owner = nullptr;
};

void dl_deleter(DLManagedTensor* t) {
  auto* ctx = static_cast<DLContext*>(t->manager_ctx);
  py::gil_scoped_acquire gil;  // consumers may call the deleter from any thread
  Py_XDECREF(ctx->owner);
  delete ctx;
}

// The capsule's destructor: a capsule never consumed (still named "dltensor") frees its
// tensor; a consumed one ("used_dltensor") belongs to its consumer.
void dl_capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (t != nullptr && t->deleter != nullptr) t->deleter(t);
}

}  // namespace

py::capsule make_dlpack(py::handle owner, void* data, std::int32_t device_type, std::int32_t device_id,
                        std::uint8_t code, std::uint8_t bits, const std::vector<std::int64_t>& shape) {
  auto ctx = std::make_unique<DLContext>();
  ctx->shape = shape;
  ctx->owner = owner.ptr();
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = data;
  t.device = {device_type, device_id};
  t.ndim = static_cast<std::int32_t>(ctx->shape.size());
  t.dtype = {code, bits, 1};
  t.shape = ctx->shape.data();
  t.strides = nullptr;  // C-contiguous
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = dl_deleter;
  PyObject* cap = PyCapsule_New(&ctx->managed, "dltensor", dl_capsule_destructor);
  if (cap == nullptr) throw py::error_already_set();
  Py_XINCREF(ctx->owner);
  ctx.release();
  return py::reinterpret_steal<py::capsule>(cap);
}

Buffer::Buffer(std::vector<py::ssize_t> s) : shape(std::move(s)) {
  // The element count and the byte count must fit py::ssize_t (numpy and the buffer protocol
  // compute strides and sizes in it): a wrapped product would expose the huge shape over a
  // small (or empty) vector.
  constexpr auto kMaxBytes = std::numeric_limits<py::ssize_t>::max();
  py::ssize_t n = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) throw py::value_error(fmt::format("shape[{}] = {}: a negative extent", i, shape[i]));
    if (__builtin_mul_overflow(n, shape[i], &n) || n > kMaxBytes / py::ssize_t{sizeof(std::int32_t)})
      throw py::value_error(fmt::format("shape = [{}]: more int32 elements than an array can address (shape[{}] = {})",
                                        fmt::join(shape, ", "), i, shape[i]));
  }
  data.assign(static_cast<std::size_t>(n), 0);
  ++live;  // last: a constructor that raises never counts
}

py::array view_of(const py::object& buffer) {
  Buffer& b = buffer.cast<Buffer&>();
  std::vector<py::ssize_t> strides(b.shape.size());
  py::ssize_t stride = sizeof(std::int32_t);
  for (std::size_t i = b.shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= b.shape[i];
  }
  return py::array(py::dtype::of<std::int32_t>(), b.shape, strides, b.data.data(), buffer);
}

py::array view_prefix(const py::object& buffer, py::ssize_t n) {
  Buffer& b = buffer.cast<Buffer&>();
  if (n < 0 || n > b.size()) fail("view of {} elements: the buffer holds {}", n, b.size());
  return py::array(py::dtype::of<std::int32_t>(), {n}, {py::ssize_t{sizeof(std::int32_t)}}, b.data.data(), buffer);
}

Int32Out int32_out(const py::handle& obj, const char* what) {
  if (!PyObject_CheckBuffer(obj.ptr()))
    throw py::type_error(fmt::format("{}: expected a writable int32 array, got {}", what,
                                     std::string(py::str(obj.get_type().attr("__name__")))));
  Int32Out out;
  auto view = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    throw py::type_error(fmt::format("{}: the array must be writable and C-contiguous", what));
  }
  out.info = py::buffer_info(view.release(), true);  // owns the view: releases and deletes it
  const std::string& f = out.info.format;
  const bool int32 = out.info.itemsize == 4 && (f == "i" || f == "=i" || f == "<i" || (f == "l" && sizeof(long) == 4));
  if (!int32)
    throw py::type_error(
        fmt::format("{}: dtype must be int32, got format '{}' of {} bytes", what, f, out.info.itemsize));
  out.data = static_cast<std::int32_t*>(out.info.ptr);
  out.size = static_cast<std::size_t>(out.info.size);
  return out;
}

void bind_buffer(py::module_& m) {
  py::class_<Buffer>(m, "Buffer", py::buffer_protocol(),
                     "int32 storage owned by kvmm (page-table exports): buffer protocol and DLPack, zero copy")
      .def(py::init([](std::vector<py::ssize_t> shape) { return Buffer(std::move(shape)); }), py::arg("shape"))
      .def_buffer([](Buffer& b) {
        std::vector<py::ssize_t> strides(b.shape.size());
        py::ssize_t stride = sizeof(std::int32_t);
        for (std::size_t i = b.shape.size(); i-- > 0;) {
          strides[i] = stride;
          stride *= b.shape[i];
        }
        return py::buffer_info(b.data.data(), sizeof(std::int32_t), py::format_descriptor<std::int32_t>::format(),
                               static_cast<py::ssize_t>(b.shape.size()), b.shape, strides);
      })
      .def_property_readonly("shape", [](const Buffer& b) { return py::tuple(py::cast(b.shape)); })
      .def("__len__", [](const Buffer& b) { return b.shape.empty() ? 0 : b.shape[0]; })
      .def(
          "numpy", [](const py::object& self) { return view_of(self); }, "A zero-copy numpy view")
      .def(
          "__dlpack__",
          [](const py::object& self, const py::object& stream) {
            if (!stream.is_none() && !(py::isinstance<py::int_>(stream) && stream.cast<long long>() == -1))
              fail("stream = {}: a CPU buffer takes stream None", std::string(py::repr(stream)));
            Buffer& b = self.cast<Buffer&>();
            std::vector<std::int64_t> shape(b.shape.begin(), b.shape.end());
            return make_dlpack(self, b.data.data(), kDLCpu, 0, kDLInt, 32, shape);
          },
          py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const Buffer&) { return py::make_tuple(kDLCpu, 0); });
  m.def(
      "_live_buffers", [] { return Buffer::live; }, "kvmm.Buffer objects alive (leak tests)");
}

namespace {

LayoutOptions layout_options(std::uint64_t max_large_page_bytes, std::uint64_t alignment,
                             SliceLayers slice = LayoutOptions{}.slice_layers) {
  LayoutOptions o{.max_large_page_bytes = max_large_page_bytes, .padded_page_alignment = alignment};
  o.slice_layers = slice;
  return o;
}

void bind_layer_group(py::module_& m) {
  py::enum_<LayerKind>(m, "LayerKind")
      .value("FULL_ATTENTION", LayerKind::kFullAttention)
      .value("SLIDING_WINDOW", LayerKind::kSlidingWindow)
      .value("CHUNKED_LOCAL", LayerKind::kChunkedLocal)
      .value("MAMBA_STATE", LayerKind::kMambaState)
      .value("CROSS_ATTENTION", LayerKind::kCrossAttention)
      .value("VISION_EMBEDDING", LayerKind::kVisionEmbedding);
  py::enum_<KvStorage>(m, "KvStorage")
      .value("KEY_VALUE", KvStorage::kKeyValue)
      .value("LATENT", KvStorage::kLatent)
      .value("KEY_ONLY", KvStorage::kKeyOnly);
  py::enum_<KVOrder>(m, "KVOrder", "Order of (token, kv head) inside a page's K and V regions (kv_order.hpp)")
      .value("TOKEN_MAJOR", KVOrder::kTokenMajor)
      .value("HEAD_MAJOR", KVOrder::kHeadMajor);
  py::class_<DraftRole>(m, "DraftRole",
                        "A draft group's role: its target group, the ids after a position its KV depends on, and how "
                        "many steps sooner its pages are evicted (docs/speculative.md)")
      .def(py::init([](std::string target, std::uint32_t successor_tokens, std::uint32_t evict_sooner_steps) {
             return DraftRole{.target = std::move(target),
                              .successor_tokens = successor_tokens,
                              .evict_sooner_steps = evict_sooner_steps};
           }),
           py::arg("target"), py::arg("successor_tokens") = 0, py::arg("evict_sooner_steps") = 0)
      .def_readwrite("target", &DraftRole::target)
      .def_readwrite("successor_tokens", &DraftRole::successor_tokens)
      .def_readwrite("evict_sooner_steps", &DraftRole::evict_sooner_steps)
      .def("__repr__", [](const DraftRole& d) {
        return fmt::format("DraftRole('{}', successor_tokens={}, evict_sooner_steps={})", d.target, d.successor_tokens,
                           d.evict_sooner_steps);
      });
  py::class_<LayerGroup>(m, "LayerGroup", "Layers sharing one per-token shape and one dependency rule")
      .def(py::init<>())
      .def_readwrite("name", &LayerGroup::name)
      .def_readwrite("kind", &LayerGroup::kind)
      .def_readwrite("num_layers", &LayerGroup::num_layers)
      .def_readwrite("kv_heads", &LayerGroup::kv_heads)
      .def_readwrite("head_dim", &LayerGroup::head_dim)
      .def_readwrite("dtype_bytes", &LayerGroup::dtype_bytes)
      .def_readwrite("tokens_per_page", &LayerGroup::tokens_per_page)
      .def_readwrite("window", &LayerGroup::window)
      .def_readwrite("chunk", &LayerGroup::chunk)
      .def_readwrite("state_bytes_per_layer", &LayerGroup::state_bytes_per_layer)
      .def_readwrite("embedding_bytes_per_token", &LayerGroup::embedding_bytes_per_token)
      .def_readonly("storage", &LayerGroup::storage)
      .def_readonly("rope_dim", &LayerGroup::rope_dim)
      .def_readonly("tied_to", &LayerGroup::tied_to)
      .def_property_readonly("k_format", [](const LayerGroup& g) { return g.k_element().describe(); })
      .def_property_readonly("v_format",
                             [](const LayerGroup& g) { return g.has_v() ? g.v_element().describe() : std::string(); })
      .def_property_readonly("state_tensors",
                             [](const LayerGroup& g) {
                               py::list out;
                               for (const StateTensor& t : g.state_tensors)
                                 out.append(py::make_tuple(t.name, t.shape, t.format.describe(), t.bytes()));
                               return out;
                             })
      .def_property(
          "draft", [](const LayerGroup& g) { return g.draft; },
          [](LayerGroup& g, std::optional<DraftRole> d) { g.draft = std::move(d); },
          "A draft group's DraftRole, None for other groups (docs/speculative.md)")
      .def_readwrite("tagged_checkpoints", &LayerGroup::tagged_checkpoints)
      .def_readwrite("kv_order", &LayerGroup::kv_order)
      .def_readwrite("layers", &LayerGroup::layers,
                     "The model layer index of each page slot; empty: KVLayout.plan numbers them")
      .def_readwrite("successor_tokens", &LayerGroup::successor_tokens,
                     "A target group keyed with this many ids after each page, as a draft's (EAGLE / MTP layers "
                     "sharing the target's pages; full attention only; docs/speculative.md)")
      .def("is_draft", &LayerGroup::is_draft)
      .def("is_plain", &LayerGroup::is_plain)
      .def_static("full_attention", &LayerGroup::full_attention, py::arg("name"), py::arg("layers"),
                  py::arg("kv_heads"), py::arg("head_dim"), py::arg("dtype_bytes") = 2, py::arg("tokens_per_page") = 16)
      .def_static("sliding_window", &LayerGroup::sliding_window, py::arg("name"), py::arg("layers"),
                  py::arg("kv_heads"), py::arg("head_dim"), py::arg("dtype_bytes"), py::arg("tokens_per_page"),
                  py::arg("window"))
      .def_static("chunked_local", &LayerGroup::chunked_local, py::arg("name"), py::arg("layers"), py::arg("kv_heads"),
                  py::arg("head_dim"), py::arg("dtype_bytes"), py::arg("tokens_per_page"), py::arg("chunk"))
      .def_static("mamba_state", &LayerGroup::mamba_state, py::arg("name"), py::arg("layers"),
                  py::arg("state_bytes_per_layer"), py::arg("checkpoint_interval") = 512)
      .def_static("cross_attention", &LayerGroup::cross_attention, py::arg("name"), py::arg("layers"),
                  py::arg("kv_heads"), py::arg("head_dim"), py::arg("dtype_bytes") = 2, py::arg("tokens_per_page") = 16)
      .def_static("vision_embedding", &LayerGroup::vision_embedding, py::arg("name"), py::arg("bytes_per_token"),
                  py::arg("tokens_per_page") = 16)
      .def("is_state", &LayerGroup::is_state)
      .def("is_decoder", &LayerGroup::is_decoder)
      .def("bytes_per_token", &LayerGroup::bytes_per_token)
      .def("natural_page_bytes", &LayerGroup::natural_page_bytes)
      .def("pages_for_tokens", &LayerGroup::pages_for_tokens, py::arg("num_tokens"))
      .def("validate", &LayerGroup::validate)
      .def("__repr__", [](const LayerGroup& g) {
        return fmt::format("LayerGroup('{}', {}, layers={}, tokens_per_page={})", g.name, to_string(g.kind),
                           g.num_layers, g.tokens_per_page);
      });
}

void bind_layout(py::module_& m) {
  const LayoutOptions d;
  py::enum_<SliceLayers>(m, "SliceLayers", "LayoutOptions::slice_layers (kvmm/spec/layer_slicing.hpp)")
      .value("OFF", SliceLayers::kOff)
      .value("SMALLEST_WHEN_DENSE", SliceLayers::kSmallestWhenDense);
  py::class_<KVLayout>(m, "KVLayout", "Where every byte of a model's KV memory lives (planned once)")
      .def_static(
          "plan",
          [](std::vector<LayerGroup> groups, std::uint64_t max_large, std::uint64_t align, bool fit,
             std::uint32_t max_states, SliceLayers slice, std::uint32_t slice_above) {
            LayoutOptions o = layout_options(max_large, align);
            o.fit_tokens_per_page = fit;
            o.max_state_pages_per_large_page = max_states;
            o.slice_layers = slice;
            o.slice_above_pages_per_large_page = slice_above;
            return KVLayout::plan(std::move(groups), o);
          },
          py::arg("groups"), py::arg("max_large_page_bytes") = d.max_large_page_bytes,
          py::arg("padded_page_alignment") = d.padded_page_alignment,
          py::arg("fit_tokens_per_page") = d.fit_tokens_per_page,
          py::arg("max_state_pages_per_large_page") = d.max_state_pages_per_large_page,
          py::arg("slice_layers") = d.slice_layers,
          py::arg("slice_above_pages_per_large_page") = d.slice_above_pages_per_large_page)
      .def_property_readonly("num_groups", &KVLayout::num_groups)
      .def_property_readonly("num_model_layers", &KVLayout::num_model_layers)
      .def(
          "layer_group",
          [](const KVLayout& l, std::uint32_t i) {
            const LayerSlot s = l.layer_group(i);
            return py::make_tuple(s.group, s.slot);
          },
          py::arg("model_layer"), "(group, slot) of a model layer: the first group holding it")
      .def(
          "layer_slots",
          [](const KVLayout& l, std::uint32_t i) {
            py::list out;
            for (const LayerSlot& s : l.layer_slots(i)) out.append(py::make_tuple(s.group, s.slot));
            return out;
          },
          py::arg("model_layer"), "[(group, slot)] of every group holding a model layer")
      .def("model_layer", &KVLayout::model_layer, py::arg("g"), py::arg("slot"))
      .def("source_group", &KVLayout::source_group, py::arg("g"))
      .def_property_readonly("sliced", &KVLayout::sliced)
      .def("group", &KVLayout::group, py::arg("g"))
      .def_property_readonly("groups", &KVLayout::groups)
      .def("find_group", &KVLayout::find_group, py::arg("name"))
      .def_property_readonly("large_page_bytes", &KVLayout::large_page_bytes)
      .def("small_page_bytes", &KVLayout::small_page_bytes, py::arg("g"))
      .def("natural_page_bytes", &KVLayout::natural_page_bytes, py::arg("g"))
      .def("small_pages_per_large_page", &KVLayout::small_pages_per_large_page, py::arg("g"))
      .def(
          "padding_fraction",
          [](const KVLayout& l, std::optional<GroupId> g) { return g ? l.padding_fraction(*g) : l.padding_fraction(); },
          py::arg("g") = py::none())
      .def_property_readonly("padded", &KVLayout::padded)
      .def_property_readonly("natural_lcm_bytes", &KVLayout::natural_lcm_bytes)
      .def("requested_tokens_per_page", &KVLayout::requested_tokens_per_page, py::arg("g"))
      .def_property_readonly("tokens_per_page_fitted", &KVLayout::tokens_per_page_fitted)
      .def("k_offset", &KVLayout::k_offset, py::arg("g"), py::arg("layer"))
      .def("v_offset", &KVLayout::v_offset, py::arg("g"), py::arg("layer"))
      .def("state_offset", &KVLayout::state_offset, py::arg("g"), py::arg("layer"))
      .def("state_tensor_offset", &KVLayout::state_tensor_offset, py::arg("g"), py::arg("layer"), py::arg("tensor"))
      .def("layer_stride_bytes", &KVLayout::layer_stride_bytes, py::arg("g"))
      .def("alignment_bytes", &KVLayout::alignment_bytes, py::arg("g"))
      .def("describe", &KVLayout::describe)
      .def("fingerprint", &layout_fingerprint, "layout_fingerprint: 64 bits over what a page's bytes mean")
      .def("__str__", &KVLayout::describe)
      .def("__repr__", [](const KVLayout& l) {
        return fmt::format("KVLayout({} groups, large_page_bytes={})", l.num_groups(), l.large_page_bytes());
      });
}

void bind_presets(py::module_& m) {
  py::module_ p = m.def_submodule("presets", "Layouts of published models");
  const presets::PresetOptions d;
  auto opts = [](std::uint32_t tpp, std::uint32_t dtype, std::uint32_t state_dtype, std::uint32_t interval, bool vision,
                 std::uint64_t max_large, std::uint64_t align, std::string kv_cache_dtype, SliceLayers slice) {
    return presets::PresetOptions{.tokens_per_page = tpp,
                                  .dtype_bytes = dtype,
                                  .state_dtype_bytes = state_dtype,
                                  .mamba_checkpoint_interval = interval,
                                  .vision_embedding = vision,
                                  .layout = layout_options(max_large, align, slice),
                                  .kv_cache_dtype = std::move(kv_cache_dtype)};
  };
  p.def("names", &presets::names);
  p.def("state_heavy_names", &presets::state_heavy_names);
  p.def("speculative_names", &presets::speculative_names);
  p.def(
      "by_name",
      [opts](std::string_view name, std::uint32_t tpp, std::uint32_t dtype, std::uint32_t state_dtype,
             std::uint32_t interval, bool vision, std::uint64_t max_large, std::uint64_t align,
             std::string kv_cache_dtype, SliceLayers slice) {
        return presets::by_name(
            name, opts(tpp, dtype, state_dtype, interval, vision, max_large, align, std::move(kv_cache_dtype), slice));
      },
      py::arg("name"), py::kw_only(), py::arg("tokens_per_page") = d.tokens_per_page,
      py::arg("dtype_bytes") = d.dtype_bytes, py::arg("state_dtype_bytes") = d.state_dtype_bytes,
      py::arg("mamba_checkpoint_interval") = d.mamba_checkpoint_interval,
      py::arg("vision_embedding") = d.vision_embedding, py::arg("max_large_page_bytes") = d.layout.max_large_page_bytes,
      py::arg("padded_page_alignment") = d.layout.padded_page_alignment, py::arg("kv_cache_dtype") = d.kv_cache_dtype,
      py::arg("slice_layers") = d.layout.slice_layers);
}

void bind_hf_config(py::module_& m) {
  py::class_<AttentionParams>(m, "AttentionParams")
      .def_readonly("num_q_heads", &AttentionParams::num_q_heads)
      .def_readonly("num_kv_heads", &AttentionParams::num_kv_heads)
      .def_readonly("head_dim", &AttentionParams::head_dim)
      .def_readonly("sliding_window", &AttentionParams::sliding_window)
      .def_readonly("softcap", &AttentionParams::softcap)
      .def_readonly("query_pre_attn_scalar", &AttentionParams::query_pre_attn_scalar)
      .def_readonly("scale", &AttentionParams::scale)
      .def_readonly("attention_chunk", &AttentionParams::attention_chunk)
      .def_readonly("learned_sinks", &AttentionParams::learned_sinks)
      .def_readonly("kv_lora_rank", &AttentionParams::kv_lora_rank)
      .def_readonly("qk_rope_head_dim", &AttentionParams::qk_rope_head_dim)
      .def_readonly("v_head_dim", &AttentionParams::v_head_dim);
  py::enum_<LayerRole>(m, "LayerRole")
      .value("OWN", LayerRole::kOwn)
      .value("SHARED_KV", LayerRole::kSharedKv)
      .value("NO_CACHE", LayerRole::kNoCache);
  py::class_<LayerPlacement>(m, "LayerPlacement")
      .def_readonly("group", &LayerPlacement::group)
      .def_readonly("index", &LayerPlacement::index)
      .def_readonly("role", &LayerPlacement::role)
      .def_readonly("kv_owner", &LayerPlacement::kv_owner)
      .def_property_readonly("aux_group",
                             [](const LayerPlacement& p) -> std::optional<GroupId> {
                               if (p.aux_group == kNoAuxGroup) return std::nullopt;
                               return p.aux_group;
                             })
      .def_readonly("aux_index", &LayerPlacement::aux_index);
  py::class_<ModelSpec>(m, "ModelSpec", "A Hugging Face config.json read into a KVLayout and per-layer placement")
      .def_readonly("model_type", &ModelSpec::model_type)
      .def_readonly("layout", &ModelSpec::layout)
      .def_readonly("layers", &ModelSpec::layers)
      .def_readonly("attention", &ModelSpec::attention);
  const HfConfigOptions d;
  auto opts = [](std::uint32_t tpp, std::uint32_t dtype, std::uint32_t state_dtype, std::uint32_t interval,
                 std::uint64_t max_large, std::uint64_t align, std::string kv_cache_dtype, bool python_literals,
                 SliceLayers slice) {
    HfConfigOptions o{.tokens_per_page = tpp,
                      .dtype_bytes = dtype,
                      .state_dtype_bytes = state_dtype,
                      .mamba_checkpoint_interval = interval,
                      .layout = layout_options(max_large, align, slice)};
    o.kv_cache_dtype = std::move(kv_cache_dtype);
    o.python_literals = python_literals;
    return o;
  };
  m.def(
      "read_hf_config",
      [opts](std::string_view text, std::string_view source, std::uint32_t tpp, std::uint32_t dtype,
             std::uint32_t state_dtype, std::uint32_t interval, std::uint64_t max_large, std::uint64_t align,
             std::string kv_cache_dtype, bool python_literals, SliceLayers slice) {
        return read_hf_config(text, source,
                              opts(tpp, dtype, state_dtype, interval, max_large, align, std::move(kv_cache_dtype),
                                   python_literals, slice));
      },
      py::arg("json_text"), py::arg("source") = "<memory>", py::kw_only(),
      py::arg("tokens_per_page") = d.tokens_per_page, py::arg("dtype_bytes") = d.dtype_bytes,
      py::arg("state_dtype_bytes") = d.state_dtype_bytes,
      py::arg("mamba_checkpoint_interval") = d.mamba_checkpoint_interval,
      py::arg("max_large_page_bytes") = d.layout.max_large_page_bytes,
      py::arg("padded_page_alignment") = d.layout.padded_page_alignment, py::arg("kv_cache_dtype") = d.kv_cache_dtype,
      py::arg("python_literals") = d.python_literals, py::arg("slice_layers") = d.layout.slice_layers);
  m.def(
      "read_hf_config_file",
      [opts](const std::string& path, std::uint32_t tpp, std::uint32_t dtype, std::uint32_t state_dtype,
             std::uint32_t interval, std::uint64_t max_large, std::uint64_t align, std::string kv_cache_dtype,
             bool python_literals, SliceLayers slice) {
        return read_hf_config_file(path, opts(tpp, dtype, state_dtype, interval, max_large, align,
                                              std::move(kv_cache_dtype), python_literals, slice));
      },
      py::arg("path"), py::kw_only(), py::arg("tokens_per_page") = d.tokens_per_page,
      py::arg("dtype_bytes") = d.dtype_bytes, py::arg("state_dtype_bytes") = d.state_dtype_bytes,
      py::arg("mamba_checkpoint_interval") = d.mamba_checkpoint_interval,
      py::arg("max_large_page_bytes") = d.layout.max_large_page_bytes,
      py::arg("padded_page_alignment") = d.layout.padded_page_alignment, py::arg("kv_cache_dtype") = d.kv_cache_dtype,
      py::arg("python_literals") = d.python_literals, py::arg("slice_layers") = d.layout.slice_layers);
  m.def("hf_config_model_types", &hf_config_model_types);
}

}  // namespace

void bind_spec(py::module_& m) {
  bind_layer_group(m);
  bind_layout(m);
  bind_presets(m);
  bind_hf_config(m);
}

namespace {

// An Arena: its backend (host or CUDA), a chunk pool just big enough, the KVArena and its
// page pool. Raises kvmm::Error for a bad device / backing or no CUDA driver.
std::unique_ptr<Arena> make_arena(const KVLayout& layout, std::uint32_t num_large_pages, const std::string& device,
                                  const std::string& backing, std::uint64_t chunk_bytes, std::uint32_t max_chunks,
                                  int cuda_device) {
  if (device != "cpu" && device != "cuda") fail("device = '{}': expected 'cpu' or 'cuda'", device);
  if (backing != "full" && backing != "elastic") fail("backing = '{}': expected 'full' or 'elastic'", backing);
  auto a = std::make_unique<Arena>();
  a->cuda = device == "cuda";
  a->device = cuda_device;
  if (a->cuda) {
    if (!CudaMemory::available()) fail("device = 'cuda': {}", CudaMemory::unavailable_reason());
    a->backend = std::make_unique<CudaMemory>(CudaMemoryOptions{.device = cuda_device, .chunk_bytes = chunk_bytes});
  } else {
    a->backend = std::make_unique<HostMemory>(HostMemoryOptions{.chunk_bytes = chunk_bytes});
  }
  const std::uint64_t bytes = checked_mul(num_large_pages, layout.large_page_bytes(), "arena bytes");
  // Each large page may straddle one extra chunk boundary.
  const std::uint64_t need =
      checked_add(checked_ceil_div(bytes, a->backend->chunk_bytes(), "arena chunks"), num_large_pages, "arena chunks");
  const std::uint64_t chunks = max_chunks != 0 ? max_chunks : need;
  if (chunks >= kNoChunk) fail("max_chunks = {}: the arena needs at most 2^32-2 chunks", chunks);
  a->pool =
      std::make_unique<ChunkPool>(*a->backend, ChunkPoolOptions{.max_chunks = static_cast<std::uint32_t>(chunks)});
  a->arena = std::make_unique<KVArena>(
      *a->pool, layout,
      KVArenaOptions{.num_large_pages = num_large_pages,
                     .backing = backing == "full" ? ArenaBacking::kFull : ArenaBacking::kElastic});
  a->pages = std::make_unique<ArenaPagePool>(*a->arena);
  return a;
}

}  // namespace

void bind_memory(py::module_& m) {
  py::class_<Arena>(m, "Arena",
                    "A KVArena: all large pages in one virtual range, on host memory or (device='cuda') CUDA VMM")
      .def(py::init(&make_arena), py::arg("layout"), py::arg("num_large_pages"), py::kw_only(),
           py::arg("device") = "cpu", py::arg("backing") = "full", py::arg("chunk_bytes") = std::uint64_t{2} << 20,
           py::arg("max_chunks") = 0, py::arg("cuda_device") = 0)
      .def_property_readonly("device", [](const Arena& a) { return a.cuda ? "cuda" : "cpu"; })
      .def_property_readonly(
          "base", [](const Arena& a) { return a.arena->base(); }, "Address of large page 0 (device pointer on CUDA)")
      .def_property_readonly("bytes", [](const Arena& a) { return a.arena->bytes(); })
      .def_property_readonly("num_large_pages", [](const Arena& a) { return a.arena->num_large_pages(); })
      .def_property_readonly("large_page_bytes", [](const Arena& a) { return a.arena->large_page_bytes(); })
      .def_property_readonly("chunk_bytes", [](const Arena& a) { return a.arena->chunk_bytes(); })
      .def_property_readonly("num_backed_chunks", [](const Arena& a) { return a.arena->num_backed_chunks(); })
      .def_property_readonly("elastic", [](const Arena& a) { return a.arena->backing() == ArenaBacking::kElastic; })
      .def(
          "large_page_address",
          [](const Arena& a, std::uint32_t p) { return a.arena->large_page_address(LargePageId{p}); },
          py::arg("large_page"))
      .def(
          "small_page_address", [](const Arena& a, GroupId g, PageId p) { return a.arena->small_page_address(g, p); },
          py::arg("group"), py::arg("page"))
      .def(
          "layer_view",
          [](const Arena& a, GroupId g, std::uint32_t layer) {
            const PagedLayerView v = a.arena->layer_view(g, layer);
            return py::make_tuple(v.k_base, v.v_base, v.page_stride);
          },
          py::arg("group"), py::arg("layer"), "(k_base, v_base, page_stride) of one layer, as paged kernels take them")
      .def(
          "numpy",
          [](const py::object& self) {
            const Arena& a = self.cast<const Arena&>();
            if (a.cuda) fail("numpy(): the arena is on the device; use __dlpack__ (torch.from_dlpack)");
            if (a.arena->backing() != ArenaBacking::kFull)
              fail("numpy(): an elastic arena has unbacked chunks that fault on access; use backing='full'");
            return py::array(py::dtype("uint8"), {static_cast<py::ssize_t>(a.arena->bytes())}, {py::ssize_t{1}},
                             a.arena->data(), self);
          },
          "The whole (fully backed, host) arena as a zero-copy uint8 array")
      .def(
          "__dlpack__",
          [](const py::object& self, const py::object&) {
            const Arena& a = self.cast<const Arena&>();
            if (!a.cuda && a.arena->backing() != ArenaBacking::kFull)
              fail("__dlpack__: an elastic host arena has unbacked chunks that fault on access");
            return make_dlpack(self, a.arena->data(), a.cuda ? kDLCuda : kDLCpu, a.device, kDLUInt, 8,
                               {static_cast<std::int64_t>(a.arena->bytes())});
          },
          py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const Arena& a) { return py::make_tuple(a.cuda ? kDLCuda : kDLCpu, a.device); })
      .def("check_invariants", [](const Arena& a) { a.pages->check_invariants(); });
  m.def("cuda_available", &CudaMemory::available, "Whether the CUDA VMM backend can run here");
  m.def("cuda_unavailable_reason", &CudaMemory::unavailable_reason);
}

}  // namespace kvmm::py_bind

PYBIND11_MODULE(_kvmm, m) {
  namespace kb = kvmm::py_bind;
  m.doc() = "kvmm: KV-cache memory management for LLM inference engines (C++ core, pybind11 binding)";
  m.attr("__version__") = KVMM_VERSION;
  pybind11::register_exception<kvmm::Error>(m, "Error", PyExc_RuntimeError);
  m.attr("NULL_PAGE") = kvmm::kNullPage;
  kb::bind_buffer(m);
  kb::bind_spec(m);
  kb::bind_memory(m);
  kb::bind_manager(m);
}
