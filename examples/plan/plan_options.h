#pragma once

#include "kvcache/core/data_type.h"
#include "kvcache/core/kv_cache_config.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache::plan
{

//! Thrown for a bad command-line flag or value; the message names the flag and the value.
class UsageError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

//! Default maximum batch size of a plan.
inline constexpr int32_t kDEFAULT_BATCH_SIZE = 8;
//! Default maximum sequence length of a plan, in tokens.
inline constexpr int32_t kDEFAULT_SEQUENCE_LENGTH = 8192;
//! The --step-tokens a plan with full-length windowed caches (--step-tokens 0) shows the saving of.
inline constexpr int32_t kSUGGESTED_STEP_TOKENS = 2048;

//! A cache format of --kv-dtype: the storage type and quantization kvcache is given.
struct KVFormat
{
    std::string_view name;           //!< as the flag spells it: fp16, bf16, fp8, fp8-token-head, nvfp4
    rt::DataType storage;            //!< KVCacheConfig::kvCacheType
    rt::KVQuantization quantization; //!< KVCacheConfig::quantization
};

//! What the command line asks for; unset optionals fall back to the model's or the built-in defaults.
struct PlanOptions
{
    int32_t maxBatchSize = kDEFAULT_BATCH_SIZE;           //!< --batch
    int32_t maxSequenceLength = kDEFAULT_SEQUENCE_LENGTH; //!< --seq-len
    std::optional<rt::DataType> dataType = {};            //!< --dtype; unset means the config's dtype, else float16
    std::optional<KVFormat> kvFormat = {};                //!< --kv-dtype (never together with --dtype)
    rt::DataType stateDataType = rt::DataType::kFLOAT;    //!< --state-dtype: recurrent and SSM states
    int32_t tokensPerPage = rt::kTOKENS_PER_PAGE;         //!< --page-size
    int32_t numPages = 0;                                 //!< --pages; 0 means the minimum
    int32_t maxTokensPerStep = 0;                         //!< --step-tokens; 0 means a whole sequence in one step
    std::optional<int64_t> budgetBytes = {};              //!< --budget
    std::optional<int32_t> tp = {};                       //!< --tp: plan one GPU's shard of that many; unset: no split
    std::optional<int32_t> numLayers = {};                //!< --layers (uniform model)
    std::optional<int32_t> numKVHeads = {};               //!< --kv-heads (uniform model)
    std::optional<int32_t> headDim = {};                  //!< --head-dim (uniform model)
    std::vector<rt::KVLayerConfig> layerHeads = {};       //!< --layer-heads; empty when not given
    std::string configPath = {};                          //!< --config; empty when not given
    bool perLayer = false;                                //!< --per-layer
    bool json = false;                                    //!< --json
    bool help = false;                                    //!< --help
};

//! Parses the arguments after the program name; throws UsageError naming the flag and value of the first bad one.
PlanOptions parseArguments(std::vector<std::string> const& args);

//! Parses a byte count with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; case-insensitive; a decimal
//! fraction is allowed and rounds down to whole bytes); throws UsageError naming `flag` and `text` when it is not one.
int64_t parseByteSize(std::string_view flag, std::string_view text);

//! Parses a comma-separated list of HxD entries ("8x128,2x64"); throws UsageError naming `flag` and the bad entry.
std::vector<rt::KVLayerConfig> parseLayerHeads(std::string_view flag, std::string_view text);

//! Parses the name of a KV cache data type ("float16", "fp8_e4m3", ...); throws UsageError naming `flag` and `text`.
rt::DataType parseDataType(std::string_view flag, std::string_view text);

//! Parses a --kv-dtype name (fp16, bf16, fp8, fp8-token-head, nvfp4); throws UsageError naming `flag` and `text`.
KVFormat parseKVFormat(std::string_view flag, std::string_view text);

//! Returns the --help text.
std::string usageText();

} // namespace kvcache::plan
