// What a sequence file records of a state slot: its state tensor records, written and read, checked and compared.

#include "tiers/sequence_file/sequence_file_states.h"

#include "core/layout/page_anatomy.h"
#include "tiers/sequence_file/sequence_file_format.h"

#include "kvcache/core/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <string>
#include <utility>

namespace kvcache::rt::detail
{
namespace
{

//! Where a state tensor record keeps its extents.
constexpr int64_t kSTATE_SHAPE_AT = 24;
static_assert(kSTATE_SHAPE_AT + kMAX_STATE_DIMS * 8 == kSEQUENCE_STATE_RECORD_BYTES, "a record's extents end it");

} // namespace

void encodeStateTensors(std::vector<SequenceStateTensor> const& tensors, int64_t at, std::vector<char>& header)
{
    for (SequenceStateTensor const& tensor : tensors)
    {
        writeAt<int32_t>(header, at, tensor.stateLayer);
        writeAt<int32_t>(header, at + 4, tensor.tensor);
        writeAt<int32_t>(header, at + 8, static_cast<int32_t>(tensor.dataType));
        writeAt<int32_t>(header, at + 12, static_cast<int32_t>(tensor.shape.size()));
        writeAt<int64_t>(header, at + 16, tensor.slotBytes);
        for (size_t d = 0; d < tensor.shape.size(); ++d)
        {
            writeAt<int64_t>(header, at + kSTATE_SHAPE_AT + static_cast<int64_t>(d) * 8, tensor.shape[d]);
        }
        at += kSEQUENCE_STATE_RECORD_BYTES;
    }
}

std::vector<SequenceStateTensor> decodeStateTensors(
    std::string const& prefix, std::vector<char> const& header, int64_t statesAt, int32_t count)
{
    std::vector<SequenceStateTensor> tensors;
    for (int32_t i = 0; i < count; ++i)
    {
        int64_t const at = statesAt + int64_t{i} * kSEQUENCE_STATE_RECORD_BYTES;
        SequenceStateTensor tensor;
        tensor.stateLayer = readAt<int32_t>(header, at);
        tensor.tensor = readAt<int32_t>(header, at + 4);
        tensor.dataType = static_cast<DataType>(readAt<int32_t>(header, at + 8));
        auto const dims = readAt<int32_t>(header, at + 12);
        tensor.slotBytes = readAt<int64_t>(header, at + 16);
        if (dims < 1 || dims > kMAX_STATE_DIMS)
        {
            throw InvalidArgumentError(fmt::format(
                "{}stateTensors[{}] has {} dimensions; it must have 1 to {}", prefix, i, dims, kMAX_STATE_DIMS));
        }
        for (int32_t d = 0; d < kMAX_STATE_DIMS; ++d)
        {
            auto const extent = readAt<int64_t>(header, at + kSTATE_SHAPE_AT + int64_t{d} * 8);
            if (d < dims)
            {
                tensor.shape.push_back(extent);
            }
            else if (extent != 0)
            {
                throw InvalidArgumentError(fmt::format("{}stateTensors[{}] extent {} (past its {} dimensions) is {}; "
                                                       "it must be 0 (corrupt header)",
                    prefix, i, d, dims, extent));
            }
        }
        tensors.push_back(std::move(tensor));
    }
    return tensors;
}

int64_t checkStateTensors(std::string const& prefix, char const* field, std::vector<SequenceStateTensor> const& tensors)
{
    if (tensors.size() > static_cast<size_t>(kMAX_FILE_STATE_TENSORS))
    {
        throw InvalidArgumentError(fmt::format(
            "{}{} has {} entries; the limit is {}", prefix, field, tensors.size(), kMAX_FILE_STATE_TENSORS));
    }
    int64_t total = 0;
    for (size_t i = 0; i < tensors.size(); ++i)
    {
        SequenceStateTensor const& tensor = tensors[i];
        // The packed order: each tensor the next of its layer, or the first of the next layer.
        bool inOrder = tensor.stateLayer == 0 && tensor.tensor == 0;
        if (i > 0)
        {
            SequenceStateTensor const& before = tensors[i - 1];
            inOrder = (tensor.stateLayer == before.stateLayer && tensor.tensor == before.tensor + 1)
                || (tensor.stateLayer == before.stateLayer + 1 && tensor.tensor == 0);
        }
        if (!inOrder)
        {
            throw InvalidArgumentError(fmt::format("{}{}[{}] is state layer {} tensor {}; a state slot's tensors go "
                                                   "layer by layer from state layer 0 tensor 0, each layer's in order",
                prefix, field, i, tensor.stateLayer, tensor.tensor));
        }
        int64_t const elementBytes = dataTypeSize(tensor.dataType);
        if (elementBytes == 0)
        {
            throw InvalidArgumentError(fmt::format("{}{}[{}].dataType is {}, which is not a DataType value", prefix,
                field, i, static_cast<int32_t>(tensor.dataType)));
        }
        if (tensor.shape.empty() || tensor.shape.size() > static_cast<size_t>(kMAX_STATE_DIMS))
        {
            throw InvalidArgumentError(fmt::format("{}{}[{}].shape has {} dimensions; it must have 1 to {}", prefix,
                field, i, tensor.shape.size(), kMAX_STATE_DIMS));
        }
        int64_t bytes = elementBytes;
        bool overflow = false;
        for (size_t d = 0; d < tensor.shape.size(); ++d)
        {
            if (tensor.shape[d] <= 0)
            {
                throw InvalidArgumentError(
                    fmt::format("{}{}[{}].shape[{}] is {}; it must be > 0", prefix, field, i, d, tensor.shape[d]));
            }
            overflow = overflow || __builtin_mul_overflow(bytes, tensor.shape[d], &bytes);
        }
        if (overflow || bytes != tensor.slotBytes)
        {
            throw InvalidArgumentError(fmt::format("{}{}[{}].slotBytes is {}; its shape of {}-byte elements makes {}",
                prefix, field, i, tensor.slotBytes, elementBytes,
                overflow ? std::string("more than 64-bit sizes hold") : std::to_string(bytes)));
        }
        if (__builtin_add_overflow(total, tensor.slotBytes, &total))
        {
            throw InvalidArgumentError(fmt::format("{}{}[{}].slotBytes is {}; the state's bytes overflow 64 bits "
                                                   "(limit {})",
                prefix, field, i, tensor.slotBytes, std::numeric_limits<int64_t>::max()));
        }
    }
    return total;
}

void expectStateTensors(char const* what, std::string const& path, std::vector<SequenceStateTensor> const& file,
    std::vector<SequenceStateTensor> const& expected)
{
    if (file.empty())
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' holds no state (stateTensors is empty); the destination "
                                               "expects {} state tensors",
            what, path, expected.size()));
    }
    if (file.size() != expected.size())
    {
        throw InvalidArgumentError(fmt::format("{}: '{}' has another state: stateTensors has {} entries in the file "
                                               "and {} in the destination",
            what, path, file.size(), expected.size()));
    }
    for (size_t i = 0; i < file.size(); ++i)
    {
        SequenceStateTensor const& mine = file[i];
        SequenceStateTensor const& theirs = expected[i];
        std::string difference;
        if (mine.stateLayer != theirs.stateLayer || mine.tensor != theirs.tensor)
        {
            difference = fmt::format("is state layer {} tensor {} in the file and state layer {} tensor {} in the "
                                     "destination",
                mine.stateLayer, mine.tensor, theirs.stateLayer, theirs.tensor);
        }
        else if (mine.dataType != theirs.dataType)
        {
            difference = fmt::format(".dataType is {} in the file and {} in the destination",
                dataTypeName(mine.dataType), dataTypeName(theirs.dataType));
        }
        else if (mine.shape != theirs.shape)
        {
            difference = fmt::format(".shape is [{}] in the file and [{}] in the destination",
                fmt::join(mine.shape, ", "), fmt::join(theirs.shape, ", "));
        }
        if (!difference.empty())
        {
            throw InvalidArgumentError(
                fmt::format("{}: '{}' has another state: stateTensors[{}]{}", what, path, i, difference));
        }
    }
}

} // namespace kvcache::rt::detail

namespace kvcache::rt
{

std::vector<SequenceStateTensor> sequenceStateTensors(KVCacheLayout const& layout)
{
    // The packed order is the state slot anatomy's.
    std::vector<SequenceStateTensor> tensors;
    for (detail::StateSlotEntry const& entry : detail::stateSlotAnatomy(layout).entries)
    {
        StateTensorLayout const& tensor =
            layout.stateLayers[static_cast<size_t>(entry.stateLayer)].tensors[static_cast<size_t>(entry.tensor)];
        tensors.push_back(
            SequenceStateTensor{entry.stateLayer, entry.tensor, tensor.dataType, tensor.shape, entry.bytes});
    }
    return tensors;
}

} // namespace kvcache::rt
