#include "plan_options.h"

#include "model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <limits>
#include <system_error>
#include <utility>

namespace kvcache::plan
{
namespace
{

constexpr std::array<rt::DataType, 7> kCACHE_TYPES = {rt::DataType::kFLOAT, rt::DataType::kHALF, rt::DataType::kBF16,
    rt::DataType::kFP8_E4M3, rt::DataType::kFP8_E5M2, rt::DataType::kINT8, rt::DataType::kUINT8};

// Six decimal places keep fraction * unit (at most 10^6 * 2^40) inside int64.
constexpr size_t kMAX_FRACTION_DIGITS = 6;

std::string_view trim(std::string_view text)
{
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())) != 0)
    {
        text.remove_prefix(1);
    }
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())) != 0)
    {
        text.remove_suffix(1);
    }
    return text;
}

std::string toLower(std::string_view text)
{
    std::string lower(text);
    for (char& c : lower)
    {
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return lower;
}

//! Parses all of `text` as a decimal integer; empty when it is not one or does not fit int64.
std::optional<int64_t> parseInteger(std::string_view text)
{
    int64_t value = 0;
    auto const [end, status] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || status != std::errc{} || end != text.data() + text.size())
    {
        return std::nullopt;
    }
    return value;
}

int32_t parseCount(std::string_view flag, std::string_view text, int32_t minimum, int32_t maximum)
{
    std::optional<int64_t> const value = parseInteger(text);
    if (!value || *value < minimum || *value > maximum)
    {
        throw UsageError(
            fmt::format("{} expects a whole number in [{}, {}], got \"{}\"", flag, minimum, maximum, text));
    }
    return static_cast<int32_t>(*value);
}

std::optional<int64_t> unitBytes(std::string_view unit)
{
    std::string const lower = toLower(unit);
    int64_t const kibi = 1024;
    int64_t const kilo = 1000;
    if (lower.empty() || lower == "b")
    {
        return 1;
    }
    std::array<std::string_view, 4> const prefixes = {"k", "m", "g", "t"};
    int64_t binary = 1;
    int64_t decimal = 1;
    for (std::string_view const prefix : prefixes)
    {
        binary *= kibi;
        decimal *= kilo;
        if (lower.size() == 3 && lower.compare(0, 1, prefix) == 0 && lower.compare(1, 2, "ib") == 0)
        {
            return binary;
        }
        if (lower.size() == 2 && lower.compare(0, 1, prefix) == 0 && lower[1] == 'b')
        {
            return decimal;
        }
    }
    return std::nullopt;
}

//! A flag that takes a whole number of at least `minimum`, and where it goes.
struct CountFlag
{
    std::string_view flag;
    int32_t minimum;
    int32_t maximum;
    void (*set)(PlanOptions& options, int32_t value);
};

constexpr int32_t kINT32_MAX = std::numeric_limits<int32_t>::max();

constexpr std::array<CountFlag, 9> kCOUNT_FLAGS = {{
    {"--batch", 1, kINT32_MAX, [](PlanOptions& options, int32_t value) { options.maxBatchSize = value; }},
    {"--seq-len", 1, kINT32_MAX, [](PlanOptions& options, int32_t value) { options.maxSequenceLength = value; }},
    {"--page-size", 1, kINT32_MAX, [](PlanOptions& options, int32_t value) { options.tokensPerPage = value; }},
    {"--pages", 0, kINT32_MAX, [](PlanOptions& options, int32_t value) { options.numPages = value; }},
    {"--step-tokens", 0, kINT32_MAX, [](PlanOptions& options, int32_t value) { options.maxTokensPerStep = value; }},
    {"--tp", 1, kINT32_MAX, [](PlanOptions& options, int32_t value) { options.tp = value; }},
    {"--layers", 1, kMAX_MODEL_LAYERS, [](PlanOptions& options, int32_t value) { options.numLayers = value; }},
    {"--kv-heads", 1, kINT32_MAX, [](PlanOptions& options, int32_t value) { options.numKVHeads = value; }},
    {"--head-dim", 1, kINT32_MAX, [](PlanOptions& options, int32_t value) { options.headDim = value; }},
}};

