#pragma once

// The host tier tests' model of a cache's state slots, written from the formulas (docs/layout.md, "Host states"): a
// state slot packed state layer by state layer, each layer's tensors in config order, back to back, each tensor's slot
// the product of its shape times its element size, worked out by hand. Beside it, the device's state slots, filled
// with the model's bytes and read back through the public state views.

#include "kvcache/core/data_type.h"
#include "kvcache/core/kv_cache_config.h"
#include "kvcache/memory/kv_cache_manager.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "support/cuda_raii.h"
#include "support/layout_model.h"

namespace kvcache::test
{

//! Returns the size of one element of a state tensor of `type`: a KV cache type's by hand (layout_model.h), or the
//! integer types state tensors may also hold.
inline int64_t stateElementBytesByHand(rt::DataType type)
{
    if (type == rt::DataType::kINT64)
    {
        return 8;
    }
    return type == rt::DataType::kINT32 ? 4 : elementBytesByHand(type);
}

//! A cache's state slots: the model's packed bytes of every slot, and the device slots they were written to.
class HostStateReference
{
public:
    //! Models `config`'s state slots (maxBatchSize + numCheckpointSlots of them), gives every slot random non-zero
    //! bytes and writes them to `cache`'s state tensors on `stream`.
    HostStateReference(
        rt::KVCacheConfig const& config, rt::KVCacheManager const& cache, cudaStream_t stream, uint64_t seed)
        : mCache(cache)
        , mStream(stream)
        , mNumSlots(config.maxBatchSize + config.numCheckpointSlots)
    {
        for (size_t layer = 0; layer < config.stateLayerConfigs.size(); ++layer)
        {
            std::vector<rt::StateTensorConfig> const& tensors = config.stateLayerConfigs[layer].tensors;
            for (size_t tensor = 0; tensor < tensors.size(); ++tensor)
            {
                int64_t bytes = stateElementBytesByHand(tensors[tensor].dataType);
                for (int64_t const extent : tensors[tensor].shape)
                {
                    bytes *= extent;
                }
                mTensors.push_back({static_cast<int32_t>(layer), static_cast<int32_t>(tensor), bytes});
                mSlotBytes += bytes;
            }
        }
        std::mt19937_64 rng(seed);
        for (int32_t slot = 0; slot < mNumSlots; ++slot)
        {
            std::vector<uint8_t> packed(static_cast<size_t>(mSlotBytes));
            for (uint8_t& byte : packed)
            {
                byte = static_cast<uint8_t>(1 + rng() % 255);
            }
            write(slot, packed);
        }
    }

    //! Returns the bytes of one packed slot: the sum of every state tensor's slot.
    int64_t slotBytes() const noexcept
    {
        return mSlotBytes;
    }
    //! Returns the state slots.
    int32_t numSlots() const noexcept
    {
        return mNumSlots;
    }
    //! Returns the model's packed bytes of `slot`.
    std::vector<uint8_t> const& slot(int32_t slot) const
    {
        return mSlots.at(static_cast<size_t>(slot));
    }
    //! Writes `packed` to `slot` on the device and in the model.
    void write(int32_t slot, std::vector<uint8_t> const& packed)
    {
        int64_t offset = 0;
        for (Tensor const& tensor : mTensors)
        {
            uploadBytes(address(tensor, slot),
                std::vector<uint8_t>(packed.begin() + offset, packed.begin() + offset + tensor.slotBytes), mStream);
            offset += tensor.slotBytes;
        }
        if (mSlots.size() <= static_cast<size_t>(slot))
        {
            mSlots.resize(static_cast<size_t>(slot) + 1);
        }
        mSlots[static_cast<size_t>(slot)] = packed;
    }
    //! Sets every byte of `slot` to `byte` on the device and in the model.
    void poison(int32_t slot, uint8_t byte)
    {
        write(slot, std::vector<uint8_t>(static_cast<size_t>(mSlotBytes), byte));
    }
    //! Records in the model that `slot` now holds `packed` (what an onboard wrote), leaving the device as it is.
    void expect(int32_t slot, std::vector<uint8_t> const& packed)
    {
        mSlots.at(static_cast<size_t>(slot)) = packed;
    }
    //! Returns the device bytes of `slot`, packed in the model's order, after the work queued on the stream.
    std::vector<uint8_t> deviceSlot(int32_t slot) const
    {
        std::vector<uint8_t> packed;
        for (Tensor const& tensor : mTensors)
        {
            std::vector<uint8_t> const part = downloadBytes(address(tensor, slot), tensor.slotBytes, mStream);
            packed.insert(packed.end(), part.begin(), part.end());
        }
        return packed;
    }
    //! Compares every device slot with the model.
    ::testing::AssertionResult matchesReference() const
    {
        for (int32_t slot = 0; slot < mNumSlots; ++slot)
        {
            if (deviceSlot(slot) != this->slot(slot))
            {
                return ::testing::AssertionFailure() << "state slot " << slot << " differs from the model";
            }
        }
        return ::testing::AssertionSuccess();
    }

private:
    //! One state tensor: its state layer, its index in the layer and its bytes a slot.
    struct Tensor
    {
        int32_t layer;
        int32_t tensor;
        int64_t slotBytes;
    };

    //! Slot `slot` of `tensor`, through the public view: index `slot` of its first dimension.
    void* address(Tensor const& tensor, int32_t slot) const
    {
        return static_cast<char*>(mCache.stateView(tensor.layer, tensor.tensor).rawPointer())
            + int64_t{slot} * tensor.slotBytes;
    }

    rt::KVCacheManager const& mCache;
    cudaStream_t mStream;
    int32_t mNumSlots;
    int64_t mSlotBytes = 0;
    std::vector<Tensor> mTensors;
    std::vector<std::vector<uint8_t>> mSlots;
};

} // namespace kvcache::test
