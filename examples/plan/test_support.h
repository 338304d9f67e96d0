#pragma once

// What the kvcache-plan tests share: fixture paths, the figures of a model or plan as one comparable list, running the
// parser and the program, and catching their errors.

#include "model_config.h"
#include "plan.h"
#include "plan_options.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::plan::test_support
{

//! Returns the path of a model fixture in models/.
inline std::string modelPath(std::string const& file)
{
    return std::string(KVCACHE_PLAN_MODELS_DIR) + "/" + file;
}

//! Head shapes as (H, D) pairs, so a whole model compares in one assertion.
inline std::vector<std::pair<int32_t, int32_t>> headShapes(ModelDescription const& model)
{
    std::vector<std::pair<int32_t, int32_t>> shapes;
    for (rt::KVLayerConfig const& layer : model.layers)
    {
        shapes.emplace_back(layer.numKVHeads, layer.headDim);
    }
    return shapes;
}

//! The head shapes of `count` layers of `heads` x `headDim`, as headShapes gives them.
inline std::vector<std::pair<int32_t, int32_t>> uniformHeads(size_t count, int32_t heads, int32_t headDim)
{
    return std::vector<std::pair<int32_t, int32_t>>(count, {heads, headDim});
}

//! The sliding window of each cache layer (0 for full attention).
inline std::vector<int32_t> windows(ModelDescription const& model)
{
    std::vector<int32_t> values;
    for (rt::KVLayerConfig const& layer : model.layers)
    {
        values.push_back(layer.slidingWindow);
    }
    return values;
}

//! `count` entries alternating `even`, `odd`, starting with `even`.
template <typename T>
inline std::vector<T> alternating(size_t count, T even, T odd)
{
    std::vector<T> values;
    for (size_t i = 0; i < count; ++i)
    {
        values.push_back(i % 2 == 0 ? even : odd);
    }
    return values;
}

//! pagesPerSequence and numPages of each page group, as pairs.
inline std::vector<std::pair<int32_t, int32_t>> groupPages(Plan const& plan)
{
    std::vector<std::pair<int32_t, int32_t>> pages;
    for (rt::KVPageGroupLayout const& group : plan.layout.groups)
    {
        pages.emplace_back(group.pagesPerSequence, group.numPages);
    }
    return pages;
}

//! The sliding window of each page group (0 for full attention).
inline std::vector<int32_t> groupWindows(Plan const& plan)
{
    std::vector<int32_t> values;
    for (rt::KVPageGroupLayout const& group : plan.layout.groups)
    {
        values.push_back(group.slidingWindow);
    }
    return values;
}

//! The bytes of each cache layer's buffer.
inline std::vector<int64_t> layerBytes(Plan const& plan)
{
    std::vector<int64_t> bytes;
    for (rt::KVLayerLayout const& layer : plan.layout.layers)
    {
        bytes.push_back(layer.layerBytes);
    }
    return bytes;
}

//! Parses `args` and plans the model they describe.
inline Plan planFor(std::vector<std::string> const& args)
{
    PlanOptions const options = parseArguments(args);
    return makePlan(resolveModel(options), options);
}

//! What runPlanProgram returned and wrote.
struct ProgramResult
{
    int status;
    std::string out;
    std::string err;
};

//! Runs the program on `args` and returns its exit status and output.
inline ProgramResult runProgram(std::vector<std::string> const& args)
{
    std::ostringstream out;
    std::ostringstream err;
    int const status = runPlanProgram(args, out, err);
    return {status, out.str(), err.str()};
}

//! Returns the message of the UsageError that parsing `args` throws, or fails the test.
inline std::string usageErrorOf(std::vector<std::string> const& args)
{
    try
    {
        parseArguments(args);
    }
    catch (UsageError const& error)
    {
        return error.what();
    }
    ADD_FAILURE() << "no UsageError for the arguments";
    return {};
}

//! Writes `text` to a file of that name in the test's temporary folder and returns its path.
inline std::string writeTempFile(std::string const& name, std::string const& text)
{
    std::string const path = ::testing::TempDir() + name;
    std::ofstream(path) << text;
    return path;
}

//! The fixtures at batch 8, 8192 tokens, 128 tokens per page and 2048 tokens a step.
inline Plan steppedPlan(std::string const& fixture)
{
    return planFor({"--config", modelPath(fixture), "--batch", "8", "--seq-len", "8192", "--page-size", "128",
        "--step-tokens", "2048"});
}

//! Returns the message of the ModelConfigError that parsing `json` throws, or fails the test.
inline std::string configErrorOf(std::string const& json)
{
    try
    {
        parseHuggingFaceConfig(json, "inline.json");
    }
    catch (ModelConfigError const& error)
    {
        return error.what();
    }
    ADD_FAILURE() << "no ModelConfigError for " << json;
    return {};
}

//! Succeeds when the model has notes and the first mentions `text`; the message shows the note otherwise.
inline ::testing::AssertionResult firstNoteMentions(ModelDescription const& model, std::string const& text)
{
    if (model.notes.empty())
    {
        return ::testing::AssertionFailure() << "the model has no notes";
    }
    if (model.notes.front().find(text) == std::string::npos)
    {
        return ::testing::AssertionFailure() << model.notes.front();
    }
    return ::testing::AssertionSuccess();
}

} // namespace kvcache::plan::test_support
