#pragma once

#include "model_config.h"
#include "plan_options.h"

#include "kvcache/core/kv_cache_config.h"
#include "kvcache/core/kv_cache_layout.h"
#include "kvcache/dist/tensor_parallel.h"

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace kvcache::plan
{

//! Exit status for a bad flag, config file or cache config.
inline constexpr int kEXIT_BAD_INPUT = 2;

//! What a plan with full-length windowed caches (--step-tokens 0) would take with a bounded step.
struct StepSuggestion
{
    int32_t stepTokens = {};   //!< kSUGGESTED_STEP_TOKENS, or the sequence length when that is shorter
    int64_t cacheBytes = {};   //!< the minimum cache with that step
    int64_t currentBytes = {}; //!< the minimum cache with --step-tokens 0
};

//! A validated plan: the model, the config kvcache would be given, its layout and what fits the budget.
struct Plan
{
    ModelDescription model = {};
    rt::KVCacheConfig config = {};
    rt::KVCacheLayout layout = {};
    //! The same plan with full-length caches in every layer (maxTokensPerStep 0, and --pages unless that is below its
    //! minimum): what the windows save against.
    int64_t fullLengthBytes = 0;
    //! Set when --step-tokens is 0 and some layer has a window: what --step-tokens kSUGGESTED_STEP_TOKENS would plan.
    std::optional<StepSuggestion> stepSuggestion = {};
    std::optional<int64_t> budgetBytes = {};         //!< --budget, when given
    int64_t budgetPages = 0;                         //!< one page group: numPages that fit budgetBytes; else 0
    std::optional<rt::BudgetSplit> budgetSplit = {}; //!< several page groups: rt::splitBudget of budgetBytes
    //! Set by --tp: GPU 0's shard, whose config `config` is (model.layers keeps the whole model's heads).
    std::optional<rt::TensorParallelShard> shard = {};
};

//! Returns the model `options` describe: --config, --layer-heads, the uniform flags, or the built-in model.
//! Throws ModelConfigError for a bad config.json.
ModelDescription resolveModel(PlanOptions const& options);

//! Returns the cache dtype: --dtype, else the model's torch_dtype (bfloat16, float16, float32), else float16.
//! Throws ModelConfigError when the model names another dtype and --dtype is not given.
rt::DataType resolveDataType(ModelDescription const& model, PlanOptions const& options);

//! Returns the dtype of state layers' conv windows: the model's torch_dtype when it is bfloat16, float16 or float32,
//! else --dtype when it is one of those, else float16.
rt::DataType resolveConvDataType(ModelDescription const& model, PlanOptions const& options);

//! Returns the state layers of `model` as kvcache is given them: recurrent and SSM tensors in --state-dtype, conv
//! windows in resolveConvDataType.
std::vector<rt::StateLayerConfig> stateLayerConfigs(ModelDescription const& model, PlanOptions const& options);

//! Builds the plan from the library's layout maths, of GPU 0's shard when --tp is given; throws
//! rt::InvalidConfigError for a config kvcache rejects, rt::InvalidArgumentError for heads --tp cannot split, and
//! UsageError for --pages with several page groups, --step-tokens above --seq-len or a --tp that does not divide a
//! state layer's heads or channels.
Plan makePlan(ModelDescription model, PlanOptions const& options);

//! Returns the plan as text for a terminal: title, how the config was read, page groups, layer table (identical layers
//! share a row unless `perLayer`), totals, the saving of the windows and the budget.
std::string formatPlan(Plan const& plan, bool perLayer);

//! Returns the plan as one JSON object on one line (see --help for its fields), with a final newline.
std::string formatPlanJson(Plan const& plan);

//! Returns `bytes` with thousands separators, e.g. "8,589,934,592".
std::string formatBytes(int64_t bytes);

//! Returns `bytes` in the largest binary unit it reaches, with two decimals, e.g. "8.00 GiB".
std::string formatSize(int64_t bytes);

//! Runs the program on `args` (without the program name), writing the plan or help to `out` and errors to `err`.
//! Returns 0, or kEXIT_BAD_INPUT for a bad flag, config file or cache config.
int runPlanProgram(std::vector<std::string> const& args, std::ostream& out, std::ostream& err);

} // namespace kvcache::plan
