#include "bindings.h"
#include "cuda_arguments.h"
#include "typed_arguments.h"

#include <kvcache/core/errors.h>
#include <kvcache/core/kv_cache_config.h>
#include <kvcache/core/kv_cache_layout.h>
#include <kvcache/memory/page_ops.h>

#include <fmt/format.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::python
{
namespace
{

rt::KVLayerConfig layerConfigOf(nb::handle item, size_t index)
{
    rt::KVLayerConfig layer;
    if (nb::try_cast<rt::KVLayerConfig>(item, layer))
    {
        return layer;
    }
    if (!nb::isinstance<nb::tuple>(item) && !nb::isinstance<nb::list>(item))
    {
        throw nb::type_error(
            fmt::format("Config.layer_configs[{}] is neither a KVLayerConfig nor a (num_kv_heads, head_dim"
                        "[, sliding_window[, kind]]) tuple",
                index)
                .c_str());
    }
    nb::sequence const fields = nb::borrow<nb::sequence>(item);
    size_t const count = nb::len(fields);
    if (count < 2 || count > 4)
    {
        throw rt::InvalidArgumentError(fmt::format("Config.layer_configs[{}] has {} fields; expected 2 to 4 "
                                                   "(num_kv_heads, head_dim[, sliding_window[, kind]])",
            index, count));
    }
    std::string const prefix = fmt::format("Config.layer_configs[{}]", index);
    std::string const heads = prefix + ".num_kv_heads";
    std::string const dim = prefix + ".head_dim";
    layer.numKVHeads = toInt32(intArgument(fields[0], heads.c_str()), heads.c_str());
    layer.headDim = toInt32(intArgument(fields[1], dim.c_str()), dim.c_str());
    if (count > 2)
    {
        std::string const window = prefix + ".sliding_window";
        layer.slidingWindow = toInt32(intArgument(fields[2], window.c_str()), window.c_str());
    }
    if (count > 3)
    {
        layer.kind = checkedCast<rt::KVLayerKind>(fields[3], (prefix + ".kind").c_str(), "a KVLayerKind");
    }
    return layer;
}

std::vector<rt::KVLayerConfig> layerConfigsOf(nb::handle items)
{
    requireIterable(items, "Config.layer_configs",
        "a sequence of KVLayerConfig or (num_kv_heads, head_dim[, "
        "sliding_window[, kind]]) tuples");
    std::vector<rt::KVLayerConfig> layers;
    size_t index = 0;
    for (nb::handle item : items)
    {
        layers.push_back(layerConfigOf(item, index));
        ++index;
    }
    return layers;
}

std::vector<int32_t> pagesPerGroupOf(std::vector<int64_t> const& values)
{
    std::vector<int32_t> pages;
    for (size_t i = 0; i < values.size(); ++i)
    {
        pages.push_back(toInt32(values[i], fmt::format("Config.num_pages_per_group[{}]", i).c_str()));
    }
    return pages;
}

//! A read-write int32 field of a bound struct that takes any Python int and names the field when it is out of range.
template <typename Class, typename Field>
void intField(nb::class_<Class>& cls, char const* name, Field Class::*member, char const* owner, char const* doc)
{
    std::string const field = std::string(owner) + "." + name;
    cls.def_prop_rw(
        name, [member](Class const& self) { return static_cast<int64_t>(self.*member); },
        [member, field](Class& self, int64_t value) { self.*member = toInt32(value, field.c_str()); }, doc);
}

//! A read-write list field whose getter returns a copy. def_rw would hand out its elements as references into the
//! C++ vector, which dangle once a new list is assigned to the field.
template <typename Class, typename Field>
void listField(nb::class_<Class>& cls, char const* name, Field Class::*member, char const* doc)
{
    cls.def_prop_rw(
        name, [member](Class const& self) { return self.*member; },
        [member](Class& self, Field value) { self.*member = std::move(value); }, doc);
}

//! Returns `value` as a float32 scale; throws InvalidArgumentError naming `field` for a finite value beyond float32's
//! range (it would turn into an infinity). NaN, infinities and negative values pass: the cache's checks name them.
float scaleOf(double value, char const* field)
{
    constexpr float kLARGEST = std::numeric_limits<float>::max();
    if (std::isfinite(value) && std::fabs(value) > static_cast<double>(kLARGEST))
    {
        throw rt::InvalidArgumentError(fmt::format(
            "{} is {}; it must fit in float32 (|value| <= {})", field, value, static_cast<double>(kLARGEST)));
    }
    return static_cast<float>(value);
}

//! A read-write float32 scale of LayerScales that takes any Python float and names the field when it is too large.
void scaleField(nb::class_<rt::LayerScales>& cls, char const* name, float rt::LayerScales::*member, char const* doc)
{
    std::string const field = std::string("LayerScales.") + name;
    cls.def_prop_rw(
        name, [member](rt::LayerScales const& self) { return static_cast<double>(self.*member); },
        [member, field](rt::LayerScales& self, double value) { self.*member = scaleOf(value, field.c_str()); }, doc);
}

std::string layerRepr(rt::KVLayerConfig const& layer)
{
    return fmt::format("KVLayerConfig(num_kv_heads={}, head_dim={}, sliding_window={}, kind={})", layer.numKVHeads,
        layer.headDim, layer.slidingWindow, layer.kind == rt::KVLayerKind::kLATENT ? "LATENT" : "KV");
}

} // namespace

void bindConfig(nb::module_& m)
{
    nb::enum_<rt::DataType>(m, "DataType", "Element types of a cache or a view.")
        .value("FLOAT32", rt::DataType::kFLOAT)
        .value("FLOAT16", rt::DataType::kHALF)
        .value("BFLOAT16", rt::DataType::kBF16)
        .value("FP8_E4M3", rt::DataType::kFP8_E4M3)
        .value("FP8_E5M2", rt::DataType::kFP8_E5M2)
        .value("INT8", rt::DataType::kINT8)
        .value("UINT8", rt::DataType::kUINT8)
        .value("INT32", rt::DataType::kINT32)
        .value("INT64", rt::DataType::kINT64);
    m.def(
        "data_type_size", [](rt::DataType type) { return rt::dataTypeSize(type); }, nb::arg("dtype"),
        "Returns the bytes of one element of `dtype`.");
    m.def(
        "data_type_name", [](rt::DataType type) { return std::string(rt::dataTypeName(type)); }, nb::arg("dtype"),
        "Returns the printable name of `dtype` ('float16', 'fp8_e4m3', ...).");

    nb::enum_<rt::KVLayerKind>(m, "KVLayerKind", "What one attention layer caches per token.")
        .value("KV", rt::KVLayerKind::kKV, "K and V, each num_kv_heads x head_dim.")
        .value("LATENT", rt::KVLayerKind::kLATENT, "One latent vector of head_dim values, no V (MLA); 1 KV head.");

    nb::enum_<rt::KVQuantization>(m, "KVQuantization",
        "How a cache stores values and the scales it keeps beside them (docs/layout.md, Quantized pages).")
        .value("NONE", rt::KVQuantization::kNONE, "Values as kv_cache_type, no scales.")
        .value("FP8_PER_TENSOR", rt::KVQuantization::kFP8_PER_TENSOR,
            "FP8 E4M3 values, one K and one V float scale a layer on the host: D bytes a token, head and half.")
        .value("FP8_PER_TOKEN_HEAD", rt::KVQuantization::kFP8_PER_TOKEN_HEAD,
            "FP8 E4M3 values and a float32 scale a (page, token, head), K and V: D + 4 bytes.")
        .value("NVFP4", rt::KVQuantization::kNVFP4,
            "E2M1 values two a byte (uint8 storage) and an E4M3 scale a 16 values along D: D/2 + D/16 bytes.");
    m.attr("NVFP4_BLOCK_VALUES") = rt::kNVFP4_BLOCK_VALUES;

    m.attr("TOKENS_PER_PAGE") = rt::kTOKENS_PER_PAGE;
    m.attr("MAX_TOKENS_PER_PAGE") = rt::kMAX_TOKENS_PER_PAGE;
    m.attr("MAX_NUM_PAGES") = rt::kMAX_NUM_PAGES;
    m.attr("UNUSED_PAGE_ENTRY") = rt::kUNUSED_PAGE_ENTRY;
    m.attr("MAX_INLINE_PAGE_OPS") = rt::kMAX_INLINE_PAGE_OPS;
    m.attr("MAX_INLINE_STATE_COPIES") = rt::kMAX_INLINE_STATE_COPIES;

    nb::class_<rt::KVLayerConfig> layer(m, "KVLayerConfig", "Shape of one attention layer's cache.");
    layer.def(
        "__init__",
        [](rt::KVLayerConfig* self, int64_t numKVHeads, int64_t headDim, int64_t slidingWindow, rt::KVLayerKind kind)
        {
            rt::KVLayerConfig const value{toInt32(numKVHeads, "KVLayerConfig.num_kv_heads"),
                toInt32(headDim, "KVLayerConfig.head_dim"), toInt32(slidingWindow, "KVLayerConfig.sliding_window"),
                kind};
            new (self) rt::KVLayerConfig(value);
        },
        nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("sliding_window") = 0,
        nb::arg("kind") = rt::KVLayerKind::kKV);
    intField(layer, "num_kv_heads", &rt::KVLayerConfig::numKVHeads, "KVLayerConfig", "KV heads (1 for LATENT).");
    intField(layer, "head_dim", &rt::KVLayerConfig::headDim, "KVLayerConfig", "Values a head and token.");
    intField(layer, "sliding_window", &rt::KVLayerConfig::slidingWindow, "KVLayerConfig",
        "Tokens attended back over; 0 means full attention.");
    layer.def_rw("kind", &rt::KVLayerConfig::kind, "KV or LATENT.")
        .def("__repr__", &layerRepr)
        .def(
            "__eq__",
            [](rt::KVLayerConfig const& a, rt::KVLayerConfig const& b)
            {
                return a.numKVHeads == b.numKVHeads && a.headDim == b.headDim && a.slidingWindow == b.slidingWindow
                    && a.kind == b.kind;
            },
            nb::sig(kEQ_SIGNATURE));

    nb::class_<rt::LayerScales> layerScales(m, "LayerScales",
        "A layer's host-held scales (KVCacheManager.layer_scales): the FP8_PER_TENSOR decode scales k_scale / v_scale "
        "(finite, >= 0) or the NVFP4 global decode scales of K and V (finite, > 0), float32. A latent layer has no V: "
        "its v is kept and unused. KVCacheManager.set_layer_scales checks them.");
    layerScales.def(
        "__init__",
        [](rt::LayerScales* self, double k, double v) {
            new (self) rt::LayerScales{scaleOf(k, "LayerScales.k"), scaleOf(v, "LayerScales.v")};
        },
        nb::arg("k") = 1.0, nb::arg("v") = 1.0,
        "Both scales default to 1; a float beyond float32's range raises InvalidArgumentError.");
    scaleField(layerScales, "k", &rt::LayerScales::k, "K scale (float32).");
    scaleField(layerScales, "v", &rt::LayerScales::v, "V scale (float32; unused for a latent layer).");
    layerScales
        .def("__repr__",
            [](rt::LayerScales const& self) { return fmt::format("LayerScales(k={:#}, v={:#})", self.k, self.v); })
        .def(
            "__eq__", [](rt::LayerScales const& a, rt::LayerScales const& b) { return a.k == b.k && a.v == b.v; },
            nb::sig(kEQ_SIGNATURE));

    m.attr("MAX_STATE_DIMS") = rt::kMAX_STATE_DIMS;
    m.attr("STATE_TENSOR_ALIGNMENT") = rt::kSTATE_TENSOR_ALIGNMENT;
    nb::class_<rt::StateSplitSegment> splitSegment(m, "StateSplitSegment",
        "A run of a state tensor's split dimension: `parts` parts (heads, groups, channels) of `part_size` entries, "
        "split over the tensor-parallel ranks or, replicated, whole on every rank.");
    splitSegment
        .def(
            "__init__",
            [](rt::StateSplitSegment* self, int64_t parts, int64_t partSize, bool replicated, std::string name)
            { new (self) rt::StateSplitSegment{parts, partSize, replicated, std::move(name)}; },
            nb::arg("parts"), nb::arg("part_size") = 1, nb::arg("replicated") = false, nb::arg("name") = "",
            "Builds a segment; compute_layout checks it against its tensor's shape.")
        .def_rw("parts", &rt::StateSplitSegment::parts, "Parts in the run; tp must divide it unless replicated.")
        .def_rw("part_size", &rt::StateSplitSegment::partSize, "Entries one part spans; a part is never cut.")
        .def_rw("replicated", &rt::StateSplitSegment::replicated, "Whole on every rank instead of split.")
        .def_rw("name", &rt::StateSplitSegment::name, "What the parts are, for messages; may be empty.")
        .def("__repr__",
            [](rt::StateSplitSegment const& self)
            {
                return fmt::format("StateSplitSegment(parts={}, part_size={}, replicated={}, name='{}')", self.parts,
                    self.partSize, self.replicated ? "True" : "False", self.name);
            })
        .def(
            "__eq__",
            [](rt::StateSplitSegment const& a, rt::StateSplitSegment const& b)
            {
                return a.parts == b.parts && a.partSize == b.partSize && a.replicated == b.replicated
                    && a.name == b.name;
            },
            nb::sig(kEQ_SIGNATURE));
    nb::class_<rt::StateTensorConfig> stateTensor(
        m, "StateTensorConfig", "One named tensor of a state layer: one sequence's shape and its dtype.");
    stateTensor
        .def(
            "__init__",
            [](rt::StateTensorConfig* self, std::string name, std::vector<int64_t> shape, rt::DataType dataType,
                int64_t splitDim, std::vector<rt::StateSplitSegment> splitSegments)
            {
                new (self) rt::StateTensorConfig{std::move(name), std::move(shape), dataType,
                    toInt32(splitDim, "StateTensorConfig.split_dim"), std::move(splitSegments)};
            },
            nb::arg("name"), nb::arg("shape"), nb::arg("data_type") = rt::DataType::kFLOAT, nb::kw_only(),
            nb::arg("split_dim") = -1, nb::arg("split_segments") = std::vector<rt::StateSplitSegment>{},
            "Builds a state tensor: a name unique in its layer, 1 to MAX_STATE_DIMS extents and a dtype; split_dim "
            "and split_segments say how tensor parallelism splits it (-1: whole on every rank).")
        .def_rw("name", &rt::StateTensorConfig::name, "Unique within its layer.")
        .def_rw("shape", &rt::StateTensorConfig::shape, "One sequence's extents (a copy: assign a new list).")
        .def_rw("data_type", &rt::StateTensorConfig::dataType, "Element type.");
    intField(stateTensor, "split_dim", &rt::StateTensorConfig::splitDim, "StateTensorConfig",
        "The dimension of shape tensor parallelism splits; -1 keeps the tensor whole on every rank.");
    listField(stateTensor, "split_segments", &rt::StateTensorConfig::splitSegments,
        "split_dim's extent as consecutive segments (a copy: assign a new list); empty: one segment of one entry a "
        "part.");
    nb::class_<rt::StateLayerConfig> stateLayer(
        m, "StateLayerConfig", "A layer with a fixed-size state per sequence (Mamba, gated delta net, ...).");
    stateLayer
        .def(
            "__init__",
            [](rt::StateLayerConfig* self, std::vector<rt::StateTensorConfig> tensors)
            { new (self) rt::StateLayerConfig{std::move(tensors)}; },
            nb::arg("tensors"), "Builds a state layer of at least one tensor.");
    listField(stateLayer, "tensors", &rt::StateLayerConfig::tensors, "Its tensors (a copy: assign a new list).");

    nb::class_<rt::KVCacheConfig> config(m, "Config",
        "What a KVCacheManager allocates: one buffer per attention layer, each [2, num_pages, tokens_per_page, H_i, "
        "D_i]. Every field is checked by compute_layout(), which raises InvalidConfigError.");
    config.def(
        "__init__",
        [](rt::KVCacheConfig* self, LayerConfigsArgument const& layerConfigs, IntArgument const& numAttentionLayers,
            int64_t maxBatchSize, int64_t maxSequenceLength, rt::DataType kvCacheType, int64_t numPages,
            int64_t tokensPerPage, int64_t maxTokensPerStep, std::vector<int64_t> const& numPagesPerGroup,
            uintptr_t memPool, rt::KVQuantization quantization,
            std::vector<rt::StateLayerConfig> const& stateLayerConfigs, int64_t numCheckpointSlots)
        {
            rt::KVCacheConfig value;
            value.layerConfigs = layerConfigsOf(layerConfigs);
            value.numAttentionLayers = numAttentionLayers.is_none()
                ? static_cast<int32_t>(value.layerConfigs.size())
                : toInt32(
                    intArgument(numAttentionLayers, "Config.num_attention_layers"), "Config.num_attention_layers");
            value.maxBatchSize = toInt32(maxBatchSize, "Config.max_batch_size");
            value.maxSequenceLength = toInt32(maxSequenceLength, "Config.max_sequence_length");
            value.kvCacheType = kvCacheType;
            value.numPages = toInt32(numPages, "Config.num_pages");
            value.tokensPerPage = toInt32(tokensPerPage, "Config.tokens_per_page");
            value.maxTokensPerStep = toInt32(maxTokensPerStep, "Config.max_tokens_per_step");
            value.numPagesPerGroup = pagesPerGroupOf(numPagesPerGroup);
            value.memPool = reinterpret_cast<cudaMemPool_t>(memPool);
            value.quantization = quantization;
            value.stateLayerConfigs = stateLayerConfigs;
            value.numCheckpointSlots = toInt32(numCheckpointSlots, "Config.num_checkpoint_slots");
            new (self) rt::KVCacheConfig(std::move(value));
        },
        nb::kw_only(), nb::arg("layer_configs") = nb::list(), nb::arg("num_attention_layers") = nb::none(),
        nb::arg("max_batch_size") = 0, nb::arg("max_sequence_length") = 0,
        nb::arg("kv_cache_type") = rt::DataType::kHALF, nb::arg("num_pages") = 0,
        nb::arg("tokens_per_page") = rt::kTOKENS_PER_PAGE, nb::arg("max_tokens_per_step") = 0,
        nb::arg("num_pages_per_group") = std::vector<int64_t>{}, nb::arg("mem_pool") = 0,
        nb::arg("quantization") = rt::KVQuantization::kNONE,
        nb::arg("state_layer_configs") = std::vector<rt::StateLayerConfig>{}, nb::arg("num_checkpoint_slots") = 0,
        "Builds a config; layer_configs takes KVLayerConfig objects or (num_kv_heads, head_dim[, sliding_window[, "
        "kind]]) tuples, and num_attention_layers defaults to their number; state_layer_configs lists the state "
        "layers of a hybrid model.");
    intField(config, "num_checkpoint_slots", &rt::KVCacheConfig::numCheckpointSlots, "Config",
        "State slots beyond max_batch_size, kept for checkpoints; 0 without state layers.");
    listField(config, "state_layer_configs", &rt::KVCacheConfig::stateLayerConfigs,
        "State layers (a copy: assign a new list to change them); each keeps num_state_slots slots of its tensors.");
    intField(config, "num_attention_layers", &rt::KVCacheConfig::numAttentionLayers, "Config",
        "Number of attention layers; must equal len(layer_configs).");
    intField(config, "max_batch_size", &rt::KVCacheConfig::maxBatchSize, "Config", "Sequences of the slot view.");
    intField(config, "max_sequence_length", &rt::KVCacheConfig::maxSequenceLength, "Config", "Tokens a sequence.");
    intField(config, "num_pages", &rt::KVCacheConfig::numPages, "Config",
        "Pages per half and layer of a one-group cache; 0 means the minimum.");
    intField(config, "tokens_per_page", &rt::KVCacheConfig::tokensPerPage, "Config",
        "Tokens a page: a power of two in [1, MAX_TOKENS_PER_PAGE].");
    intField(config, "max_tokens_per_step", &rt::KVCacheConfig::maxTokensPerStep, "Config",
        "The most tokens a sequence appends in one step; 0 means max_sequence_length.");
    config.def_rw("kv_cache_type", &rt::KVCacheConfig::kvCacheType, "Element type of the cache.")
        .def_rw("quantization", &rt::KVCacheConfig::quantization,
            "How values are stored and scaled; FP8 formats need kv_cache_type FP8_E4M3, NVFP4 needs UINT8 and every "
            "head_dim a multiple of NVFP4_BLOCK_VALUES. KVCacheManager keeps the scales (scale_pool_view, "
            "layer_scales).")
        .def_prop_rw(
            "layer_configs", [](rt::KVCacheConfig const& self) { return self.layerConfigs; },
            [](rt::KVCacheConfig& self, LayerConfigsArgument const& layers)
            { self.layerConfigs = layerConfigsOf(layers); },
            "Per-layer shapes (a copy: assign a new list to change them).")
        .def_prop_rw(
            "num_pages_per_group",
            [](rt::KVCacheConfig const& self)
            { return std::vector<int64_t>(self.numPagesPerGroup.begin(), self.numPagesPerGroup.end()); },
            [](rt::KVCacheConfig& self, std::vector<int64_t> const& pages)
            { self.numPagesPerGroup = pagesPerGroupOf(pages); },
            "Pages per half of each page group's layers (0: the group's minimum); empty means every minimum.")
        .def_prop_rw(
            "mem_pool", [](rt::KVCacheConfig const& self) { return reinterpret_cast<uintptr_t>(self.memPool); },
            [](rt::KVCacheConfig& self, uintptr_t pool) { self.memPool = reinterpret_cast<cudaMemPool_t>(pool); },
            "cudaMemPool_t handle to allocate from; 0 means the device's current pool.")
        .def("__repr__",
            [](rt::KVCacheConfig const& self)
            {
                std::string layers;
                for (rt::KVLayerConfig const& layerConfig : self.layerConfigs)
                {
                    layers += (layers.empty() ? "" : ", ") + layerRepr(layerConfig);
                }
                return fmt::format("Config(num_attention_layers={}, max_batch_size={}, max_sequence_length={}, "
                                   "kv_cache_type={}, quantization={}, num_pages={}, tokens_per_page={}, "
                                   "max_tokens_per_step={}, layer_configs=[{}])",
                    self.numAttentionLayers, self.maxBatchSize, self.maxSequenceLength,
                    rt::dataTypeName(self.kvCacheType), rt::kvQuantizationName(self.quantization), self.numPages,
                    self.tokensPerPage, self.maxTokensPerStep, layers);
            });

    nb::class_<rt::KVLayerLayout> layerLayout(
        m, "KVLayerLayout", "Sizes of one layer's buffer (element counts per half).");
    readOnlyFields(layerLayout, "num_kv_heads", &rt::KVLayerLayout::numKVHeads, "head_dim", &rt::KVLayerLayout::headDim,
        "kind", &rt::KVLayerLayout::kind, "sliding_window", &rt::KVLayerLayout::slidingWindow, "group",
        &rt::KVLayerLayout::group, "num_halves", &rt::KVLayerLayout::numHalves, "slot_tokens",
        &rt::KVLayerLayout::slotTokens, "num_pages", &rt::KVLayerLayout::numPages, "page_elems",
        &rt::KVLayerLayout::pageElems, "page_bytes", &rt::KVLayerLayout::pageBytes, "half_elems",
        &rt::KVLayerLayout::halfElems, "layer_bytes", &rt::KVLayerLayout::layerBytes, "stored_dim",
        &rt::KVLayerLayout::storedDim, "scale_page_bytes", &rt::KVLayerLayout::scalePageBytes, "scale_bytes",
        &rt::KVLayerLayout::scaleBytes);

    nb::class_<rt::KVPageGroupLayout> groupLayout(m, "KVPageGroupLayout", "Layers that share one page-id space.");
    readOnlyFields(groupLayout, "sliding_window", &rt::KVPageGroupLayout::slidingWindow, "pages_per_sequence",
        &rt::KVPageGroupLayout::pagesPerSequence, "slot_tokens", &rt::KVPageGroupLayout::slotTokens, "min_pages",
        &rt::KVPageGroupLayout::minPages, "num_pages", &rt::KVPageGroupLayout::numPages, "layers",
        &rt::KVPageGroupLayout::layers, "bytes_per_page", &rt::KVPageGroupLayout::bytesPerPage, "cache_bytes",
        &rt::KVPageGroupLayout::cacheBytes);

    nb::class_<rt::StateTensorLayout> stateTensorLayout(
        m, "StateTensorLayout", "One state tensor: [num_state_slots, ...shape] at offset_bytes of its layer.");
    readOnlyFields(stateTensorLayout, "name", &rt::StateTensorLayout::name, "shape", &rt::StateTensorLayout::shape,
        "data_type", &rt::StateTensorLayout::dataType, "slot_elems", &rt::StateTensorLayout::slotElems, "slot_bytes",
        &rt::StateTensorLayout::slotBytes, "offset_bytes", &rt::StateTensorLayout::offsetBytes, "bytes",
        &rt::StateTensorLayout::bytes);
    nb::class_<rt::StateLayerLayout> stateLayerLayout(
        m, "StateLayerLayout", "One state layer's allocation: its tensors one after another.");
    readOnlyFields(stateLayerLayout, "tensors", &rt::StateLayerLayout::tensors, "slot_bytes",
        &rt::StateLayerLayout::slotBytes, "layer_bytes", &rt::StateLayerLayout::layerBytes);

    nb::class_<rt::KVCacheLayout> cacheLayout(m, "KVCacheLayout", "The layout maths of a validated config.");
    readOnlyFields(cacheLayout, "max_batch_size", &rt::KVCacheLayout::maxBatchSize, "data_type",
        &rt::KVCacheLayout::dataType, "tokens_per_page", &rt::KVCacheLayout::tokensPerPage, "max_tokens_per_step",
        &rt::KVCacheLayout::maxTokensPerStep, "cap_padded", &rt::KVCacheLayout::capPadded, "pages_per_slot",
        &rt::KVCacheLayout::pagesPerSlot, "min_pages", &rt::KVCacheLayout::minPages, "num_pages",
        &rt::KVCacheLayout::numPages, "element_bytes", &rt::KVCacheLayout::elementBytes, "layers",
        &rt::KVCacheLayout::layers, "groups", &rt::KVCacheLayout::groups, "cache_bytes", &rt::KVCacheLayout::cacheBytes,
        "bytes_per_page", &rt::KVCacheLayout::bytesPerPage, "quantization", &rt::KVCacheLayout::quantization,
        "num_state_slots", &rt::KVCacheLayout::numStateSlots, "num_checkpoint_slots",
        &rt::KVCacheLayout::numCheckpointSlots, "state_layers", &rt::KVCacheLayout::stateLayers, "state_bytes_per_slot",
        &rt::KVCacheLayout::stateBytesPerSlot, "state_bytes", &rt::KVCacheLayout::stateBytes);

    nb::class_<rt::BudgetSplit> budgetSplit(m, "BudgetSplit", "A budget split across page groups (split_budget).");
    readOnlyFields(budgetSplit, "sequences", &rt::BudgetSplit::sequences, "num_pages_per_group",
        &rt::BudgetSplit::numPagesPerGroup, "bytes", &rt::BudgetSplit::bytes, "state_bytes",
        &rt::BudgetSplit::stateBytes);

    m.def("compute_layout", &rt::computeLayout, nb::arg("config"),
        "Validates `config` and returns its layout; raises InvalidConfigError naming the field, value and limit. No "
        "GPU needed.");
    m.def("max_pages_for_budget", &rt::maxPagesForBudget, nb::arg("config"), nb::arg("budget_bytes"),
        "Returns the largest num_pages whose cache fits in budget_bytes (one page group).");
    m.def("split_budget", &rt::splitBudget, nb::arg("config"), nb::arg("budget_bytes"),
        "Splits budget_bytes across the page groups so each holds the same number of full-length sequences.");
}

} // namespace kvcache::python