//! Returns the count flag named `flag`, or nullptr.
CountFlag const* findCountFlag(std::string_view flag)
{
    auto const it = std::find_if(
        kCOUNT_FLAGS.begin(), kCOUNT_FLAGS.end(), [&](CountFlag const& count) { return count.flag == flag; });
    return it == kCOUNT_FLAGS.end() ? nullptr : &*it;
}

} // namespace

int64_t parseByteSize(std::string_view flag, std::string_view text)
{
    auto const fail = [&](std::string_view why) -> UsageError
    {
        return UsageError(
            fmt::format("{} expects a size such as 40GiB, 512MiB, 1.5TiB or 80GB, got \"{}\" ({})", flag, text, why));
    };
    std::string_view const body = trim(text);
    size_t const numberEnd = std::min(body.find_first_not_of("0123456789."), body.size());
    std::string_view const number = body.substr(0, numberEnd);
    std::string_view const unit = trim(body.substr(numberEnd));

    size_t const point = number.find('.');
    std::string_view const whole = number.substr(0, point);
    std::string_view const fraction = point == std::string_view::npos ? std::string_view{} : number.substr(point + 1);
    if (whole.empty())
    {
        throw fail("no number");
    }
    if (fraction.find('.') != std::string_view::npos || (point != std::string_view::npos && fraction.empty()))
    {
        throw fail("not a number");
    }
    if (fraction.size() > kMAX_FRACTION_DIGITS)
    {
        throw fail(fmt::format("at most {} decimal places", kMAX_FRACTION_DIGITS));
    }
    std::optional<int64_t> const multiplier = unitBytes(unit);
    if (!multiplier)
    {
        throw fail(fmt::format("unknown unit \"{}\"; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB", unit));
    }
    std::optional<int64_t> const wholeValue = parseInteger(whole);
    int64_t bytes = 0;
    if (!wholeValue || __builtin_mul_overflow(*wholeValue, *multiplier, &bytes))
    {
        throw fail("more bytes than int64 holds");
    }
    if (!fraction.empty())
    {
        int64_t scale = 1;
        for (size_t i = 0; i < fraction.size(); ++i)
        {
            scale *= 10;
        }
        int64_t const fractionBytes = *parseInteger(fraction) * *multiplier / scale;
        if (__builtin_add_overflow(bytes, fractionBytes, &bytes))
        {
            throw fail("more bytes than int64 holds");
        }
    }
    return bytes;
}

std::vector<rt::KVLayerConfig> parseLayerHeads(std::string_view flag, std::string_view text)
{
    std::vector<rt::KVLayerConfig> layers;
    std::string_view rest = text;
    while (true)
    {
        size_t const comma = rest.find(',');
        std::string_view const entry = trim(rest.substr(0, comma));
        size_t const cross = entry.find_first_of("xX");
        std::optional<int64_t> const heads =
            cross == std::string_view::npos ? std::nullopt : parseInteger(trim(entry.substr(0, cross)));
        std::optional<int64_t> const dim =
            cross == std::string_view::npos ? std::nullopt : parseInteger(trim(entry.substr(cross + 1)));
        int64_t const limit = std::numeric_limits<int32_t>::max();
        if (!heads || !dim || *heads < 1 || *dim < 1 || *heads > limit || *dim > limit)
        {
            throw UsageError(fmt::format("{} expects comma-separated HxD entries with positive H and D, such as "
                                         "8x128,8x128,2x64; entry {} is \"{}\" in \"{}\"",
                flag, layers.size(), entry, text));
        }
        if (layers.size() >= static_cast<size_t>(kMAX_MODEL_LAYERS))
        {
            throw UsageError(
                fmt::format("{} lists more than {} layers, kvcache-plan's limit", flag, kMAX_MODEL_LAYERS));
        }
        layers.push_back({static_cast<int32_t>(*heads), static_cast<int32_t>(*dim)});
        if (comma == std::string_view::npos)
        {
            return layers;
        }
        rest.remove_prefix(comma + 1);
    }
}

rt::DataType parseDataType(std::string_view flag, std::string_view text)
{
    std::string names;
    for (rt::DataType const type : kCACHE_TYPES)
    {
        if (rt::dataTypeName(type) == text)
        {
            return type;
        }
        names += fmt::format("{}{}", names.empty() ? "" : "|", rt::dataTypeName(type));
    }
    throw UsageError(fmt::format("{} expects one of {}, got \"{}\"", flag, names, text));
}

// The formats of --kv-dtype, as engines name them (vLLM's --kv-cache-dtype fp8 is per tensor; fp8-token-head keeps a
// float32 scale a token and head; nvfp4 stores E2M1 pairs in uint8 with E4M3 block scales).
constexpr std::array<KVFormat, 5> kKV_FORMATS = {{
    {"fp16", rt::DataType::kHALF, rt::KVQuantization::kNONE},
    {"bf16", rt::DataType::kBF16, rt::KVQuantization::kNONE},
    {"fp8", rt::DataType::kFP8_E4M3, rt::KVQuantization::kFP8_PER_TENSOR},
    {"fp8-token-head", rt::DataType::kFP8_E4M3, rt::KVQuantization::kFP8_PER_TOKEN_HEAD},
    {"nvfp4", rt::DataType::kUINT8, rt::KVQuantization::kNVFP4},
}};

KVFormat parseKVFormat(std::string_view flag, std::string_view text)
{
    std::string names;
    for (KVFormat const& format : kKV_FORMATS)
    {
        if (format.name == text)
        {
            return format;
        }
        names += fmt::format("{}{}", names.empty() ? "" : "|", format.name);
    }
    throw UsageError(fmt::format("{} expects one of {}, got \"{}\"", flag, names, text));
}

PlanOptions parseArguments(std::vector<std::string> const& args)
{
    PlanOptions options;
    for (size_t i = 0; i < args.size(); ++i)
    {
        std::string_view const arg = args[i];
        if (arg == "-h")
        {
            options.help = true;
            continue;
        }
        if (arg.size() < 3 || arg.compare(0, 2, "--") != 0)
        {
            throw UsageError(
                fmt::format("unexpected argument \"{}\"; kvcache-plan takes only --flags (see --help)", arg));
        }
        size_t const equals = arg.find('=');
        std::string_view const flag = arg.substr(0, equals);
        bool const hasAttached = equals != std::string_view::npos;
        std::string_view const attached = hasAttached ? arg.substr(equals + 1) : std::string_view{};
        auto const value = [&]() -> std::string_view
        {
            if (hasAttached)
            {
                return attached;
            }
            if (i + 1 >= args.size())
            {
                throw UsageError(fmt::format("{} needs a value (see --help)", flag));
            }
            return args[++i];
        };
        auto const noValue = [&]()
        {
            if (hasAttached)
            {
                throw UsageError(fmt::format("{} takes no value, got \"{}\"", flag, attached));
            }
        };

        if (flag == "--help")
        {
            noValue();
            options.help = true;
        }
        else if (flag == "--per-layer")
        {
            noValue();
            options.perLayer = true;
        }
        else if (flag == "--json")
        {
            noValue();
            options.json = true;
        }
        else if (CountFlag const* count = findCountFlag(flag))
        {
            count->set(options, parseCount(flag, value(), count->minimum, count->maximum));
        }
        else if (flag == "--dtype")
        {
            options.dataType = parseDataType(flag, value());
        }
        else if (flag == "--state-dtype")
        {
            std::string_view const text = value();
            rt::DataType const type = parseDataType(flag, text);
            if (type != rt::DataType::kFLOAT && type != rt::DataType::kBF16 && type != rt::DataType::kHALF)
            {
                throw UsageError(fmt::format("--state-dtype expects float32, bfloat16 or float16, got \"{}\"", text));
            }
            options.stateDataType = type;
        }
        else if (flag == "--kv-dtype")
        {
            options.kvFormat = parseKVFormat(flag, value());
        }
        else if (flag == "--budget")
        {
            options.budgetBytes = parseByteSize(flag, value());
        }
        else if (flag == "--layer-heads")
        {
            options.layerHeads = parseLayerHeads(flag, value());
        }
        else if (flag == "--config")
        {
            options.configPath = std::string(value());
            if (options.configPath.empty())
            {
                throw UsageError("--config expects a path to a config.json, got \"\"");
            }
        }
        else
        {
            throw UsageError(fmt::format("unknown flag \"{}\" (see --help)", flag));
        }
    }

    if (options.kvFormat && options.dataType)
    {
        throw UsageError(fmt::format("--kv-dtype {} and --dtype {} both choose the cache type; give one of them",
            options.kvFormat->name, rt::dataTypeName(*options.dataType)));
    }
    if (!options.configPath.empty() && !options.layerHeads.empty())
    {
        throw UsageError("--config and --layer-heads both describe the model; give one of them");
    }
    if (!options.configPath.empty() || !options.layerHeads.empty())
    {
        std::string_view const source = options.configPath.empty() ? "--layer-heads" : "--config";
        for (auto const& [flag, given] : {std::pair{"--layers", options.numLayers.has_value()},
                 std::pair{"--kv-heads", options.numKVHeads.has_value()},
                 std::pair{"--head-dim", options.headDim.has_value()}})
        {
            if (given)
            {
                throw UsageError(
                    fmt::format("{} describes a uniform model and cannot be combined with {}", flag, source));
            }
        }
    }
    return options;
}

std::string usageText()
{
    return fmt::format(R"(usage: kvcache-plan [options]

Prints the KV cache kvcache would allocate for a model: each layer's slot view and pool view shapes, bytes per
layer and in total, its page groups (sliding-window layers keep only the pages their window reaches), and what fits
a memory budget. Uses only the layout maths; needs no GPU.

model (default: a built-in Llama-3.1-8B-like model, 32 layers of 8 KV heads x 128, float16):
  --config PATH        read a Hugging Face config.json (fields below)
  --layer-heads LIST   one HxD entry per attention layer, e.g. 8x128,8x128,2x64 (full attention)
  --layers N           uniform model: N attention layers (default 32, at most {})
  --kv-heads H         uniform model: KV heads per layer (default 8)
  --head-dim D         uniform model: head dimension (default 128)

cache:
  --batch N            maximum batch size (default {})
  --seq-len N          maximum sequence length in tokens (default {})
  --step-tokens N      the most tokens a sequence appends in one step (a prefill chunk); it bounds what a
                       sliding-window layer keeps: min(ceil(S/P), ceil((W-1+N)/P)+1) pages a sequence.
                       0 (default) means a whole prompt at once, so windowed layers keep full-length caches;
                       the plan then says what --step-tokens {} would save
  --dtype NAME         float32|float16|bfloat16|fp8_e4m3|fp8_e5m2|int8|uint8
                       (default: the config's torch_dtype or dtype, else float16)
  --kv-dtype NAME      fp16|bf16|fp8|fp8-token-head|nvfp4, a cache format instead of --dtype: fp8 is
                       E4M3 with a K and a V scale a layer (on the host, no page bytes); fp8-token-head
                       adds a float32 scale a token and head (D + 4 bytes a token, head and half);
                       nvfp4 stores E2M1 pairs in uint8 and an E4M3 scale a 16 values (D/2 + D/16)
  --state-dtype NAME   float32|bfloat16|float16: the recurrent and SSM states of state layers (Mamba,
                       gated delta net, KDA; default float32); their conv windows take the model's dtype
                       (the config's torch_dtype or dtype, else float16)
  --page-size N        tokens per page, a power of two up to {} (default {})
  --pages N            pages per layer half; 0 means the minimum, batch x pages per sequence (default 0);
                       only for a model with one page group (no sliding windows, or all the same window)
  --budget SIZE        memory for the cache, e.g. 40GiB, 512MiB, 1.5TiB, 80GB or a byte count;
                       units B, KiB, MiB, GiB, TiB (powers of 1024) and KB, MB, GB, TB (powers of 1000).
                       With several page groups the budget is split so that every group holds the same
                       number of full-length sequences; the plan shows that number and each group's pages
  --tp N               tensor parallelism over N GPUs: plan one GPU's shard. A layer's KV heads are split
                       evenly (H divisible by N), or replicated when there are fewer than N (N divisible
                       by H: each head on N/H GPUs); latent layers are whole on every GPU. Every figure,
                       --pages and --budget included, is then per GPU; the plan adds the heads each GPU
                       holds and all GPUs' bytes together. State layers are split as serving engines
                       shard them: gated delta net by key and value heads, Mamba2 by heads and groups (one
                       group is copied to every GPU), Mamba by d_inner, short conv by hidden_size, KDA by
                       heads; a --tp that does not divide one of these is refused

output:
  --per-layer          one table row per layer instead of one per set of identical layers
  --json               print the plan as one JSON object: tokensPerPage, maxBatchSize, maxSequenceLength,
                       maxTokensPerStep (the effective one: --seq-len when --step-tokens is 0), dtype,
                       quantization (none, fp8_per_tensor, fp8_per_token_head or nvfp4), totalBytes,
                       scaleBytes (the scale pools' part of totalBytes), groups [{{index, slidingWindow,
                       pagesPerSequence, numPages, layers}}], layers [{{index, kind (kv or latent),
                       numKVHeads, headDim, slidingWindow, group, slotTokens, numPages, bytes (data),
                       scaleBytes, bytesPerTokenHeadHalf}}], and budget {{bytes, sequences,
                       numPagesPerGroup, cacheBytes}} when --budget is given; with --tp, the plan of GPU 0's
                       shard plus tp {{size, rank, totalBytesAllRanks, layers [{{index, firstHead, numKVHeads,
                       replicas}}]}}: the heads GPU 0 holds, each also held by replicas - 1 other GPUs
                       (and tp.stateBytesAllRanks with state layers; every state figure is GPU 0's shard).
                       A model with state layers adds stateBytes to each layer (0: attention layers keep
                       no state), stateBytesPerSequence, stateSlots, stateBytes (all slots), and
                       stateLayers [{{index, modelLayer, kind, tensors [{{name, shape, dtype,
                       bytesPerSequence}}], stateBytes}}]; budget.cacheBytes then includes the state
  -h, --help           print this help

Flags take their value as "--flag value" or "--flag=value".

config.json: only these fields are read, from "text_config" when present, else from the top level:
  num_hidden_layers       number of decoder layers (num_transformer_layers in OpenELM configs),
                          at most {}
  num_kv_heads            KV heads, one per layer (a list) or for all layers;
                          else num_key_value_heads, else num_attention_heads
  head_dim                else hidden_size / num_attention_heads
  kv_lora_rank and        multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): one latent of
    qk_rope_head_dim      kv_lora_rank + qk_rope_head_dim values per token and layer, K only (no V);
                          one without the other is an error
  layer_types             one kind per layer: full_attention and attention (full cache),
                          sliding_attention (window sliding_window), chunked_attention (chunks of
                          attention_chunk_size, planned as a window of that size: an upper bound);
                          linear_attention, mamba, mamba2, conv and recurrent keep no KV cache;
                          any other kind is an error
  attn_layer_period       with attn_layer_offset: layer i gets a cache when i % period == offset
  without layer_types, how the attention layers attend, first rule that applies:
  sliding_window_pattern  N: every Nth layer (N-1, 2N-1, ...) is full, the others slide (Gemma-3,
                          Cohere2; also _sliding_window_pattern; the defaults 6 and 4 when a gemma3
                          or cohere2 config leaves it out)
  model_type gemma2       Gemma-2: even layers slide, odd layers are full
  attention_chunk_size    Llama-4: no_rope_layers 1 = chunked, 0 = full; empty: every 4th layer full
  use_sliding_window      true: layers from max_window_layers on slide, the ones before are full
  sliding_window          alone: every layer slides (Mistral-7B-v0.1); null or absent: full attention
  and in every case:
  use_sliding_window      false: no layer slides, whatever sliding_window and layer_types say (Qwen2)
  num_kv_shared_layers    N: the last N layers reuse earlier layers' KV and keep no cache (Gemma-3n,
                          whose configs must give it)
  cross_attention_layers  layers that attend to image tokens, not planned as token caches
                          (Llama-3.2-Vision, whose configs must give it)
  torch_dtype or dtype    bfloat16, float16 or float32: the cache dtype unless --dtype is given
  full_attention_interval N: layers N-1, 2N-1, ... attend (Qwen3-Next, Qwen3.5)
  attn_layer_indices      0-indexed attention layers (Bamba)
  full_attn_idxs          0-indexed attention layers (LFM2)
  linear_attn_config      full_attn_layers and kda_layers, 1-indexed (Kimi Linear)
  hybrid_override_pattern one block a layer, * attends, M is Mamba2 (model_type nemotron_h)
  hybrid_override_pattern (another model_type), layers_block_type, block_types or attn_type_list
  without layer_types is an error: the planner does not read them.
  state per sequence, by model_type (vLLM's shapes; recurrent and SSM states in --state-dtype):
  qwen3_next, qwen3_5,    gated delta net: conv [2*Hk*Dk + Hv*Dv, K-1], recurrent [Hv, Dk, Dv] from
    qwen3_5_moe           linear_num_key_heads, linear_key_head_dim, linear_num_value_heads,
                          linear_value_head_dim, linear_conv_kernel_dim
  nemotron_h              Mamba2 in M layers: conv [H*P + 2*G*N, K-1], SSM [H, P, N] from
                          mamba_num_heads, mamba_head_dim, n_groups, ssm_state_size, conv_kernel
  bamba, granitemoehybrid Mamba2 in layers without attention, falcon_h1 in every layer: mamba_n_heads,
    falcon_h1             mamba_d_head, mamba_n_groups, mamba_d_state, mamba_d_conv, and
                          mamba_expand * hidden_size (or mamba_d_ssm) = mamba_n_heads * mamba_d_head
  jamba                   Mamba: conv [E*hidden_size, K-1], SSM [E*hidden_size, N] from mamba_expand,
                          mamba_d_conv, mamba_d_state
  lfm2                    short convolution: conv [hidden_size, conv_L_cache - 1]
  kimi_linear             KDA: q, k, v convs [H*D, K-1] each, recurrent [H, D, D] from
                          linear_attn_config num_heads, head_dim, short_conv_kernel_size
  by model_type, with the field names and defaults of transformers' config class:
  gpt2                    n_layer, n_head and n_embd for num_hidden_layers, num_attention_heads and
                          hidden_size; one KV head per attention head
  falcon                  n_layer, n_head, n_head_kv and n_embed as other names; KV heads: num_kv_heads
                          (default num_attention_heads) with new_decoder_architecture (default false),
                          else 1 with multi_query (default true), else num_attention_heads; head_dim is
                          hidden_size / num_attention_heads
  gemma3, gemma3_text     fields left out: head_dim 256, num_key_value_heads 4, num_attention_heads 8,
                          num_hidden_layers 26, sliding_window 4096 (Gemma3TextConfig's defaults)

A config.json larger than {} bytes or nesting deeper than {} levels is an error.

Exit status: 0 on success; 2 for a bad flag, a config.json that cannot be read, lacks a field or describes
layers the planner cannot size (the message names the field), or an invalid cache config.
)",
        kMAX_MODEL_LAYERS, kDEFAULT_BATCH_SIZE, kDEFAULT_SEQUENCE_LENGTH, kSUGGESTED_STEP_TOKENS,
        rt::kMAX_TOKENS_PER_PAGE, rt::kTOKENS_PER_PAGE, kMAX_MODEL_LAYERS, kMAX_CONFIG_FILE_BYTES, kMAX_CONFIG_NESTING);
}

} // namespace kvcache::plan
